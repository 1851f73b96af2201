"""``LaneClient(..., session=True)`` against the real service: every method answers over the
DriveLane session as it does over unary RPCs, and a ``Driver`` takes a ``LaneClient``.

Two clients run the same lifecycle in lockstep, each on a lane of its own: one sends unary
RPCs, the other the same commands over its session. Each step's answer (or refusal) must be
the same once the lane id and the clock's readings are set aside.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from lane.client import (
    Driver,
    LaneClient,
    LaneError,
    OperationNotOpen,
    ScriptedCall,
    ScriptedModel,
    ScriptStep,
)
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.domain.leases import grants
from tests.support.driver_tools import returns, tool
from tests.support.lanes import assistant, new_lane_id, result, tool_call

pytestmark = pytest.mark.asyncio(loop_scope="session")

ABORTED = snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED
Step = Callable[[LaneClient, str], Awaitable[Any]]


def run(lane: str) -> str:
    """The lane's run: operation ids are unique across lanes."""
    return f"{lane}.run"


async def _listed(client: LaneClient, lane: str) -> pb.LaneSummary:
    """The lane's line in ListLanes, paging until it shows up."""
    token = ""
    while True:
        page = await client.list_lanes(page_size=1000, page_token=token)
        for summary in page.lanes:
            if summary.lane_id == lane:
                return summary
        assert page.next_page_token, f"{lane} is not listed"
        token = page.next_page_token


@dataclass(frozen=True)
class Row:
    """One step: what it sends, and the refusal it expects (None: an answer)."""

    name: str
    step: Step
    refused: type[LaneError] | None = None


# Every LaneClient method that sends a command (watch is its own stream either way).
TABLE = (
    Row("create_lane", lambda c, lane: c.create_lane(lane)),
    Row("enqueue", lambda c, lane: c.enqueue(lane, "later")),
    Row(
        "call",
        lambda c, lane: c.call(
            pb.UpdateLaneConfigRequest(
                lane_id=lane, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
            )
        ),
    ),
    Row(
        "start_run",
        lambda c, lane: c.start_run(
            lane, "go", operation_id=run(lane), driver_id="d-1", lease_seconds=60
        ),
    ),
    Row("start_turn", lambda c, lane: c.start_turn(lane, run(lane), turn_id="turn-1")),
    Row(
        "settle_assistant_message",
        lambda c, lane: c.settle_assistant_message(
            lane,
            run(lane),
            "turn-1",
            assistant(tool_call("c-1", "read", {}), tool_call("c-2", "x", {})),
        ),
    ),
    Row(
        "start_tool_call",
        lambda c, lane: c.start_tool_call(
            lane, run(lane), "c-1", "{}", replay=pb.REPLAY_POLICY_SAFE
        ),
    ),
    Row(
        "update_tool_call",
        lambda c, lane: c.update_tool_call(lane, run(lane), "c-1", result("half"), checkpoint=True),
    ),
    Row("get_operation", lambda c, lane: c.get_operation(lane, run(lane))),
    Row("renew_lease", lambda c, lane: c.renew_lease(lane, run(lane), lease_seconds=60)),
    Row("release_lease", lambda c, lane: c.release_lease(lane, run(lane))),
    Row("acquire_operation", lambda c, lane: c.acquire_operation(lane, run(lane), driver_id="d-2")),
    Row("replay_tool_call", lambda c, lane: c.replay_tool_call(lane, run(lane), "c-1")),
    Row(
        "stage_tool_outcome",
        lambda c, lane: c.stage_tool_outcome(
            lane, run(lane), "c-1", pb.ExecutedOutcome(result=result("read"))
        ),
    ),
    Row(
        "stage_tool_outcome refused",
        lambda c, lane: c.stage_tool_outcome(
            lane, run(lane), "c-1", pb.ExecutedOutcome(result=result("again"))
        ),
        LaneError,  # c-1 is completed: TOOL_CALL_WRONG_STATUS
    ),
    Row("abort", lambda c, lane: c.abort(lane, run(lane))),
    Row("end_run", lambda c, lane: c.end_run(lane, run(lane), ABORTED)),
    Row(
        "get_operation refused", lambda c, lane: c.get_operation(lane, run(lane)), OperationNotOpen
    ),
    Row("snapshot", lambda c, lane: c.snapshot(lane)),
    Row("list_lanes", _listed),
)


