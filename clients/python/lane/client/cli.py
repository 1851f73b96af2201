"""The ``lane`` command line.

    lane serve [--listen HOST:PORT ...]  run the service (a flag per LANE_* setting)
    lane watch LANE                     live terminal view; Escape aborts, q quits
    lane snapshot LANE [--json]         the lane now (protobuf JSON with --json)
    lane lanes [--watch]                every lane: status, revision, operation, usage (live)
    lane send LANE TEXT                 queue a user message (steer, follow-up, next run)
    lane abort LANE                     abort the lane's open operation
    lane delete LANE [--force]          delete a lane and everything of it
    lane export LANE > FILE             the lane as an export file (docs/export-format.md)
    lane import FILE [--lane NEW_ID]    a new lane from an export file
    lane demo [--lane L] [--script S | --shell CMD]
                                        a scripted agent driving real tools
    lane agent --model PROVIDER:NAME [--lane L] PROMPT
                                        a coding agent on a real model
    lane --version

Client commands share the connection options of :mod:`lane.client.cli_connection`
(``--target``, ``--tls``, ``--ca-file``, ``--cert-file``/``--key-file``, ``--token``,
``--connect-timeout``), each with an environment variable.

Each subcommand is one ``_add_<name>(commands)`` function that declares its arguments and sets
``handler``: a function taking the parsed arguments and returning the exit status. A handler
imports what it needs itself, so ``lane --help`` and light subcommands never load the server.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from lane.client.cli_agent import add_agent
from lane.client.cli_connection import (
    DEFAULT_TARGET,
    Connection,
    add_connection_options,
    run_client,
)
from lane.client.cli_serve import add_serve
from lane.limits import MAX_PAGE_SIZE

__all__ = ["DEFAULT_TARGET", "build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lane`` command with ``argv`` (default: ``sys.argv[1:]``); return the status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    serving = bool(argv) and argv[0] == "serve"
    if not serving:
        # gRPC's C core logs a failed TLS handshake (plaintext service, untrusted certificate)
        # on stderr before the command explains it; the command's own message says it all.
        # Set before gRPC is first imported (lane.client's modules load it only when used);
        # GRPC_VERBOSITY in the environment still wins.
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    parser = build_parser(serve_flags=serving)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


def version() -> str:
    """The installed lane-client distribution's version."""
    try:
        return metadata.version("lane-client")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(*, serve_flags: bool = True) -> argparse.ArgumentParser:
    """Return the parser of the ``lane`` command and all its subcommands (``serve`` without
    its settings' flags unless ``serve_flags``)."""
    parser = argparse.ArgumentParser(
        prog="lane", description="Durable agent lanes: run the service or talk to it."
    )
    parser.add_argument("--version", action="version", version=f"lane {version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    add_serve(commands, flags=serve_flags)
    _add_watch(commands)
    _add_snapshot(commands)
    _add_lanes(commands)
    _add_send(commands)
    _add_abort(commands)
    _add_delete(commands)
    _add_export(commands)
    _add_import(commands)
    _add_demo(commands)
    add_agent(commands)
    return parser


def _add_watch(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "watch",
        help="live terminal view of a lane (Escape aborts its operation, q quits)",
        description=(
            "Show a lane live: its transcript, the open operation, running tools with a "
            "spinner and their elapsed time, settled tools waiting for placement, error results "
            "in red, queued messages. Keys: PageUp/PageDown and the Up/Down arrows scroll, Home "
            "goes to the top and End to the bottom (at the bottom the view follows the lane "
            "again); Escape sends AbortOperation for the open operation; q or Ctrl-C quits. "
            "Survives server restarts (the watch resumes where it stopped)."
        ),
    )
    command.add_argument("lane", metavar="LANE")
    add_connection_options(command)
    command.set_defaults(handler=_watch)


def _watch(args: argparse.Namespace) -> int:
    from lane.client.connect import INTERACTIVE_OPTIONS
    from lane.client.reach import normalize_target
    from lane.client.terminal import watch_terminal

    async def work(stub: Any, connection: Connection) -> int:
        target = normalize_target(connection.target)
        return await watch_terminal(stub, args.lane, target=target, tls=connection.tls)

    return run_client(args, work, extra_options=INTERACTIVE_OPTIONS)


def _add_snapshot(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "snapshot",
        help="print a lane as it is now",
        description="Print a lane's snapshot: its transcript, the open operation and its "
        "tools, or the last operation's result. Exit status 1 when the lane does not exist.",
    )
    command.add_argument("lane", metavar="LANE")
    command.add_argument("--json", action="store_true", help="print the protobuf JSON")
    add_connection_options(command)
    command.set_defaults(handler=_snapshot)


def _snapshot(args: argparse.Namespace) -> int:
    import shutil

    from google.protobuf import json_format
    from lane.client.commands import call
    from lane.client.view import render
    from lane.v1 import lane_service_pb2 as pb

    async def work(stub: Any, _: Connection) -> int:
        answer = await call(stub.GetLaneSnapshot, pb.GetLaneSnapshotRequest(lane_id=args.lane))
        if args.json:
            print(json_format.MessageToJson(answer.snapshot, indent=2))
        else:
            width = shutil.get_terminal_size((120, 40)).columns
            color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            print("\n".join(render(answer.snapshot, width=width, color=color)))
        return 0

    return run_client(args, work)


#: ``lane lanes --status`` choices: lane.v1.LaneStatus names (cli_lanes.STATUSES; a unit test
#: holds them together), spelled here so that parsing loads no generated code.
LANE_STATUSES = (
    "idle",
    "running",
    "aborting",
    "suspended",
    "retry-waiting",
    "compacting",
    "faulted",
)


def _add_lanes(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "lanes",
        help="list the lanes (--watch: live)",
        description="List the lanes of the caller's namespace: id, status, revision, open "
        "operation (- for none), tool calls running, tokens used, how the last run ended, "
        "last activity. --watch follows them live (WatchLanes): the table is redrawn on each "
        "change, or, when the output is not a terminal, one line per change. Ctrl-C stops.",
    )
    command.add_argument("--watch", action="store_true", help="follow the lanes live")
    command.add_argument("--prefix", default="", help="only lanes whose id starts with this")
    command.add_argument(
        "--status",
        action="append",
        choices=LANE_STATUSES,
        help="only lanes in this status (repeat for several)",
    )
    command.add_argument(
        "--by-activity",
        action="store_true",
        help="the most recently active first (without --watch)",
    )
    add_connection_options(command)
    command.set_defaults(handler=_lanes, page_size=MAX_PAGE_SIZE)


def _lanes(args: argparse.Namespace) -> int:
    from lane.client.cli_lanes import run

    async def work(stub: Any, _: Connection) -> int:
        status: int = await run(args, stub)
        return status

    try:
        return run_client(args, work)
    except KeyboardInterrupt:
        return 130


_QUEUE_KINDS = ("steer", "follow-up", "next-run")


def _add_send(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "send",
        help="queue a user message on a lane",
        description="Queue TEXT as a user message on the lane's inbox (EnqueueMessage). steer "
        "(the default): delivered to the open run at its next turn; follow-up: delivered when "
        "the open run would otherwise finish; next-run: taken by the next run. Without an open "
        "run, the next run takes steer and follow-up messages too. Prints the queued entry id.",
    )
    command.add_argument("lane", metavar="LANE")
    command.add_argument("text", metavar="TEXT", help="the message; - reads it from stdin")
    command.add_argument(
        "--as",
        dest="kind",
        choices=_QUEUE_KINDS,
        default="steer",
        help="how the lane delivers it (default: steer)",
    )
    add_connection_options(command)
    command.set_defaults(handler=_send)


def _send(args: argparse.Namespace) -> int:
    from lane.client.commands import call
    from lane.v1 import lane_service_pb2 as pb
    from lane.v1 import messages_pb2, snapshot_pb2

    kinds = {
        "steer": snapshot_pb2.QUEUE_KIND_STEER,
        "follow-up": snapshot_pb2.QUEUE_KIND_FOLLOW_UP,
        "next-run": snapshot_pb2.QUEUE_KIND_NEXT_RUN,
    }
    text = sys.stdin.read() if args.text == "-" else args.text
    message = messages_pb2.AgentMessage(
        user=messages_pb2.UserMessage(
            content=[messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=text))]
        )
    )

    async def work(stub: Any, _: Connection) -> int:
        answer = await call(
            stub.EnqueueMessage,
            pb.EnqueueMessageRequest(lane_id=args.lane, kind=kinds[args.kind], message=message),
        )
        print(f"queued {args.kind} message {answer.entry_id} (lane revision {answer.revision})")
        return 0

    return run_client(args, work)


