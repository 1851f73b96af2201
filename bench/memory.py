"""Resident memory of another process, read from /proc (Linux).

Used by :mod:`bench.idle_watchers` and :mod:`bench.snapshot_cost` to measure the service
process from the outside, so the measurement itself costs the service nothing.

- ``VmRSS`` (``/proc/PID/status``): resident pages, shared ones counted in full.
- ``Pss`` (``/proc/PID/smaps_rollup``): resident pages, each shared page divided among the
  processes mapping it. For one service process that shares only its libraries this is close
  to VmRSS, minus a few MiB of shared library pages.
- ``VmHWM``: the peak VmRSS. Writing ``5`` to ``/proc/PID/clear_refs`` resets it to the
  current VmRSS (Linux >= 4.0, needs the right to write there: the same user or root), so a
  peak over one interval can be read exactly, however short it was.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def rss_kib(pid: int) -> int:
    """The process's VmRSS in KiB."""
    return _status_kib(pid, "VmRSS")


def hwm_kib(pid: int) -> int:
    """The process's peak VmRSS (VmHWM) in KiB, since start or the last :func:`reset_peak`."""
    return _status_kib(pid, "VmHWM")


def pss_kib(pid: int) -> int | None:
    """The process's Pss in KiB (None when smaps_rollup cannot be read)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its current VmRSS; False when the kernel refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Memory:
    """One reading of a process's resident memory, in KiB."""

    rss: int
    pss: int | None

    @classmethod
    def of(cls, pid: int) -> Memory:
        return cls(rss=rss_kib(pid), pss=pss_kib(pid))


class PeakSampler:
    """The peak VmRSS of ``pid`` over a ``with`` block.

    Uses VmHWM after a reset when the kernel allows it (exact); otherwise, and as a check, it
    also samples VmRSS every ``interval`` seconds in a thread (misses peaks shorter than that).
    """

    def __init__(self, pid: int, interval: float = 0.002) -> None:
        self.pid = pid
        self.interval = interval
        self.start_kib = 0
        self.sampled_kib = 0
        self.hwm_kib: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._exact = False

    def __enter__(self) -> PeakSampler:
        self._exact = reset_peak(self.pid)
        self.start_kib = rss_kib(self.pid)
        self.sampled_kib = self.start_kib
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._exact:
            self.hwm_kib = hwm_kib(self.pid)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.sampled_kib = max(self.sampled_kib, rss_kib(self.pid))
            except (OSError, RuntimeError):
                return
            time.sleep(self.interval)

    @property
    def peak_kib(self) -> int:
        """The peak VmRSS in the block: VmHWM when it could be reset, else the sampled peak."""
        return max(self.sampled_kib, self.hwm_kib or 0)

    @property
    def growth_kib(self) -> int:
        """How far the peak rose above VmRSS at the start of the block."""
        return self.peak_kib - self.start_kib
