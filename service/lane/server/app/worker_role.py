"""A worker process's side of ``lane serve --workers N`` (see supervisor.py): what its
supervisor told it through :data:`WORKER_VARIABLE`, its log lines tagged, dying with the
supervisor, and reporting once that it serves."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from lane.server.app.config import ConfigError

_log = logging.getLogger(__name__)

#: Set in a worker's environment by its supervisor: ``number:ready_fd:supervisor_pid``. Not a
#: setting: a process started with it by hand would wait for a supervisor that is not there.
WORKER_VARIABLE = "_LANE_WORKER"

#: What a worker writes to its ready pipe once it serves.
READY = b"ready\n"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class WorkerRole:
    """What a worker process learns from :data:`WORKER_VARIABLE`."""

    number: int
    ready_fd: int
    supervisor_pid: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerRole | None:
        """The role given by the supervisor, or None in a process started otherwise."""
        value = environ.get(WORKER_VARIABLE, "").strip()
        if not value:
            return None
        try:
            number, ready_fd, supervisor_pid = (int(part) for part in value.split(":"))
        except ValueError:
            raise ConfigError(WORKER_VARIABLE, value, "expected number:fd:pid") from None
        return cls(number, ready_fd, supervisor_pid)

    def attach(self, log_format: str) -> None:
        """Tag this process's log lines, die with the supervisor, keep the pipe to ourselves.

        Call after logging is configured."""
        tag = _WorkerTag(self.number, os.getpid(), rename=log_format == "text")
        for handler in logging.getLogger().handlers:
            handler.addFilter(tag)
        os.set_inheritable(self.ready_fd, False)
        if sys.platform == "linux":
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.supervisor_pid:
            # The supervisor died before the line above took effect.
            _log.error("supervisor (pid %d) is gone: exiting", self.supervisor_pid)
            os._exit(1)

    def report_ready(self) -> None:
        """Tell the supervisor this worker serves (once)."""
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, READY)
        with contextlib.suppress(OSError):
            os.close(self.ready_fd)


class _WorkerTag(logging.Filter):
    """Marks a worker's log records: ``text`` appends ``[worker K pid P]`` to the logger name,
    ``json`` adds the fields ``worker`` and ``pid``."""

    def __init__(self, number: int, pid: int, *, rename: bool) -> None:
        super().__init__()
        self.number = number
        self.pid = pid
        self.rename = rename

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "worker", None) is None:  # once, whatever the number of handlers
            record.worker = self.number
            record.pid = self.pid
            if self.rename:
                record.name = f"{record.name}[worker {self.number} pid {self.pid}]"
        return True