def _add_abort(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "abort",
        help="abort a lane's open operation",
        description="Send AbortOperation for the lane's open operation. Exit status 1 when the "
        "lane has none.",
    )
    command.add_argument("lane", metavar="LANE")
    add_connection_options(command)
    command.set_defaults(handler=_abort)


def _abort(args: argparse.Namespace) -> int:
    from lane.client.commands import call
    from lane.v1 import lane_service_pb2 as pb

    async def work(stub: Any, _: Connection) -> int:
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

    return run_client(args, work)


def _add_delete(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "delete",
        help="delete a lane and everything of it",
        description="Send DeleteLane: the lane, its transcript, events, usage rows, inbox and "
        "recorded answers go, in one transaction; its watchers are ended. Refused while an "
        "operation is open, unless --force (the operation is deleted with the lane; its driver's "
        "next command is refused LANE_NOT_FOUND).",
    )
    command.add_argument("lane", metavar="LANE")
    command.add_argument("--force", action="store_true", help="delete even with an operation open")
    add_connection_options(command)
    command.set_defaults(handler=_delete)


def _delete(args: argparse.Namespace) -> int:
    from lane.client.commands import call
    from lane.v1 import lane_service_pb2 as pb

    async def work(stub: Any, _: Connection) -> int:
        request = pb.DeleteLaneRequest(
            lane_id=args.lane, force=args.force, request_id=str(uuid.uuid4())
        )
        answer = await call(stub.DeleteLane, request)
        also = f" with its open operation {answer.operation_id}" if answer.operation_id else ""
        print(f"deleted lane {args.lane} at revision {answer.revision}{also}")
        return 0

    return run_client(args, work)


