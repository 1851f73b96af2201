"""One table of cases (tests/driver_cases.json) run by both drivers: the Python
``lane.client.Driver`` in this process and the TypeScript ``Driver`` in a Node process, each on
a lane of its own against the real service. The TypeScript driver runs every case over its
default DriveLane session, and one case over unary RPCs.

For every case both must end the run the same way and place, per call, what the table expects
(executed or the synthetic cause, is_error, the text); and the two lanes' event logs must agree
call by call: the same kinds in the same order, the same commits (a synthetic outcome is staged
in one commit with its tool_start), the same effective arguments, progress, results and
placement. Across calls a parallel batch may interleave differently from run to run, so the
cross-call comparison is the transcript's order (source order) and, for sequential batches,
the whole sequence of tool events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from lane.client.driver import Driver
from lane.client.hooks import (
    AfterToolEvent,
    AfterToolPatch,
    BeforeToolDecision,
    BeforeToolEvent,
    Deny,
    Hooks,
    ReplaceArguments,
)
from lane.client.model import ScriptedModel, load_script
from lane.client.tools import Tool, ToolContext, ToolResultLike
from lane.v1 import events_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.app.server import RunningServer
from tests.crash.checks import load
from tests.integration.lanes import new_lane_id
from tests.integration.typescript_driver import start_node_driver

pytestmark = pytest.mark.asyncio(loop_scope="session")

CASES_FILE = Path(__file__).resolve().parents[1] / "driver_cases.json"
CASES: list[dict[str, Any]] = json.loads(CASES_FILE.read_text())["cases"]

ECHO_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "delay": {"type": "number", "minimum": 0},
        "fail": {"type": "boolean"},
    },
    "required": ["text"],
    "additionalProperties": False,
}


async def _echo(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
    await ctx.progress(f"working on {args['text']}")
    await asyncio.sleep(float(args.get("delay", 0)))
    if args.get("fail"):
        raise RuntimeError(f"echo failed: {args['text']}")
    return f"echo: {args['text']}"


ECHO = Tool(name="echo", parameters=ECHO_PARAMETERS, execute=_echo, replay="safe")


async def run_python(target: str, lane_id: str, case: dict[str, Any], stub: Any) -> str:
    """The case with the Python driver; the run's status name."""
    holder: list[Driver] = []

    async def before(event: BeforeToolEvent) -> BeforeToolDecision:
        text = event.args.get("text")
        if text == "forbidden":
            return Deny("forbidden text")
        if text == "secret":
            return ReplaceArguments({**event.args, "text": "[redacted]"})
        if text == "abort":
            await holder[0].abort()
        return None

    def after(event: AfterToolEvent) -> AfterToolPatch | None:
        return AfterToolPatch(content="patched") if event.args.get("text") == "patch me" else None

    sequential = case["mode"] == "sequential"
    mode = pb.TOOL_EXECUTION_SEQUENTIAL if sequential else pb.TOOL_EXECUTION_PARALLEL
    driver = Driver(
        stub,
        lane_id,
        [ECHO],
        hooks=Hooks(before_tool=[before], after_tool=[after]),
        settings=pb.RunSettings(tool_execution=mode),
        model=ScriptedModel(load_script(case["steps"])),
    )
    holder.append(driver)
    result = await driver.run(f"case {case['name']}")
    return result.status_name


def _texts(result: Any) -> list[str]:
    return [block.text.text for block in result.content if block.WhichOneof("block") == "text"]


def per_call(
    events: Sequence[events_pb2.HarnessEvent], group_end: dict[int, int]
) -> dict[str, list[tuple[Any, ...]]]:
    """Each call's events, normalized: kind, whether it shares the previous one's commit, and
    what it carries (arguments parsed, result texts, is_error)."""
    calls: dict[str, list[tuple[Any, ...]]] = {}
    last_group: dict[str, int] = {}
    for event in events:
        kind = event.WhichOneof("kind")
        if kind in ("tool_start", "tool_update", "tool_end"):
            body = getattr(event, kind)
            call_id = body.tool_call_id
            if kind == "tool_start":
                detail: tuple[Any, ...] = (json.loads(body.arguments_json or "null"),)
            elif kind == "tool_update":
                detail = (_texts(body.partial_result), body.checkpoint)
            else:
                detail = (_texts(body.result), body.is_error)
        elif kind == "entry_added" and event.entry_added.entry.message.message.HasField(
            "tool_result"
        ):
            placed = event.entry_added.entry.message.message.tool_result
            call_id = placed.tool_call_id
            detail = (_texts(placed), placed.is_error)
        else:
            continue
        group = group_end[event.revision]
        same = last_group.get(call_id) == group
        last_group[call_id] = group
        calls.setdefault(call_id, []).append((kind, same, *detail))
    return calls


def tool_sequence(events: Sequence[events_pb2.HarnessEvent]) -> list[tuple[str, str]]:
    """The tool events in log order: (kind, call id)."""
    out: list[tuple[str, str]] = []
    for event in events:
        kind = event.WhichOneof("kind")
        if kind in ("tool_start", "tool_update", "tool_end"):
            out.append((kind, getattr(event, kind).tool_call_id))
    return out


