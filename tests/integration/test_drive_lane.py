"""DriveLane sessions against the real service on a real PostgreSQL:

- one table of commands, sent as unary RPCs on one lane and through a LaneSession on another,
  gets the same answers, the same refusals (code, ErrorInfo reason, message, metadata) and the
  same events;
- pipelining: several lanes' commands in flight at once, answered out of order across lanes
  and in order within each;
- a stream cut mid-flight loses and doubles nothing: the session resends with request ids;
  a command without one fails UNAVAILABLE;
- the in-flight bound: past it the service stops reading the stream;
- malformed messages are answered under their sequence; the stream goes on;
- each command is counted under its own method; shutdown ends sessions promptly.

(Auth: tests/integration/test_auth.py sends DriveLane among every RPC: no token or an unknown
one ends the stream UNAUTHENTICATED; another namespace's lane answers LANE_NOT_FOUND.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from lane.client.driver import Driver
from lane.client.errors import LaneError, lane_error, status_error
from lane.client.model import ScriptedModel
from lane.client.session import LaneSession, SessionBroken
from lane.client.testing import LaneScript, RunScript
from lane.v1 import entries_pb2, events_pb2, lane_service_pb2_grpc, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.drive import MAX_COMMANDS_IN_FLIGHT
from lane.server.app.server import RunningServer
from lane.server.domain.leases import grants
from tests.driver.support import returns, step, tool
from tests.integration.lanes import (
    assistant,
    events_between,
    kinds,
    new_lane_id,
    result,
    text,
    tool_call,
    user,
)
from tests.support.servers import restartable

pytestmark = pytest.mark.asyncio(loop_scope="session")

SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
METHOD_OF = {m.input_type.full_name: m.name for m in SERVICE.methods}
DRIVE_PATH = f"/{SERVICE.full_name}/DriveLane"
STOP = messages_pb2.STOP_REASON_STOP
PENDING = messages_pb2.STOP_REASON_PENDING
Outcome = Message | LaneError


# -- the shared table ----------------------------------------------------------------------------


@dataclass
class Ctx:
    """The lane a table run drives, and the outcomes so far by case label."""

    lane: str
    got: dict[str, Any] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return f"{self.lane}-op1"

    @property
    def token(self) -> int:
        """The run's lease token: StartRun's, then AcquireOperation's once d2 acquired it."""
        for label, answer in (
            ("acquire", pb.AcquireOperationResponse),
            ("start", pb.StartRunResponse),
        ):
            got = self.got.get(label)
            if isinstance(got, answer):
                token: int = got.lease.token
                return token
        return 1


def _failed_response() -> messages_pb2.AssistantMessage:
    failed = assistant(text("overloaded"), stop=messages_pb2.STOP_REASON_ERROR)
    failed.error_message = "529 overloaded"
    return failed


def _run(c: Ctx, **fields: Any) -> dict[str, Any]:
    """The ids of a command of the table's run, with its lease token."""
    return {"lane_id": c.lane, "operation_id": c.op, "lease_token": c.token, **fields}


