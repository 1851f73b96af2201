"""The ``lane`` command line.

    lane serve [--workers N]            run the service (configured by LANE_* variables)
    lane watch LANE                     live terminal view; Escape aborts, q quits
    lane snapshot LANE [--json]         the lane now (protobuf JSON with --json)
    lane lanes                          every lane, its revision and open operation
    lane abort LANE                     abort the lane's open operation
    lane demo [--lane L] [--script S | --shell CMD]
                                        a scripted agent driving real tools

Client commands talk to ``--target HOST:PORT`` (default: ``$LANE_TARGET``, else
``127.0.0.1:50051``), with the bearer token in ``$LANE_TOKEN`` when the service needs one (an
environment variable, not an argument: arguments show in every process listing).

Each subcommand is one ``_add_<name>(commands)`` function that declares its arguments and sets
``handler``: a function taking the parsed arguments and returning the exit status. A handler
imports what it needs itself, so ``lane --help`` and light subcommands never load the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Handler = Callable[[argparse.Namespace], int]

DEFAULT_TARGET = "127.0.0.1:50051"


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
    _add_watch(commands)
    _add_snapshot(commands)
    _add_lanes(commands)
    _add_abort(commands)
    _add_demo(commands)
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
            "(default 1.0), LANE_WORKERS (default: the number of CPUs). Exit status: 0 after "
            "a graceful shutdown, 1 if start-up failed, 2 for a bad configuration value."
        ),
    )
    command.add_argument(
        "--workers",
        type=_whole_number_at_least_1,
        metavar="N",
        help=(
            "server processes sharing the port, under one supervisor (default: $LANE_WORKERS, "
            "else the number of CPUs; 1: a single process)"
        ),
    )
    command.set_defaults(handler=_serve)


def _whole_number_at_least_1(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _serve(args: argparse.Namespace) -> int:
    # Imported here: the server pulls in grpc servers, psycopg pools and pgserver, which
    # client-only subcommands should not pay for (or need installed).
    # As in service/app/__main__.py: no gRPC fork handlers for the pg_ctl the server may run.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    from service.app.main import main as serve_main

    return serve_main(workers=args.workers)


# -- client commands ---------------------------------------------------------------------------


def _add_target(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--target",
        default=os.environ.get("LANE_TARGET") or DEFAULT_TARGET,
        metavar="HOST:PORT",
        help=f"the lane service (default: $LANE_TARGET, else {DEFAULT_TARGET})",
    )


def _with_stub(target: str, work: Callable[[Any], Awaitable[int]]) -> int:
    """Run ``work(stub)`` with a channel to ``target``; report failures as exit status 1."""
    from lane.client.connect import open_channel
    from lane.client.errors import LaneError
    from lane.v1 import lane_service_pb2_grpc

    async def main() -> int:
        async with open_channel(target, token=os.environ.get("LANE_TOKEN") or None) as channel:
            return await work(lane_service_pb2_grpc.LaneServiceStub(channel))

    try:
        return asyncio.run(main())
    except LaneError as err:
        print(f"lane: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130


def _add_watch(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "watch",
        help="live terminal view of a lane (Escape aborts its operation, q quits)",
        description=(
            "Show a lane live: its transcript, the open operation, running tools with a "
            "spinner and their elapsed time, settled tools waiting for placement, error results "
            "in red. Escape sends AbortOperation for the open operation; q or Ctrl-C quits. "
            "Survives server restarts (the watch resumes where it stopped)."
        ),
    )
    command.add_argument("lane", metavar="LANE")
    _add_target(command)
    command.set_defaults(handler=_watch)


def _watch(args: argparse.Namespace) -> int:
    from lane.client.terminal import watch_terminal

    return _with_stub(args.target, lambda stub: watch_terminal(stub, args.lane))


def _add_snapshot(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser("snapshot", help="print a lane as it is now")
    command.add_argument("lane", metavar="LANE")
    command.add_argument("--json", action="store_true", help="print the protobuf JSON")
    _add_target(command)
    command.set_defaults(handler=_snapshot)


def _snapshot(args: argparse.Namespace) -> int:
    import shutil

    from google.protobuf import json_format
    from lane.client.commands import call
    from lane.client.view import render
    from lane.v1 import lane_service_pb2 as pb

    async def work(stub: Any) -> int:
        answer = await call(stub.GetLaneSnapshot, pb.GetLaneSnapshotRequest(lane_id=args.lane))
        if args.json:
            print(json_format.MessageToJson(answer.snapshot, indent=2))
        else:
            width = shutil.get_terminal_size((120, 40)).columns
            color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            print("\n".join(render(answer.snapshot, width=width, color=color)))
        return 0

    return _with_stub(args.target, work)


def _add_lanes(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser("lanes", help="list the lanes")
    _add_target(command)
    command.set_defaults(handler=_lanes)


def _lanes(args: argparse.Namespace) -> int:
    from lane.client.commands import call
    from lane.v1 import lane_service_pb2 as pb
    from lane.v1 import snapshot_pb2

    async def work(stub: Any) -> int:
        rows: list[tuple[str, str, str, str]] = []
        token = ""
        while True:
            page = await call(stub.ListLanes, pb.ListLanesRequest(page_size=1000, page_token=token))
            for lane in page.lanes:
                status = "idle"
                if lane.operation_id:
                    status = (
                        "aborting"
                        if lane.operation_status == snapshot_pb2.OPERATION_STATUS_ABORTING
                        else "open"
                    )
                rows.append((lane.lane_id, str(lane.revision), lane.operation_id or "-", status))
            token = page.next_page_token
            if not token:
                break
        header = ("LANE", "REVISION", "OPERATION", "STATUS")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        return 0

    return _with_stub(args.target, work)


def _add_abort(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "abort",
        help="abort a lane's open operation",
        description="Send AbortOperation for the lane's open operation. Exit status 1 when the "
        "lane has none.",
    )
    command.add_argument("lane", metavar="LANE")
    _add_target(command)
    command.set_defaults(handler=_abort)


def _abort(args: argparse.Namespace) -> int:
    from lane.client.commands import call
    from lane.v1 import lane_service_pb2 as pb

    async def work(stub: Any) -> int:
        answer = await call(stub.GetLaneSnapshot, pb.GetLaneSnapshotRequest(lane_id=args.lane))
        if not answer.snapshot.HasField("operation"):
            print(f"lane {args.lane} has no open operation", file=sys.stderr)
            return 1
        operation_id = answer.snapshot.operation.id
        aborted = await call(
            stub.AbortOperation,
            pb.AbortOperationRequest(lane_id=args.lane, operation_id=operation_id),
        )
        state = "abort requested" if aborted.newly_requested else "already aborting"
        print(f"operation {operation_id}: {state}")
        return 0

    return _with_stub(args.target, work)


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "demo",
        help="run a scripted agent with real tools (shell, sleep, read_file)",
        description=(
            "Drive one run on a lane with a scripted model and real tools: shell (runs a "
            "command, streams its output, aborted by killing it), sleep, read_file. The default "
            "script runs a parallel batch whose later calls finish first. Ctrl-C aborts the run "
            "(twice quits). Exit status: 0 completed, 3 aborted, 1 failed or unreachable."
        ),
    )
    command.add_argument("--lane", help="the lane to use (default: a new demo-... lane)")
    _add_target(command)
    choice = command.add_mutually_exclusive_group()
    choice.add_argument(
        "--script",
        help="a built-in script (tour, parallel), a JSON script file, or inline JSON "
        "(default: tour)",
    )
    choice.add_argument(
        "--shell", metavar="CMD", help="a script whose one tool call runs exactly CMD"
    )
    command.add_argument("--prompt", default="Show me what you can do.", help="the user prompt")
    command.add_argument(
        "--sequential", action="store_true", help="run each batch one call at a time"
    )
    command.add_argument(
        "--lease-seconds", type=int, default=30, help="the driver's lease (default: 30)"
    )
    command.add_argument(
        "--model-delay",
        type=float,
        default=0.5,
        help="seconds the scripted model 'thinks' per answer (default: 0.5)",
    )
    command.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from lane.client.demo import configure_demo_logging, resolve_script, run_demo

    try:
        steps = resolve_script(args.script, args.shell)
    except (ValueError, OSError) as err:
        print(f"lane demo: bad script: {err}", file=sys.stderr)
        return 2
    lane_id = args.lane or f"demo-{uuid.uuid4().hex[:8]}"
    configure_demo_logging()
    return _with_stub(
        args.target,
        lambda stub: run_demo(
            stub,
            lane_id,
            steps,
            prompt=args.prompt,
            lease_seconds=args.lease_seconds,
            sequential=args.sequential,
            model_delay=args.model_delay,
            target=args.target,
        ),
    )
