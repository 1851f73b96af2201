"""``lane demo``: a scripted agent driving real tools through the lane service.

Three tools:

``shell`` (replay never)
    Runs ``command`` with ``/bin/sh`` in its own process group. Output (stdout and stderr) is
    streamed as progress about five times a second and checkpointed at most every two seconds.
    A non-zero exit status makes an error result. When the run's abort is seen the process
    group is killed and the result is the error ``Command aborted after N.Ns`` (after any
    output). ``timeout_seconds`` kills it likewise (``Command timed out after N.Ns``).
``sleep`` (replay safe)
    Sleeps ``seconds``, reporting progress every second; stops early on abort.
``read_file`` (replay safe)
    Returns the text of ``path`` (at most ``max_bytes`` bytes, default 4000).

The default script (``tour``) runs a parallel batch in which later calls finish first (so
their results wait, settled, for the earlier call's), then a command that streams output, then
answers. ``--shell CMD`` makes a script that runs exactly ``CMD``; ``--script`` takes a
built-in name, a JSON file or inline JSON (see :func:`lane.client.model.load_script`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lane.client.driver import Driver, LeaseLost
from lane.client.errors import LaneError
from lane.client.model import Model, ScriptedCall, ScriptedModel, ScriptStep, load_script
from lane.client.reach import explained
from lane.client.tools import Tool, ToolContext, ToolResult, ToolResultLike
from lane.v1 import lane_service_pb2 as pb

__all__ = [
    "DEMO_TOOLS",
    "READ_FILE",
    "SHELL",
    "SLEEP",
    "builtin_script",
    "drive_interruptibly",
    "resolve_script",
    "run_demo",
]

#: How much output the shell tool keeps (the tail).
_OUTPUT_LIMIT = 16 * 1024
_PROGRESS_INTERVAL = 0.2
_CHECKPOINT_INTERVAL = 2.0


def _tail(output: bytearray) -> str:
    return bytes(output[-_OUTPUT_LIMIT:]).decode("utf-8", errors="replace").rstrip("\n")


def _with_notice(text: str, notice: str) -> str:
    return f"{text}\n{notice}" if text else notice


async def _shell(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
    command: str = args["command"]
    limit: float | None = args.get("timeout_seconds")
    started = time.monotonic()
    process = await asyncio.create_subprocess_shell(
        command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group: kill the command and its children
    )
    output = bytearray()

    async def pump() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(4096):
            output.extend(chunk)
            if len(output) > 2 * _OUTPUT_LIMIT:
                del output[:-_OUTPUT_LIMIT]

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    reader = asyncio.create_task(pump())
    exited = asyncio.create_task(process.wait())
    aborted = asyncio.create_task(ctx.abort_signal.wait())
    sent = ""
    last_progress = last_checkpoint = started
    try:
        while not exited.done():
            await asyncio.wait({exited, aborted}, timeout=_PROGRESS_INTERVAL)
            elapsed = time.monotonic() - started
            stop = None
            if aborted.done() and not exited.done():
                stop = f"Command aborted after {elapsed:.1f}s"
            elif limit is not None and elapsed >= limit and not exited.done():
                stop = f"Command timed out after {elapsed:.1f}s"
            if stop is not None:
                kill()
                await exited
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader, 1.0)
                details = {"exit_code": None, "elapsed_seconds": round(elapsed, 3)}
                return ToolResult.error(_with_notice(_tail(output), stop), details=details)
            text = _tail(output)
            now = time.monotonic()
            if text != sent and now - last_progress >= _PROGRESS_INTERVAL:
                if now - last_checkpoint >= _CHECKPOINT_INTERVAL:
                    await ctx.checkpoint(text)
                    last_checkpoint = now
                else:
                    await ctx.progress(text)
                sent, last_progress = text, now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, 5.0)
    finally:
        if not exited.done():
            kill()
        for task in (reader, exited, aborted):
            task.cancel()
    elapsed = time.monotonic() - started
    code = process.returncode
    text = _tail(output)
    details = {"exit_code": code, "elapsed_seconds": round(elapsed, 3)}
    if code:
        return ToolResult.error(_with_notice(text, f"(exit status {code})"), details=details)
    return ToolResult(content=text or "(no output)", details=details)


async def _sleep(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
    seconds = float(args["seconds"])
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            return ToolResult(content=f"Slept {seconds:g}s", details={"seconds": seconds})
        if ctx.cancelled:
            return ToolResult.error(f"Sleep aborted after {elapsed:.1f}s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.abort_signal.wait(), min(1.0, seconds - elapsed))
        if not ctx.cancelled and time.monotonic() - started < seconds:
            await ctx.progress(f"slept {time.monotonic() - started:.0f}s of {seconds:g}s")


async def _read_file(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
    path = Path(args["path"])
    limit = int(args.get("max_bytes", 4000))
    data = await asyncio.to_thread(path.read_bytes)
    text = data[:limit].decode("utf-8", errors="replace")
    truncated = len(data) > limit
    if truncated:
        text += f"\n… ({len(data) - limit} more bytes)"
    return ToolResult(
        content=text, details={"path": str(path), "bytes": len(data), "truncated": truncated}
    )


SHELL = Tool(
    name="shell",
    description="Run a shell command; its output streams as progress.",
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1},
            "timeout_seconds": {"type": "number", "exclusiveMinimum": 0},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    execute=_shell,
)

SLEEP = Tool(
    name="sleep",
    description="Wait a number of seconds.",
    parameters={
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 3600}},
        "required": ["seconds"],
        "additionalProperties": False,
    },
    execute=_sleep,
    replay="safe",
)

READ_FILE = Tool(
    name="read_file",
    description="Read a text file.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "max_bytes": {"type": "integer", "minimum": 1},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    execute=_read_file,
    replay="safe",
)

DEMO_TOOLS: tuple[Tool, ...] = (SHELL, SLEEP, READ_FILE)


def builtin_script(name: str) -> list[ScriptStep]:
    """A built-in script: ``tour`` (the default) or ``parallel``."""
    if name == "tour":
        return [
            ScriptStep(
                "Three things at once: a nap, a file, a command. The file and the command finish "
                "first; their results wait, settled, until the nap's is placed.",
                calls=[
                    ScriptedCall("sleep", {"seconds": 3}),
                    ScriptedCall("read_file", {"path": __file__, "max_bytes": 300}),
                    ScriptedCall("shell", {"command": "echo hello from $(uname -s); sleep 1"}),
                ],
            ),
            ScriptStep(
                "Now a command whose output streams as it runs.",
                calls=[
                    ScriptedCall(
                        "shell", {"command": "for i in 1 2 3 4 5; do echo step $i; sleep 0.6; done"}
                    )
                ],
            ),
            ScriptStep("All done. Every step above is durable in the lane."),
        ]
    if name == "parallel":
        return [
            ScriptStep(
                "Two calls; the second finishes first and waits for the first.",
                calls=[
                    ScriptedCall("sleep", {"seconds": 4}),
                    ScriptedCall("shell", {"command": "echo early bird"}),
                ],
            ),
            ScriptStep("Both results are placed in source order."),
        ]
    raise ValueError(f"no built-in script {name!r} (choose tour or parallel)")


def shell_script(command: str) -> list[ScriptStep]:
    """A script that runs exactly ``command`` with the shell tool, then answers."""
    return [
        ScriptStep(f"Running `{command}`.", calls=[ScriptedCall("shell", {"command": command})]),
        ScriptStep("The command finished."),
    ]


def resolve_script(script: str | None, shell: str | None) -> list[ScriptStep]:
    """The steps of ``--script``/``--shell``: a built-in name, a JSON file, inline JSON."""
    if shell is not None:
        return shell_script(shell)
    if script is None:
        return builtin_script("tour")
    text = script.strip()
    if text.startswith("["):
        return load_script(json.loads(text))
    path = Path(script)
    if path.is_file():
        return load_script(json.loads(path.read_text()))
    return builtin_script(script)


async def run_demo(
    stub: Any,
    lane_id: str,
    steps: list[ScriptStep],
    *,
    prompt: str = "Show me what you can do.",
    lease_seconds: int = 30,
    sequential: bool = False,
    model_delay: float = 0.5,
    target: str = "",
    out: Any = None,
) -> int:
    """Drive one scripted run on ``lane_id``; return 0 completed, 3 aborted, 1 otherwise
    (Ctrl-C aborts: :func:`drive_interruptibly`)."""
    out = out or sys.stdout
    settings = pb.RunSettings(
        tool_execution=pb.TOOL_EXECUTION_SEQUENTIAL if sequential else pb.TOOL_EXECUTION_PARALLEL
    )
    driver = Driver(
        stub,
        lane_id,
        DEMO_TOOLS,
        lease_seconds=lease_seconds,
        settings=settings,
        abort_grace_seconds=10.0,
    )
    print(f"lane demo: lane {lane_id}", file=out, flush=True)
    where = f" --target {target}" if target else ""
    print(f"  watch it live:  lane watch {lane_id}{where}", file=out, flush=True)
    model = ScriptedModel(steps, delay=model_delay)
    return await drive_interruptibly(
        driver, prompt, model, name="lane demo", target=target, out=out
    )


async def drive_interruptibly(
    driver: Driver,
    prompt: str,
    model: Model,
    *,
    name: str,
    target: str = "",
    out: Any = None,
) -> int:
    """Drive one run of ``driver`` to its end and print how it ended; return 0 completed, 3
    aborted, 1 otherwise (``name`` starts the messages).

    SIGINT (Ctrl-C) asks the service to abort the run; a second one, or SIGTERM, stops at once
    (running commands are killed; the run is left to another driver or the service).
    """
    out = out or sys.stdout
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    pending: set[asyncio.Task[bool]] = set()

    def on_interrupt() -> None:
        if not pending and driver.operation_id is not None:
            print("interrupted: aborting the run (again to quit)", file=out, flush=True)
            task = loop.create_task(driver.abort())
            pending.add(task)
        elif main is not None:
            main.cancel()

    def on_terminate() -> None:
        if main is not None:
            main.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
        loop.add_signal_handler(signal.SIGTERM, on_terminate)
    try:
        result = await driver.run(prompt, model)
    except LaneError as err:
        print(f"{name}: {explained(err, target)}", file=out, flush=True)
        return 1
    except LeaseLost as err:
        print(f"{name}: {err}", file=out, flush=True)
        return 1
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
    ended = f"run {result.operation_id} ended {result.status_name}"
    if result.result.HasField("error"):
        ended += f" ({result.result.error.code}: {result.result.error.message})"
    print(
        f"{ended} after {result.turns} turn{'' if result.turns == 1 else 's'}",
        file=out,
        flush=True,
    )
    if result.status_name == "completed":
        return 0
    return 3 if result.status_name == "aborted" else 1


def configure_demo_logging() -> None:
    """Narrate the driver's steps on stderr, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("lane.client.driver")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