#: (label, request builder). Requests without a request id get ``<lane>-r<index>`` (both ways
#: alike); ids the service mints (entries, usage rows) come from earlier answers.
CASES: list[tuple[str, Callable[[Ctx], Message]]] = [
    ("create", lambda c: pb.CreateLaneRequest(lane_id=c.lane)),
    ("create replayed", lambda c: pb.CreateLaneRequest(lane_id=c.lane, request_id=f"{c.lane}-r0")),
    (
        "create reused id",
        lambda c: pb.CreateLaneRequest(
            lane_id=c.lane,
            request_id=f"{c.lane}-r0",
            configuration=snapshot_pb2.LaneConfiguration(active_tool_names=["t"]),
        ),
    ),
    (
        "config",
        lambda c: pb.UpdateLaneConfigRequest(
            lane_id=c.lane, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
        ),
    ),
    (
        "enqueue",
        lambda c: pb.EnqueueMessageRequest(
            lane_id=c.lane, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("later")
        ),
    ),
    ("enqueue without kind", lambda c: pb.EnqueueMessageRequest(lane_id=c.lane)),
    ("snapshot", lambda c: pb.GetLaneSnapshotRequest(lane_id=c.lane)),
    ("list with a bad token", lambda c: pb.ListLanesRequest(page_token="abc")),
    ("list too many", lambda c: pb.ListLanesRequest(page_size=5000)),
    ("turn before the run", lambda c: pb.StartTurnRequest(lane_id=c.lane, operation_id=c.op)),
    (
        "missing lane",
        lambda c: pb.StartRunRequest(lane_id=f"{c.lane}-missing", prompt=[user("x")]),
    ),
    (
        "padded id",
        lambda c: pb.StartRunRequest(lane_id=c.lane, operation_id=" op ", prompt=[user("x")]),
    ),
    (
        "start",
        lambda c: pb.StartRunRequest(
            lane_id=c.lane,
            operation_id=c.op,
            prompt=[user("go")],
            driver_id="d1",
            lease_seconds=300,
        ),
    ),
    (
        "busy",
        lambda c: pb.StartRunRequest(
            lane_id=c.lane, operation_id=f"{c.lane}-op2", prompt=[user("again")]
        ),
    ),
    ("stale lease", lambda c: pb.StartTurnRequest(**_run(c, lease_token=99))),
    ("turn", lambda c: pb.StartTurnRequest(**_run(c, turn_id=f"{c.lane}-t1"))),
    (
        "stream",
        lambda c: pb.AppendAssistantStreamRequest(
            **_run(c, turn_id=f"{c.lane}-t1"),
            partials=[pb.StreamedPartial(message=assistant(text("par"), stop=PENDING))],
        ),
    ),
    (
        "too many tool calls",
        lambda c: pb.SettleAssistantMessageRequest(
            **_run(c, turn_id=f"{c.lane}-t1"),
            message=assistant(*(tool_call(f"x{i}", "t", {}) for i in range(257))),
        ),
    ),
    (
        "settle",
        lambda c: pb.SettleAssistantMessageRequest(
            **_run(c, turn_id=f"{c.lane}-t1"),
            message=assistant(
                text("tools"), tool_call("c1", "t", {"a": 1}), tool_call("c2", "t", {"a": 2})
            ),
        ),
    ),
    (
        "usage",
        lambda c: pb.RecordUsageRequest(
            lane_id=c.lane,
            usage=messages_pb2.Usage(input=3, output=4, total_tokens=7),
            entry_id=c.got["settle"].entry_id,
        ),
    ),
    (
        "bad arguments",
        lambda c: pb.StartToolCallRequest(**_run(c, tool_call_id="c1"), arguments_json="{nope"),
    ),
    (
        "start c1",
        lambda c: pb.StartToolCallRequest(
            **_run(c, tool_call_id="c1"),
            arguments_json='{"a": 1}',
            replay=pb.REPLAY_POLICY_SAFE,
        ),
    ),
    (
        "progress c1",
        lambda c: pb.UpdateToolCallRequest(
            **_run(c, tool_call_id="c1"), partial_result=result("half")
        ),
    ),
    (
        "checkpoint c1",
        lambda c: pb.UpdateToolCallRequest(
            **_run(c, tool_call_id="c1"), partial_result=result("most"), checkpoint=True
        ),
    ),
    (
        "stage c2 executed without intent",
        lambda c: pb.StageToolOutcomeRequest(
            **_run(c, tool_call_id="c2"), executed=pb.ExecutedOutcome(result=result("two"))
        ),
    ),
    (
        "stage c2",
        lambda c: pb.StageToolOutcomeRequest(
            **_run(c, tool_call_id="c2"),
            synthetic=pb.SyntheticOutcome(cause=pb.SYNTHETIC_CAUSE_DENIED, message="no"),
        ),
    ),
    (
        "stage c1",
        lambda c: pb.StageToolOutcomeRequest(
            **_run(c, tool_call_id="c1"), executed=pb.ExecutedOutcome(result=result("one"))
        ),
    ),
    (
        "stage c1 again",
        lambda c: pb.StageToolOutcomeRequest(
            **_run(c, tool_call_id="c1"), executed=pb.ExecutedOutcome(result=result("one"))
        ),
    ),
    ("operation", lambda c: pb.GetOperationRequest(lane_id=c.lane, operation_id=c.op)),
    ("renew", lambda c: pb.RenewLeaseRequest(**_run(c, lease_seconds=300))),
    (
        "acquire a held lease",
        lambda c: pb.AcquireOperationRequest(lane_id=c.lane, operation_id=c.op, driver_id="d2"),
    ),
    ("release", lambda c: pb.ReleaseLeaseRequest(**_run(c))),
    ("stale after the release", lambda c: pb.StartTurnRequest(**_run(c))),
    (
        "acquire",
        lambda c: pb.AcquireOperationRequest(
            lane_id=c.lane, operation_id=c.op, driver_id="d2", lease_seconds=300
        ),
    ),
    ("turn 2", lambda c: pb.StartTurnRequest(**_run(c, turn_id=f"{c.lane}-t2"))),
    (
        "schedule retry",
        lambda c: pb.ScheduleRetryRequest(
            **_run(c, turn_id=f"{c.lane}-t2"),
            failed_message=_failed_response(),
            max_attempts=3,
            delay_ms=10,
            error_message="529 overloaded",
        ),
    ),
    ("start retry", lambda c: pb.StartRetryRequest(**_run(c, turn_id=f"{c.lane}-t2"))),
    (
        "suspend",
        lambda c: pb.SuspendRunRequest(
            **_run(c, turn_id=f"{c.lane}-t2"),
            deferred=snapshot_pb2.DeferredState(handle_json='{"h": 1}'),
        ),
    ),
    ("resume", lambda c: pb.ResumeRunRequest(**_run(c))),
    (
        "settle 2",
        lambda c: pb.SettleAssistantMessageRequest(
            **_run(c, turn_id=f"{c.lane}-t2"), message=assistant(text("done"), stop=STOP)
        ),
    ),
    (
        "compact",
        lambda c: pb.CompactRunRequest(
            **_run(c), entry=entries_pb2.CompactionEntry(summary="s", tokens_before=10)
        ),
    ),
    ("replay c1", lambda c: pb.ReplayToolCallRequest(**_run(c, tool_call_id="c1"))),
    ("abort", lambda c: pb.AbortOperationRequest(lane_id=c.lane, operation_id=c.op)),
    (
        "turn after the abort",
        lambda c: pb.StartTurnRequest(**_run(c, turn_id=f"{c.lane}-t3")),
    ),
    (
        "end",
        lambda c: pb.EndRunRequest(
            lane_id=c.lane,
            operation_id=c.op,
            status=snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            lease_token=c.token,
        ),
    ),
    ("release after the end", lambda c: pb.ReleaseLeaseRequest(**_run(c))),
    (
        "compaction",
        lambda c: pb.StartCompactionRequest(
            lane_id=c.lane,
            operation_id=f"{c.lane}-op3",
            reason=events_pb2.COMPACTION_REASON_MANUAL,
        ),
    ),
    (
        "end compaction",
        lambda c: pb.EndCompactionRequest(
            lane_id=c.lane,
            operation_id=f"{c.lane}-op3",
            status=snapshot_pb2.OPERATION_RESULT_STATUS_DECLINED,
        ),
    ),
    (
        "navigate",
        lambda c: pb.NavigateLaneRequest(
            lane_id=c.lane,
            target_entry_id=c.got["settle"].entry_id,
            summary=entries_pb2.BranchSummaryEntry(summary="left"),
        ),
    ),
    (
        "navigate nowhere",
        lambda c: pb.NavigateLaneRequest(lane_id=c.lane, target_entry_id="nope"),
    ),
    ("fault", lambda c: pb.ReportFaultRequest(lane_id=c.lane, code="X", message="m")),
    (
        "handler error",
        lambda c: pb.ReportHandlerErrorRequest(lane_id=c.lane, error="boom", hook="before_tool"),
    ),
    (
        "name",
        lambda c: pb.SetLaneValueRequest(
            lane_id=c.lane, session_name=events_pb2.SessionNameValue(name="n")
        ),
    ),
    ("create a second lane", lambda c: pb.CreateLaneRequest(lane_id=f"{c.lane}-x")),
    ("delete the second lane", lambda c: pb.DeleteLaneRequest(lane_id=f"{c.lane}-x")),
    ("delete it again", lambda c: pb.DeleteLaneRequest(lane_id=f"{c.lane}-x")),
    ("snapshot at the end", lambda c: pb.GetLaneSnapshotRequest(lane_id=c.lane)),
    ("read the log", lambda c: pb.ReadLaneEventsRequest(lane_id=c.lane, page_size=5)),
    (
        "read past the head",
        lambda c: pb.ReadLaneEventsRequest(lane_id=c.lane, after_revision=10_000),
    ),
]

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ][0-9:.]+(Z|\+00:00)")
_TOKEN = re.compile(r"lease token (\d+)")


