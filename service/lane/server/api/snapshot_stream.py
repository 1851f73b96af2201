"""WatchLane's snapshot: a head message, then transcript chunks, in bounded memory.

The snapshot is captured without its transcript's bodies (``Store.snapshot_outline``: the live
state and the transcript's entry ids with their sizes, in one REPEATABLE READ transaction).
Entries never change once written, so each message's entries are read only when that message is
about to be sent, and framed from their stored bytes (framing.py): a watcher holds one
message's worth of the transcript at a time, however long the transcript is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from lane.server.api.framing import snapshot_head_frame, transcript_chunk_frame
from lane.server.store import SnapshotOutline


def plan_messages(entry_sizes: Sequence[int], chunk_bytes: int) -> list[int]:
    """How many transcript entries each snapshot message carries: the head first, then the
    chunks, each holding entries of about ``chunk_bytes`` at most (a chunk at least one). A
    message over the message limit (a head whose live state is large) is sent in parts
    (message_parts.py)."""
    counts = [0]
    size = 0
    for entry_size in entry_sizes:
        if counts[-1] and size + entry_size > chunk_bytes:
            counts.append(0)
            size = 0
        counts[-1] += 1
        size += entry_size
    return counts


#: Reads encoded entries by id, in order (``Store.entry_bodies`` of one lane).
ReadEntries = Callable[[Sequence[str]], Awaitable[list[bytes]]]


async def snapshot_frames(
    outline: SnapshotOutline, read_entries: ReadEntries, chunk_bytes: int
) -> AsyncIterator[bytes]:
    """The encoded WatchLaneResponse messages of ``outline``'s snapshot, the entries of each
    read just before it is yielded."""
    ids = [entry_id for entry_id, _ in outline.transcript]
    sizes = [size for _, size in outline.transcript]
    counts = plan_messages(sizes, chunk_bytes)
    start = 0
    for index, count in enumerate(counts):
        bodies = await read_entries(ids[start : start + count]) if count else []
        start += count
        if index == 0:
            yield snapshot_head_frame(outline.snapshot, bodies, following_chunks=len(counts) - 1)
        else:
            yield transcript_chunk_frame(bodies)
