"""The ``lane`` command line.

Each subcommand is one ``_add_<name>(commands)`` function that declares its arguments and sets
``handler``: a function taking the parsed arguments and returning the exit status. A handler
imports what it needs itself, so ``lane --help`` and light subcommands never load the server.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lane`` command with ``argv`` (default: ``sys.argv[1:]``); return the status."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the ``lane`` command and all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="lane", description="Durable agent lanes: run the service or talk to it."
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_serve(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "serve",
        help="run the lane service until SIGTERM or Ctrl-C",
        description=(
            "Run the lane gRPC service. Configured by environment variables: "
            "LANE_DATABASE_URL (unset: embedded PostgreSQL in LANE_DATA_DIR, default "
            "./.lane-data), LANE_LISTEN (default 127.0.0.1:50051), LANE_GRACE_SECONDS "
            "(default 5), LANE_NOTIFY (on|off, default on), LANE_POLL_INTERVAL_SECONDS "
            "(default 1.0). Exit status: 0 after a graceful shutdown, 1 if start-up failed, "
            "2 for a bad configuration value."
        ),
    )
    command.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    # Imported here: the server pulls in grpc servers, psycopg pools and pgserver, which
    # client-only subcommands should not pay for (or need installed).
    # As in service/app/__main__.py: no gRPC fork handlers for the pg_ctl the server may run.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    from service.app.server import main as serve_main

    return serve_main()