class Normalized:
    """Outcomes and events with what differs between two lanes by construction replaced: the
    lane id, ids the service minted (numbered in order of appearance), times, the lane's
    incarnation, and lease tokens (by their count within the incarnation)."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.ids: dict[str, str] = {}

    def text(self, value: str) -> str:
        value = value.replace(self.lane, "<lane>")
        value = _UUID.sub(lambda m: self.ids.setdefault(m.group(0), f"<id{len(self.ids)}>"), value)
        value = _TOKEN.sub(lambda m: f"lease token {grants(int(m[1]))}", value)
        return _TIME.sub("<time>", value)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {key: self.field(key, item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.value(item) for item in value]
        return value

    def field(self, key: str, value: Any) -> Any:
        """A message field's value (protobuf JSON: int64 as text), normalized."""
        if key == "incarnation":
            return "<incarnation>"
        if key in ("token", "leaseToken"):
            return str(grants(int(value)))
        return self.value(value)

    def outcome(self, outcome: Outcome) -> Any:
        if isinstance(outcome, LaneError):
            metadata = {key: self.field(key, item) for key, item in outcome.metadata.items()}
            return (
                "refused",
                outcome.code.name,
                outcome.reason,
                self.text(outcome.message),
                metadata,
            )
        return (outcome.DESCRIPTOR.name, self.value(json_format.MessageToDict(outcome)))


