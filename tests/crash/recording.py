"""The crash tests' tools: every execution is recorded in PostgreSQL before its effect begins.

``safe_read`` (replay ``"safe"``) and ``never_write`` (replay ``"never"``) do the same thing,
as their arguments say: ``steps`` times wait ``delay`` seconds and report progress (a
checkpoint when ``checkpoint``), then return ``"<tool> <call id> done (attempt <n>)"``. Before
any of it the execution is a committed row of ``crash_executions`` (attempt ``n`` of the
call), so a checker counts the executions of each call whatever was killed when: a NEVER call
may have one, a SAFE call one per tool_start. A tool that sees the run's abort stops and says
so in an error result.

``start_delay`` holds a call before its intent: :func:`hold_start`, a before_tool hook, sleeps
it. The driver runs before_tool hooks one call after another in source order, so a call can
be kept planned while the calls before it run.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
from lane.client.hooks import BeforeToolDecision, BeforeToolEvent
from lane.client.tools import ReplayPolicyName, Tool, ToolContext, ToolResult, ToolResultLike
from lane.v1 import lane_service_pb2 as pb

SAFE_TOOL = "safe_read"
NEVER_TOOL = "never_write"
#: A name no driver has a tool for: its calls get UNKNOWN_TOOL results.
UNKNOWN_TOOL = "nosuch"
REPLAY: dict[str, ReplayPolicyName] = {SAFE_TOOL: "safe", NEVER_TOOL: "never"}

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {"type": "integer", "minimum": 1},
        "delay": {"type": "number", "minimum": 0},
        "checkpoint": {"type": "boolean"},
        "start_delay": {"type": "number", "minimum": 0},
    },
    "required": ["steps", "delay"],
    "additionalProperties": False,
}

EXECUTIONS_DDL = """
CREATE TABLE IF NOT EXISTS crash_executions (
    lane_id      text NOT NULL,
    operation_id text NOT NULL,
    tool_call_id text NOT NULL,
    attempt_no   integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    driver_id    text NOT NULL DEFAULT '',
    replayed     boolean NOT NULL DEFAULT false
)
"""


def replay_of(tool_name: str) -> int:
    """The replay policy the tool named ``tool_name`` declares (NEVER for unknown names)."""
    safe = REPLAY.get(tool_name) == "safe"
    return pb.REPLAY_POLICY_SAFE if safe else pb.REPLAY_POLICY_NEVER


async def ensure_executions_table(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create ``crash_executions`` if missing (concurrent creators may race: tolerated)."""
    with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        await conn.execute(EXECUTIONS_DDL)


async def record_execution(
    conn: psycopg.AsyncConnection[Any], ctx: ToolContext, driver_id: str
) -> int:
    """Commit one execution of ``ctx``'s call; its attempt number (1 for the first)."""
    cur = await conn.execute(
        "INSERT INTO crash_executions"
        " (lane_id, operation_id, tool_call_id, attempt_no, driver_id, replayed)"
        " SELECT %s, %s, %s, coalesce(max(attempt_no), 0) + 1, %s, %s"
        " FROM crash_executions WHERE lane_id = %s AND tool_call_id = %s"
        " RETURNING attempt_no",
        (
            ctx.lane_id,
            ctx.operation_id,
            ctx.tool_call_id,
            driver_id,
            ctx.replaying,
            ctx.lane_id,
            ctx.tool_call_id,
        ),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def recording_tools(conn: psycopg.AsyncConnection[Any], driver_id: str) -> list[Tool]:
    """The two tools, recording their executions through ``conn`` as ``driver_id``."""

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        attempt = await record_execution(conn, ctx, driver_id)
        steps = int(args["steps"])
        report = ctx.checkpoint if args.get("checkpoint") else ctx.progress
        for step in range(1, steps + 1):
            await asyncio.sleep(float(args["delay"]))
            if ctx.cancelled:
                return ToolResult.error(f"{ctx.tool_call_id} aborted after step {step - 1}")
            await report(f"{ctx.tool_call_id} step {step}/{steps}")
        return f"{ctx.tool_name} {ctx.tool_call_id} done (attempt {attempt})"

    return [
        Tool(name=name, parameters=PARAMETERS, execute=execute, replay=replay)
        for name, replay in REPLAY.items()
    ]


async def hold_start(event: BeforeToolEvent) -> BeforeToolDecision:
    """before_tool: wait the call's ``start_delay`` seconds before its intent is committed."""
    await asyncio.sleep(float(event.args.get("start_delay", 0)))
    return None