def check_expectations(
    case: dict[str, Any], calls: dict[str, list[tuple[Any, ...]]], who: str
) -> None:
    """The table's expectations of each call's placed result."""
    assert sorted(calls) == sorted(e["call"] for e in case["expect"]), (who, sorted(calls))
    for expected in case["expect"]:
        trace = calls[expected["call"]]
        kinds = [t[0] for t in trace]
        where = f"{who} {case['name']} {expected['call']}: {trace}"
        assert kinds[-1] == "entry_added" and kinds.count("entry_added") == 1, where
        end = next(t for t in trace if t[0] == "tool_end")
        texts, is_error = end[2], end[3]
        assert trace[-1][2:] == (texts, is_error), f"placed differs from staged: {where}"
        assert is_error == expected["is_error"], where
        joined = "\n".join(texts)
        if "text" in expected:
            assert joined == expected["text"], where
        else:
            assert joined.startswith(expected["text_prefix"]), where
        end_index = kinds.index("tool_end")
        synthetic = kinds[:end_index] == ["tool_start"] and trace[end_index][1]
        if expected["cause"] == "executed":
            assert not synthetic and kinds[0] == "tool_start", where
            assert "tool_update" in kinds, f"no progress: {where}"  # echo reports before its work
        else:
            assert synthetic, f"not staged as one synthetic commit: {where}"


def comparable(
    case: dict[str, Any], calls: dict[str, list[tuple[Any, ...]]]
) -> dict[str, list[tuple[Any, ...]]]:
    """``calls`` with the texts the table only fixes a prefix of (the validators' own wording:
    Ajv and jsonschema say the same thing differently) cut to that prefix."""
    prefixes = {e["call"]: e["text_prefix"] for e in case["expect"] if "text_prefix" in e}
    out: dict[str, list[tuple[Any, ...]]] = {}
    for call_id, trace in calls.items():
        prefix = prefixes.get(call_id)
        out[call_id] = [
            (kind, same, [t[: len(prefix)] for t in rest[0]], *rest[1:])
            if prefix is not None and kind in ("tool_end", "entry_added")
            else (kind, same, *rest)
            for kind, same, *rest in trace
        ]
    return out


#: Every case with the TypeScript driver's default (a DriveLane session per run), and one with
#: its commands as unary RPCs.
RUNS = [(case, "session") for case in CASES] + [(CASES[0], "unary")]


@pytest.mark.parametrize(
    ("case", "transport"), RUNS, ids=[f"{c['name']}-{transport}" for c, transport in RUNS]
)
async def test_python_and_typescript_drivers_agree(
    case: dict[str, Any],
    transport: str,
    lane_stub: Any,
    lane_server: RunningServer,
    session_database_url: str,
    tmp_path: Path,
) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    py_lane = new_lane_id(f"parity-py-{case['name']}")
    ts_lane = new_lane_id(f"parity-ts-{case['name']}")
    node = await start_node_driver(
        {
            "kind": "case",
            "target": target,
            "lane": ts_lane,
            "case": case,
            "session": transport == "session",
        },
        tmp_path / "node.log",
    )
    try:
        py_status = await run_python(target, py_lane, case, lane_stub)
        ts_result = await node.result()
    finally:
        node.kill()
    assert py_status == case["status"]
    assert ts_result["status"].lower() == case["status"], node.tail()
    calls = ts_result["calls"]
    # The client's first contact: one ListLanes of one lane (it fails fast when the service is
    # not there), before anything else.
    assert calls.pop("ListLanes") == 1, calls
    if transport == "session":
        # Every command on one DriveLane stream; the lane's watch is its own stream.
        assert calls["DriveLane"] == 1 and set(calls) <= {"DriveLane", "WatchLane"}, calls
    else:
        assert "DriveLane" not in calls and calls["StartRun"] == 1, calls

    async with await psycopg.AsyncConnection.connect(session_database_url, autocommit=True) as conn:
        py = await load(conn, py_lane)
        ts = await load(conn, ts_lane)
    py_calls = per_call(py.events, py.group_end)
    ts_calls = per_call(ts.events, ts.group_end)
    check_expectations(case, py_calls, "python")
    check_expectations(case, ts_calls, "typescript")
    assert comparable(case, ts_calls) == comparable(case, py_calls)

    def placed_order(events: Sequence[events_pb2.HarnessEvent]) -> list[str]:
        return [
            e.entry_added.entry.message.message.tool_result.tool_call_id
            for e in events
            if e.WhichOneof("kind") == "entry_added"
            and e.entry_added.entry.message.message.HasField("tool_result")
        ]

    source_order = [e["call"] for e in case["expect"]]
    assert placed_order(py.events) == placed_order(ts.events) == source_order
    if case["mode"] == "sequential":
        assert tool_sequence(ts.events) == tool_sequence(py.events)
    for events in (py.events, ts.events):
        ends = [call for kind, call in tool_sequence(events) if kind == "tool_end"]
        for earlier, later in case.get("staged_before", []):
            assert ends.index(earlier) < ends.index(later), ends
    kinds = sorted(e.WhichOneof("kind") or "" for e in ts.events)
    assert kinds == sorted(e.WhichOneof("kind") or "" for e in py.events)