async def run_table(
    stub: Any, lane: str, send: Callable[[Message], Any]
) -> tuple[list[Any], list[Any]]:
    """Every case of :data:`CASES` on ``lane`` through ``send``: the normalized outcomes and
    the lane's normalized events."""
    ctx = Ctx(lane)
    outcomes: list[Outcome] = []
    for index, (label, build) in enumerate(CASES):
        request = build(ctx)
        fields = request.DESCRIPTOR.fields_by_name
        if "request_id" in fields and not getattr(request, "request_id"):  # noqa: B009
            setattr(request, "request_id", f"{lane}-r{index}")  # noqa: B010
        try:
            outcome: Outcome = await send(request)
        except LaneError as error:
            outcome = error
        ctx.got[label] = outcome
        outcomes.append(outcome)
    head = (await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))).snapshot.revision
    events = await events_between(stub, lane, 0, head)
    normalized = Normalized(lane)
    return (
        [(label, normalized.outcome(o)) for (label, _), o in zip(CASES, outcomes, strict=True)],
        [normalized.value(json_format.MessageToDict(e)) for e in events],
    )


async def test_the_table_answers_alike_unary_and_in_a_session(lane_stub) -> None:
    async def unary(request: Message) -> Any:
        rpc = getattr(lane_stub, METHOD_OF[request.DESCRIPTOR.full_name])
        try:
            return await rpc(request, timeout=30)
        except grpc.aio.AioRpcError as err:
            raise lane_error(err) from err

    unary_lane, session_lane = new_lane_id("table-u"), new_lane_id("table-s")
    by_unary, unary_events = await run_table(lane_stub, unary_lane, unary)
    async with LaneSession(lane_stub) as session:
        by_session, session_events = await run_table(lane_stub, session_lane, session.call)
        assert session.streams_opened == 1

    for (label, expected), (_, got) in zip(by_unary, by_session, strict=True):
        assert got == expected, label
    assert session_events == unary_events
    # The table means something: most commands were accepted, each refusal kind is there.
    accepted = [label for label, outcome in by_unary if outcome[0] != "refused"]
    refused = {outcome[2] for _, outcome in by_unary if outcome[0] == "refused"}
    assert len(accepted) >= 35, [(label, o[2], o[3]) for label, o in by_unary if o[0] == "refused"]
    assert {
        "REQUEST_ID_REUSED",
        "MISSING_FIELD",
        "INVALID_PAGE_TOKEN",
        "INVALID_PAGE_SIZE",
        "OPERATION_NOT_OPEN",
        "LANE_NOT_FOUND",
        "INVALID_ID",
        "LANE_BUSY",
        "STALE_LEASE",
        "TOO_MANY_TOOL_CALLS",
        "INVALID_JSON",
        "TOOL_CALL_WRONG_STATUS",
        "LEASE_HELD",
        "OPERATION_CANCELLED",
        "ENTRY_NOT_FOUND",
    } <= refused
    sent = {
        METHOD_OF[
            build(Ctx("l", {"settle": pb.SettleAssistantMessageResponse()})).DESCRIPTOR.full_name
        ]
        for _, build in CASES
    }
    assert sent == {
        m.name for m in SERVICE.methods if not m.client_streaming and not m.server_streaming
    }
    assert len(unary_events) > 40