def _add_export(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "export",
        help="write a lane as an export file to standard output",
        description="Send ExportLane and write the lane's export file (JSON Lines: a header "
        "with the format version, the lane, its entries, usage rows and event groups; see "
        "docs/export-format.md) to standard output. The lane must have no open operation.",
    )
    command.add_argument("lane", metavar="LANE")
    add_connection_options(command)
    command.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    import grpc
    from lane.client.errors import lane_error
    from lane.v1 import lane_service_pb2 as pb

    async def work(stub: Any, _: Connection) -> int:
        out = sys.stdout.buffer
        try:
            async for piece in stub.ExportLane(pb.ExportLaneRequest(lane_id=args.lane)):
                out.write(piece.data)
        except grpc.aio.AioRpcError as err:
            raise lane_error(err) from err
        out.flush()
        return 0

    return run_client(args, work)


def _add_import(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "import",
        help="create a new lane from an export file",
        description="Send the export file FILE ('-': standard input) with ImportLane: the service "
        "checks all of it, then creates the new lane with the same transcript, inbox, "
        "configuration, usage and events, in one transaction. A file that is not a valid "
        "export is refused and creates nothing.",
    )
    command.add_argument("file", metavar="FILE")
    command.add_argument(
        "--lane", metavar="NEW_ID", help="the new lane's id (default: imported-...)"
    )
    add_connection_options(command)
    command.set_defaults(handler=_import)


#: Bytes of the file per ImportLaneRequest.
_IMPORT_PIECE_BYTES = 1 << 20


def _import(args: argparse.Namespace) -> int:
    import asyncio
    from collections.abc import AsyncIterator

    import grpc
    from lane.client.errors import lane_error
    from lane.v1 import lane_service_pb2 as pb

    try:
        file = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as err:
        print(f"lane import: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    lane_id = args.lane or f"imported-{uuid.uuid4().hex[:8]}"

    async def pieces() -> AsyncIterator[pb.ImportLaneRequest]:
        # The file a piece at a time, as the service takes it: never all of it in memory.
        with file:
            data = await asyncio.to_thread(file.read, _IMPORT_PIECE_BYTES)
            yield pb.ImportLaneRequest(lane_id=lane_id, data=data)
            while data := await asyncio.to_thread(file.read, _IMPORT_PIECE_BYTES):
                yield pb.ImportLaneRequest(data=data)

    async def work(stub: Any, _: Connection) -> int:
        try:
            answer = await stub.ImportLane(pieces())
        except grpc.aio.AioRpcError as err:
            raise lane_error(err) from err
        print(
            f"imported lane {answer.lane_id}: revision {answer.revision}, "
            f"{answer.entry_count} entries, {answer.event_count} events"
        )
        return 0

    return run_client(args, work)


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
    add_connection_options(command)
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
    return run_client(
        args,
        lambda stub, connection: run_demo(
            stub,
            lane_id,
            steps,
            prompt=args.prompt,
            lease_seconds=args.lease_seconds,
            sequential=args.sequential,
            model_delay=args.model_delay,
            target=connection.target,
        ),
    )