_GENERATED = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Normalizer:
    """Sets aside what differs between two lanes driven alike: the lane id, the clock's
    readings, the ids the service generates (UUIDs, named by order of first sight), the lane's
    incarnation, and lease tokens (by their count within the incarnation)."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.ids: dict[str, str] = {}

    def __call__(self, message: Message) -> Message:
        copy = type(message)()
        copy.CopyFrom(message)
        self._scrub(copy)
        return copy

    def _text(self, value: str) -> str:
        value = value.replace(self.lane, "LANE")
        return _GENERATED.sub(lambda m: self.ids.setdefault(m[0], f"ID{len(self.ids)}"), value)

    def _scrub(self, message: Message) -> None:
        for field, value in message.ListFields():
            kind = field.message_type
            if kind is not None and kind.full_name == Timestamp.DESCRIPTOR.full_name:
                message.ClearField(field.name)
            elif kind is not None and field.is_repeated:
                if kind.GetOptions().map_entry:
                    continue  # maps of scalars here: nothing generated in them
                for item in value:
                    self._scrub(item)
            elif kind is not None:
                self._scrub(value)
            elif field.name == "incarnation":
                setattr(message, field.name, "INCARNATION")
            elif field.name in ("token", "lease_token"):
                setattr(message, field.name, grants(value))
            elif field.type != field.TYPE_STRING:
                continue
            elif field.is_repeated:
                value[:] = [self._text(item) for item in value]
            else:
                setattr(message, field.name, self._text(value))


async def _outcome(row: Row, client: LaneClient, normal: Normalizer) -> object:
    """The step's answer, normalized, or its refusal as (class, code, reason)."""
    try:
        answer = await row.step(client, normal.lane)
    except LaneError as error:
        assert row.refused is not None, f"{row.name}: refused {error!r}"
        assert isinstance(error, row.refused), f"{row.name}: {error!r}"
        return (type(error), error.code, error.reason)
    assert row.refused is None, f"{row.name}: answered {answer}, expected a refusal"
    return normal(answer)


async def test_every_method_answers_over_the_session_as_over_unary_rpcs(
    lane_channel: grpc.aio.Channel,
) -> None:
    assert {row.name.split()[0] for row in TABLE} == {
        name
        for name in vars(LaneClient)
        if not name.startswith("_") and callable(vars(LaneClient)[name])
    } - {"aclose", "lease_token", "watch", "ready", "explained"}
    unary_lane = Normalizer(new_lane_id("unary"))
    session_lane = Normalizer(new_lane_id("session"))
    unary = LaneClient(channel=lane_channel)
    async with LaneClient(channel=lane_channel, session=True) as session:
        assert session.session is not None
        for row in TABLE:
            expected = await _outcome(row, unary, unary_lane)
            got = await _outcome(row, session, session_lane)
            assert got == expected, row.name
        # Every command went over the one stream, none as a unary RPC of its own.
        assert session.session.streams_opened == 1
    snapshot = await unary.snapshot(session_lane.lane)
    assert snapshot.last_result.status == ABORTED
    assert [e.message.message.WhichOneof("message") for e in snapshot.transcript] == [
        "user",
        "user",  # the queued follow-up, taken in by StartRun
        "assistant",
        "tool_result",
        "tool_result",
    ]


async def test_a_driver_takes_a_lane_client(lane_channel: grpc.aio.Channel) -> None:
    model = ScriptedModel(
        [ScriptStep("reading", calls=[ScriptedCall("read", {})]), ScriptStep("done")]
    )
    async with LaneClient(channel=lane_channel) as unary:
        lane = new_lane_id("driver-client")
        done = await Driver(unary, lane, [tool("read", returns("text"))]).run("go", model)
        assert done.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
        transcript = (await unary.snapshot(lane)).transcript
        assert transcript[-2].message.message.tool_result.content[0].text.text == "text"


async def test_a_driver_shares_its_clients_session(lane_channel: grpc.aio.Channel) -> None:
    model = ScriptedModel(
        [ScriptStep("reading", calls=[ScriptedCall("read", {})]), ScriptStep("done")]
    )
    async with LaneClient(channel=lane_channel, session=True) as client:
        assert client.session is not None
        lane = new_lane_id("driver-session")
        driver = Driver(client, lane, [tool("read", returns("text"))])
        assert driver.session is client.session
        done = await driver.run("go", model)
        assert done.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
        # The run's commands went over the client's stream, which the driver left open.
        assert client.session.streams_opened == 1
        assert (await client.snapshot(lane)).last_result.operation_id == done.operation_id
        assert client.session.streams_opened == 1