async def test_every_command_of_the_stream_is_a_unary_method_and_answered_in_kind() -> None:
    def name(message_type: Any) -> str:
        assert message_type is not None
        full_name: str = message_type.full_name
        return full_name

    commands = pb.DriveLaneRequest.DESCRIPTOR.oneofs_by_name["command"].fields
    answers = {f.name: f for f in pb.DriveLaneResponse.DESCRIPTOR.oneofs_by_name["answer"].fields}
    unary = {
        m.name: m for m in SERVICE.methods if not m.client_streaming and not m.server_streaming
    }
    assert {METHOD_OF[name(f.message_type)] for f in commands} == set(unary)
    for command in commands:
        method = unary[METHOD_OF[name(command.message_type)]]
        answer = answers[command.name]
        assert answer.number == command.number
        assert name(answer.message_type) == name(method.output_type)
    assert name(answers["error"].message_type) == "google.rpc.Status"


# -- helpers: raw streams, a lane's row lock ----------------------------------------------------


def raw_drive(channel: grpc.aio.Channel) -> Any:
    """A DriveLane call taking encoded requests (bytes), answering decoded responses."""
    return channel.stream_stream(
        DRIVE_PATH,
        request_serializer=None,
        response_deserializer=pb.DriveLaneResponse.FromString,
    )()


@contextlib.asynccontextmanager
async def row_locked(database_url: str, lane: str) -> AsyncIterator[None]:
    """Hold ``lane``'s row lock: every command on it waits in PostgreSQL until the block ends."""
    async with (
        await psycopg.AsyncConnection.connect(database_url) as holder,
        holder.transaction(),
    ):
        await holder.execute("SELECT 1 FROM lanes WHERE lane_id = %s FOR UPDATE", (lane,))
        yield


