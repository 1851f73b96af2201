"""How the ``lane`` client commands reach the service: the options they share and the runner
that connects, runs a command's work and turns failures into a message and an exit status.

Each option has an environment variable (shown in ``--help``); the option wins over the
variable. The connection is checked first (:func:`lane.client.connect.connect`), so a wrong
target, a TLS mismatch or an unknown host is reported within ``--connect-timeout`` seconds,
naming the target, the cause and the fix.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TARGET", "Connection", "add_connection_options", "run_client"]

DEFAULT_TARGET = "127.0.0.1:50051"
_ON = frozenset({"1", "on", "true", "yes"})


@dataclass(frozen=True)
class Connection:
    """Where and how to reach the service, from a command's options."""

    target: str
    tls: bool
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    token: str | None
    connect_timeout: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Connection:
        """The connection a parsed command line asks for. Any certificate option means TLS."""
        return cls(
            target=args.target,
            tls=bool(args.tls or args.ca_file or args.cert_file),
            ca_file=args.ca_file or None,
            cert_file=args.cert_file or None,
            key_file=args.key_file or None,
            token=args.token or None,
            connect_timeout=args.connect_timeout,
        )


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def seconds(text: str) -> float:
    """A command-line number of seconds, > 0 (argparse's ``type``)."""
    return _seconds(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def add_connection_options(command: argparse.ArgumentParser) -> None:
    """Add ``--target``, the TLS options, ``--token`` and ``--connect-timeout``."""
    from lane.client.connect import CONNECT_TIMEOUT_SECONDS

    group = command.add_argument_group("connection")
    group.add_argument(
        "--target",
        default=_env("LANE_TARGET") or DEFAULT_TARGET,
        metavar="HOST[:PORT]",
        help=f"the lane service; without a port, 50051 ($LANE_TARGET, else {DEFAULT_TARGET})",
    )
    group.add_argument(
        "--tls",
        action="store_true",
        default=(_env("LANE_TLS") or "").lower() in _ON,
        help="connect with TLS, trusting the system's CAs ($LANE_TLS=on)",
    )
    group.add_argument(
        "--ca-file",
        default=_env("LANE_CA_FILE"),
        metavar="PEM",
        help="trust the CAs in this file instead (implies --tls; $LANE_CA_FILE)",
    )
    group.add_argument(
        "--cert-file",
        default=_env("LANE_CLIENT_CERT_FILE"),
        metavar="PEM",
        help="client certificate for mutual TLS, with --key-file ($LANE_CLIENT_CERT_FILE)",
    )
    group.add_argument(
        "--key-file",
        default=_env("LANE_CLIENT_KEY_FILE"),
        metavar="PEM",
        help="the client certificate's private key ($LANE_CLIENT_KEY_FILE)",
    )
    group.add_argument(
        "--token",
        default=_env("LANE_TOKEN"),
        help="bearer token, when the service has auth on ($LANE_TOKEN; the variable keeps it "
        "out of process listings)",
    )
    group.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=_seconds(_env("LANE_CONNECT_TIMEOUT") or str(CONNECT_TIMEOUT_SECONDS)),
        metavar="SECONDS",
        help="give up when the service does not answer within this long "
        f"($LANE_CONNECT_TIMEOUT, else {CONNECT_TIMEOUT_SECONDS:g})",
    )


def run_client(
    args: argparse.Namespace,
    work: Callable[[Any, Connection], Awaitable[int]],
    *,
    extra_options: Sequence[tuple[str, str | int]] = (),
) -> int:
    """Connect as ``args`` say, run ``work(stub, connection)``, return its exit status; on
    failure print a message naming the target, the cause and the fix, and return 1."""
    from lane.client.connect import connect, tls_credentials
    from lane.client.errors import LaneError
    from lane.client.reach import Unreachable, explained, normalize_target, scheme_problem
    from lane.v1 import lane_service_pb2_grpc

    connection = Connection.from_args(args)
    problem = scheme_problem(connection.target)
    if problem is not None:
        print(f"lane: {problem}", file=sys.stderr)
        return 2
    target = normalize_target(connection.target)
    if (connection.cert_file is None) != (connection.key_file is None):
        print("lane: --cert-file and --key-file go together (mutual TLS)", file=sys.stderr)
        return 2
    try:
        credentials = (
            tls_credentials(
                ca_file=connection.ca_file,
                cert_file=connection.cert_file,
                key_file=connection.key_file,
            )
            if connection.tls
            else None
        )
    except OSError as err:
        print(f"lane: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2

    async def main() -> int:
        channel = await connect(
            target,
            credentials=credentials,
            token=connection.token,
            connect_timeout=connection.connect_timeout,
            extra_options=extra_options,
        )
        async with channel:
            return await work(lane_service_pb2_grpc.LaneServiceStub(channel), connection)

    try:
        return asyncio.run(main())
    except Unreachable as err:
        print(f"lane: {err}", file=sys.stderr)
        return 1
    except LaneError as err:
        message = explained(err, target, tls=connection.tls, token=connection.token is not None)
        print(f"lane: {message}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
