"""Native code's stderr (gRPC core above all) as log records, so JSON logs stay JSON.

gRPC core logs through absl straight to file descriptor 2, bypassing Python's logging: a TLS
handshake that fails prints ``I0101 12:00:00.000000  123 ssl_transport_security.cc:2563]
Handshake failed with error SSL_ERROR_SSL: ...`` in the middle of JSON lines. grpcio offers no
hook for these lines, so :func:`route_native_stderr` points descriptor 2 at a pipe and a thread
turns each line into a record of the ``grpc`` logger (absl's I/W/E/F as INFO, WARNING, ERROR,
CRITICAL; the source file kept as ``source``). Other native lines are records of the
``stderr`` logger at WARNING; lines that already are JSON objects (a worker process's own log,
which it writes to the descriptor it inherited) pass through unchanged. Python's ``sys.stderr``
keeps the original descriptor, so log handlers and tracebacks never go round the pipe.

One cost: if the process dies at once (absl's FATAL aborts), its last native line may still be
in the pipe. ``LANE_LOG_FORMAT=text`` leaves descriptor 2 alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from typing import TextIO

__all__ = ["route_native_stderr"]

_ABSL = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([^\]\s]+)\] ?(.*)$")
_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
_grpc_log = logging.getLogger("grpc")
_stderr_log = logging.getLogger("stderr")


def route_native_stderr() -> None:
    """Route what native code writes to descriptor 2 through logging (see the module doc).
    Call it before logging's handlers are made: they must bind the new ``sys.stderr``."""
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    sys.stderr = open(original, "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    reader = threading.Thread(
        target=_forward, args=(read_fd, sys.stderr), name="native-stderr", daemon=True
    )
    reader.start()


def _forward(read_fd: int, passthrough: TextIO) -> None:
    with open(read_fd, encoding="utf-8", errors="replace") as lines:
        for raw in lines:
            line = raw.rstrip("\n")
            if line:
                log_line(line, passthrough)


def log_line(line: str, passthrough: TextIO) -> None:
    """Log one native stderr ``line``; write JSON object lines to ``passthrough`` as they are."""
    if line.startswith("{"):
        try:
            json.loads(line)
        except ValueError:
            pass
        else:
            passthrough.write(line + "\n")
            return
    match = _ABSL.match(line)
    if match is None:
        _stderr_log.warning("%s", line)
        return
    level, source, message = match.groups()
    _grpc_log.log(_LEVELS[level], "%s", message, extra={"source": source})