async def waiting_on_locks(database_url: str, count: int) -> None:
    """Wait until at least ``count`` backends wait for a lock in the database."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as observer:
        for _ in range(400):
            cur = await observer.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            if row is not None and row[0] >= count:
                return
            await asyncio.sleep(0.025)
    raise AssertionError(f"{count} commands never waited for the row lock")


async def revision(stub: Any, lane: str) -> int:
    answer = await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane))
    value: int = answer.snapshot.revision
    return value


async def created(stub: Any, *lanes: str) -> None:
    for lane in lanes:
        await stub.CreateLane(pb.CreateLaneRequest(lane_id=lane))


async def leased(stub: Any, lane: str) -> RunScript:
    """A run on ``lane``, leased to d1 for longer than any test takes."""
    return await LaneScript(stub, lane).start_run("go", driver_id="d1", lease_seconds=300)


async def check_held_commands_committed_once(
    stub: Any, run: RunScript, other: str, answers: list[Any]
) -> None:
    """After a cut stream: the held lane's three usage commands (1, 2, 3) committed once each,
    in order, after ``run`` started; ``other`` holds its three; a unary retry of the first gets
    the stored answer."""
    held, before = run.lane.lane_id, run.started.revision
    assert [a.revision for a in answers] == [before + n for n in (1, 2, 3)]
    events = await events_between(stub, held, before, before + 3)
    assert kinds(events) == ["usage"] * 3
    assert [e.usage.row.usage.input for e in events] == [1, 2, 3]
    assert await revision(stub, held) == before + 3  # nothing twice
    assert await revision(stub, other) == 4
    # A unary retry of one of them returns the same answer: it was stored under its id.
    assert await stub.RecordUsage(usage(held, 1)) == answers[0]


def usage(lane: str, n: int, request_id: str = "") -> pb.RecordUsageRequest:
    return pb.RecordUsageRequest(
        lane_id=lane,
        usage=messages_pb2.Usage(input=n, total_tokens=n),
        request_id=request_id or f"{lane}-u{n}",
    )


# -- pipelining ---------------------------------------------------------------------------------


async def test_lanes_are_pipelined_and_each_lane_keeps_its_order(
    lane_stub, lane_channel, session_database_url: str
) -> None:
    held, free = new_lane_id("held"), new_lane_id("free")
    await created(lane_stub, held, free)
    call = raw_drive(lane_channel)
    answers: list[pb.DriveLaneResponse] = []
    try:
        async with row_locked(session_database_url, held):
            # Three commands of the held lane first, then three of the free one.
            for n in (1, 2, 3):
                await call.write(
                    pb.DriveLaneRequest(sequence=n, record_usage=usage(held, n)).SerializeToString()
                )
            for n in (1, 2, 3):
                await call.write(
                    pb.DriveLaneRequest(
                        sequence=10 + n, record_usage=usage(free, n)
                    ).SerializeToString()
                )
            # The free lane is answered while the held one's first command waits in
            # PostgreSQL: both lanes were in flight at once.
            for _ in range(3):
                answers.append(await asyncio.wait_for(call.read(), 10))
            assert [a.sequence for a in answers] == [11, 12, 13]
            await waiting_on_locks(session_database_url, 1)
        for _ in range(3):
            answers.append(await asyncio.wait_for(call.read(), 10))
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    finally:
        call.cancel()
    # Out of order across lanes (sent 1,2,3,11,12,13), in order within each.
    assert [a.sequence for a in answers] == [11, 12, 13, 1, 2, 3]
    for lane, first in ((free, 0), (held, 3)):
        revisions = [a.record_usage.revision for a in answers[first : first + 3]]
        assert revisions == [2, 3, 4], lane
        events = await events_between(lane_stub, lane, 1, 4)
        assert [e.usage.row.usage.input for e in events] == [1, 2, 3]


async def test_a_session_pipelines_many_commands_at_once(lane_stub) -> None:
    lanes = [new_lane_id(f"pipe{i}") for i in range(8)]
    async with LaneSession(lane_stub) as session:
        await asyncio.gather(*(session.call(pb.CreateLaneRequest(lane_id=lane)) for lane in lanes))
        # 8 lanes x 20 commands, all submitted before any is answered.
        calls = [session.call(usage(lane, n)) for n in range(1, 21) for lane in lanes]
        answers = await asyncio.gather(*calls)
        assert session.streams_opened == 1
    for index, lane in enumerate(lanes):
        revisions = [a.revision for a in answers[index :: len(lanes)]]
        assert revisions == list(range(2, 22)), lane  # one lane's commands in the order sent


# -- a broken stream ----------------------------------------------------------------------------


class CuttableProxy:
    """A TCP proxy to the service whose connections :meth:`cut` drops at once."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listen_port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writers |= {writer, up_writer}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            with contextlib.suppress(Exception):
                sink.close()

        for task in (pump(reader, up_writer), pump(up_reader, writer)):
            running = asyncio.create_task(task)
            self._tasks.add(running)
            running.add_done_callback(self._tasks.discard)

    def cut(self) -> None:
        for writer in self._writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def test_a_stream_cut_mid_flight_loses_and_doubles_nothing(
    lane_stub, lane_server: RunningServer, session_database_url: str
) -> None:
    proxy = CuttableProxy(lane_server.port)
    await proxy.start()
    held, other = new_lane_id("cut-held"), new_lane_id("cut-other")
    await created(lane_stub, held, other)
    run = await leased(lane_stub, held)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{proxy.listen_port}")
    session = LaneSession(lane_service_pb2_grpc.LaneServiceStub(channel))
    try:
        await session.call(pb.GetLaneSnapshotRequest(lane_id=other))  # the stream is up
        async with row_locked(session_database_url, held):
            # The held lane's commands wait in PostgreSQL (the first holds its connection);
            # the other lane's are answered.
            held_calls = [asyncio.ensure_future(session.call(usage(held, n))) for n in (1, 2, 3)]
            renew = asyncio.ensure_future(session.call(run.aim.request(pb.RenewLeaseRequest)))
            for n in (1, 2):
                await session.call(usage(other, n))
            await waiting_on_locks(session_database_url, 1)
            proxy.cut()  # the stream breaks; the first held command is still in its transaction
            # RenewLease has no request id: it is not sent again blindly.
            with pytest.raises(SessionBroken) as broken:
                await asyncio.wait_for(renew, 10)
            assert broken.value.code == grpc.StatusCode.UNAVAILABLE
            # A command sent while the session reconnects goes out on the new stream.
            late = asyncio.ensure_future(session.call(usage(other, 3)))
            assert (await asyncio.wait_for(late, 10)).revision == 4
        # The lock is gone: the first transaction commits (its caller is gone), and the resent
        # commands get their answers: the stored one for the command that had committed.
        answers = await asyncio.wait_for(asyncio.gather(*held_calls), 20)
        assert session.streams_opened == 2
    finally:
        await session.aclose()
        await channel.close()
        await proxy.stop()
    await check_held_commands_committed_once(lane_stub, run, other, list(answers))


