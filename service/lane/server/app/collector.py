"""The garbage collector tuned for a long-running server, once it has started.

CPython collects its youngest generation after every 700 net allocations of container objects
by default, a threshold made for short scripts. A server allocates a few hundred per command
(protobuf wrappers, dataclasses, coroutines, futures), nearly all of which die young by
reference counting; at 700 the collector runs every few commands, every tenth of those walks
the middle generation too, and a full collection walks everything the process holds: its
modules, the generated protobuf classes, the lanes it keeps, its watchers' subscriptions.
Two changes (measured in bench/README.md, "Garbage collection"):

- what is alive once the service serves (modules, classes, the pool, the servers) is frozen:
  moved out of the collector's generations for good, so no collection walks it again;
- the youngest generation is collected every :data:`GEN0_THRESHOLD` net allocations: a
  cycle still goes within a fraction of a second under load, and the memory that cycles hold
  meanwhile stays bounded by that count.
"""

from __future__ import annotations

import gc

#: Net container allocations between collections of the youngest generation (CPython: 700).
GEN0_THRESHOLD = 50_000


def tune_for_serving() -> None:
    """Collect what start-up left behind, freeze what survived, and raise the youngest
    generation's threshold (the older generations keep theirs). Call once, when the service
    serves: what it allocates later is collected as usual."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