async def test_a_session_rides_out_a_service_restart(fresh_database_url: str) -> None:
    lane = new_lane_id("restart")
    async with (
        restartable(fresh_database_url) as service,
        LaneSession(service.stub, retry_seconds=30) as session,
    ):
        await session.call(pb.CreateLaneRequest(lane_id=lane))
        await session.call(usage(lane, 1))
        stopping = time.monotonic()
        await service.stop(grace=5.0)
        # The session ended promptly (UNAVAILABLE SERVER_SHUTTING_DOWN), not after the grace.
        assert time.monotonic() - stopping < 4.0
        pending = asyncio.ensure_future(session.call(usage(lane, 2)))
        await asyncio.sleep(0.3)
        await service.restart()
        assert (await asyncio.wait_for(pending, 30)).revision == 3
        assert session.streams_opened >= 2


# -- the in-flight bound --------------------------------------------------------------------------


async def test_past_the_bound_the_service_stops_reading(
    lane_stub, lane_channel, session_database_url: str
) -> None:
    held, free = new_lane_id("bound-held"), new_lane_id("bound-free")
    await created(lane_stub, held, free)
    call = raw_drive(lane_channel)
    try:
        async with row_locked(session_database_url, held):
            # As many commands as may be in flight, all stuck behind the held lane's lock ...
            for n in range(1, MAX_COMMANDS_IN_FLIGHT + 1):
                request = pb.DriveLaneRequest(sequence=n, record_usage=usage(held, n))
                await call.write(request.SerializeToString())
            # ... then one for a free lane: it is not even read while every slot is taken.
            last = MAX_COMMANDS_IN_FLIGHT + 1
            request = pb.DriveLaneRequest(sequence=last, record_usage=usage(free, 1))
            await call.write(request.SerializeToString())
            await waiting_on_locks(session_database_url, 1)
            await asyncio.sleep(1.0)
            assert await revision(lane_stub, free) == 1  # not started
        # The lock is gone: slots free up as answers are sent, and the last command is read.
        answers = [await asyncio.wait_for(call.read(), 20) for _ in range(last)]
    finally:
        call.cancel()
    assert sorted(a.sequence for a in answers) == list(range(1, last + 1))
    assert await revision(lane_stub, free) == 2


async def test_a_client_that_does_not_read_answers_stops_the_reading(
    lane_stub, lane_channel
) -> None:
    big, free = new_lane_id("bound-big"), new_lane_id("bound-unread")
    await created(lane_stub, big, free)
    for part in "ab":  # an inbox of about 1 MB: the snapshot carries it
        await LaneScript(lane_stub, big).enqueue(part * 500_000, snapshot_pb2.QUEUE_KIND_FOLLOW_UP)
    sent = 3 * MAX_COMMANDS_IN_FLIGHT
    call = raw_drive(lane_channel)
    try:
        # Snapshots of ~1 MB each, never read: once the connection's buffers are full the
        # answers wait to be written, their slots stay taken, and the service stops reading:
        # the command sent after them is never read, let alone started.
        read = pb.DriveLaneRequest(get_lane_snapshot=pb.GetLaneSnapshotRequest(lane_id=big))
        for n in range(1, sent + 1):
            read.sequence = n
            await call.write(read.SerializeToString())
        write = pb.DriveLaneRequest(sequence=sent + 1, record_usage=usage(free, 1))
        await asyncio.wait_for(call.write(write.SerializeToString()), 10)
        await asyncio.sleep(1.5)
        assert await revision(lane_stub, free) == 1  # not read, so not started
        # Reading the answers frees the slots: everything is read and answered.
        answers = [await asyncio.wait_for(call.read(), 20) for _ in range(sent + 1)]
    finally:
        call.cancel()
    assert sorted(a.sequence for a in answers) == list(range(1, sent + 2))
    assert await revision(lane_stub, free) == 2


# -- malformed messages, metrics, the driver -----------------------------------------------------


async def test_a_malformed_message_is_answered_under_its_sequence(lane_stub, lane_channel) -> None:
    lane = new_lane_id("malformed")
    call = raw_drive(lane_channel)
    try:
        # Sequence 5, then create_lane (field 3) holding three bytes that are no message.
        await call.write(b"\x08\x05\x1a\x03abc")
        await call.write(pb.DriveLaneRequest(sequence=6).SerializeToString())
        await call.write(b"\xff\xff\xff")
        good = pb.DriveLaneRequest(sequence=8, create_lane=pb.CreateLaneRequest(lane_id=lane))
        await call.write(good.SerializeToString())
        answers = {}
        for _ in range(4):
            answer = await asyncio.wait_for(call.read(), 10)
            answers[answer.sequence] = answer
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK  # the stream went on
    finally:
        call.cancel()
    malformed = status_error(answers[5].error)
    assert (malformed.code, malformed.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "MALFORMED_REQUEST",
    )
    empty = status_error(answers[6].error)
    assert (empty.code, empty.reason, empty.metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "MISSING_FIELD",
        {"field": "command"},
    )
    assert status_error(answers[0].error).reason == "MALFORMED_REQUEST"  # no sequence found
    assert answers[8].create_lane.created


async def test_each_command_is_counted_under_its_own_method(
    lane_stub, lane_server: RunningServer
) -> None:
    def count(method: str, code: str) -> float:
        value = lane_server.registry.get_sample_value(
            "lane_commands_total", {"method": method, "code": code}
        )
        return value or 0.0

    before = {
        key: count(*key)
        for key in (("CreateLane", "OK"), ("StartTurn", "FAILED_PRECONDITION"), ("DriveLane", "OK"))
    }
    lane = new_lane_id("counted")
    async with LaneSession(lane_stub) as session:
        await session.call(pb.CreateLaneRequest(lane_id=lane))
        await session.call(pb.CreateLaneRequest(lane_id=lane))
        with pytest.raises(LaneError) as refused:
            await session.call(pb.StartTurnRequest(lane_id=lane, operation_id="nope"))
    assert refused.value.reason == "OPERATION_NOT_OPEN"
    assert count("CreateLane", "OK") - before[("CreateLane", "OK")] == 2
    assert (
        count("StartTurn", "FAILED_PRECONDITION") - before[("StartTurn", "FAILED_PRECONDITION")]
        == 1
    )
    assert count("DriveLane", "OK") == before[("DriveLane", "OK")]  # the stream is no command


async def test_the_driver_runs_over_one_session(lane_stub) -> None:
    lane = new_lane_id("drv-session")
    model = ScriptedModel([step("one call", ("echo", {})), step("done")])
    async with LaneSession(lane_stub) as session:
        driver = Driver(lane_stub, lane, [tool("echo", returns("hi"))], session=session)
        outcome = await driver.run("go", model)
        assert session.streams_opened == 1
    assert outcome.status_name == "completed"


async def test_a_request_too_large_for_the_stream_goes_unary(lane_stub) -> None:
    lane = new_lane_id("too-large")
    huge = pb.EnqueueMessageRequest(
        lane_id=lane, kind=snapshot_pb2.QUEUE_KIND_FOLLOW_UP, message=user("x" * (4 * 1024 * 1024))
    )
    async with LaneSession(lane_stub) as session:
        await session.call(pb.CreateLaneRequest(lane_id=lane))
        with pytest.raises(LaneError) as refused:
            await session.call(huge)
        # gRPC's own refusal of the unary call, as without a session; the stream is unharmed.
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await session.call(pb.GetLaneSnapshotRequest(lane_id=lane))).snapshot.revision == 1
        assert session.streams_opened == 1
