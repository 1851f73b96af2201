"""Lane-level RPCs and the run lifecycle through the real service (lane_service.proto), with
fold == capture checked after every command."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from lane.client.testing import LaneScript, RunScript
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.integration.lanes import Probe, kinds, new_lane_id, user

pytestmark = pytest.mark.asyncio(loop_scope="session")

Q = snapshot_pb2.QueueKind
STOP = messages_pb2.STOP_REASON_STOP
ALL = pb.DELIVERY_MODE_ALL
ONE = pb.DELIVERY_MODE_ONE_AT_A_TIME


def configuration(
    model: str = "m1",
    level: int = snapshot_pb2.THINKING_LEVEL_LOW,
    tools: tuple[str, ...] = ("read",),
) -> snapshot_pb2.LaneConfiguration:
    return snapshot_pb2.LaneConfiguration(
        model=snapshot_pb2.ModelRef(provider="prov", model_id=model),
        thinking_level=level,  # type: ignore[arg-type]
        active_tool_names=tools,
    )


async def created_lane(stub: Any, prefix: str = "rpcs", **config: Any) -> Probe:
    probe = Probe(stub, new_lane_id(prefix))
    await LaneScript.create(stub, probe.lane_id, configuration=configuration(**config))
    await probe.start()
    return probe


def only(events: list[events_pb2.HarnessEvent], kind: str) -> Any:
    """The one event of ``kind``, as its payload."""
    found = [e for e in events if e.WhichOneof("kind") == kind]
    assert len(found) == 1, f"{len(found)} {kind} events in {kinds(events)}"
    return getattr(found[0], kind)


# -- CreateLane ---------------------------------------------------------------------------------


async def test_create_lane_is_get_or_create(lane_stub) -> None:
    lane_id = new_lane_id("create")
    first = await lane_stub.CreateLane(
        pb.CreateLaneRequest(lane_id=lane_id, configuration=configuration("first"))
    )
    assert first.created and first.revision == 1
    probe = Probe(lane_stub, lane_id)
    snapshot = await probe.start()
    assert snapshot.lane_id == lane_id and snapshot.revision == 1
    assert snapshot.configuration == configuration("first")
    assert not snapshot.transcript and not snapshot.tip_id and not snapshot.HasField("operation")
    second = await lane_stub.CreateLane(
        pb.CreateLaneRequest(
            lane_id=lane_id,
            configuration=configuration("second", snapshot_pb2.THINKING_LEVEL_HIGH, ("x",)),
        )
    )
    assert not second.created and second.revision == 1
    assert await probe.check() == []  # no second lane_created, nothing at all
    assert probe.snapshot.configuration == configuration("first")  # the first call's
    watch = lane_stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id, after_revision=0))
    try:
        first_group = await watch.read()
    finally:
        watch.cancel()
    assert kinds(first_group.event_group.events) == ["lane_created"]


async def test_create_lane_again_after_commands_returns_the_current_revision(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    await lane_stub.RecordUsage(
        pb.RecordUsageRequest(lane_id=probe.lane_id, usage=messages_pb2.Usage(input=1))
    )
    again = await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=probe.lane_id))
    assert not again.created and again.revision == 2
    assert kinds(await probe.check()) == ["usage"]


# -- ListLanes ----------------------------------------------------------------------------------


async def list_all(stub: Any, page_size: int) -> list[list[pb.LaneSummary]]:
    pages: list[list[pb.LaneSummary]] = []
    token = ""
    while True:
        page = await stub.ListLanes(pb.ListLanesRequest(page_size=page_size, page_token=token))
        pages.append(list(page.lanes))
        token = page.next_page_token
        if not token:
            return pages
        assert len(pages) < 10_000, "pagination does not end"


async def test_list_lanes_pages_through_every_lane_in_id_order(lane_stub) -> None:
    prefix = f"list-{uuid.uuid4().hex[:8]}-"
    # Suffixes whose code-point order differs from case-insensitive / punctuation-blind order.
    suffixes = ["b", "B", "_u", "-h", "a z", "Az", "0"]
    mine = [prefix + s for s in suffixes]
    for lane_id in mine:
        await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=lane_id))
    pages = await list_all(lane_stub, 3)
    assert all(len(page) == 3 for page in pages[:-1]), [len(p) for p in pages]
    assert 1 <= len(pages[-1]) <= 3 or pages == [[]]
    ids = [lane.lane_id for page in pages for lane in page]
    assert len(ids) == len(set(ids)), "a lane was listed twice"
    assert ids == sorted(ids), "lanes are not in id (code point) order"
    assert [i for i in ids if i.startswith(prefix)] == sorted(mine)
    # One big page lists the same lanes.
    everything = [lane.lane_id for page in await list_all(lane_stub, 1000) for lane in page]
    assert everything == ids


async def test_list_lanes_exact_multiple_has_no_empty_last_page(lane_stub) -> None:
    pages = await list_all(lane_stub, 1000)
    total = sum(len(p) for p in pages)
    # With page_size = the number of lanes, one page and no token.
    if total <= 1000:
        page = await lane_stub.ListLanes(pb.ListLanesRequest(page_size=total))
        assert len(page.lanes) == total and page.next_page_token == ""


async def test_list_lanes_summarizes_operations(lane_stub) -> None:
    probe = await created_lane(lane_stub, prefix="summary")
    lane = probe.lane_id

    async def summary() -> pb.LaneSummary:
        for page in await list_all(lane_stub, 1000):
            for found in page:
                if found.lane_id == lane:
                    return found
        raise AssertionError(f"{lane} not listed")

    idle = await summary()
    assert idle.revision == 1 and idle.tip_id == "" and idle.operation_id == ""
    assert idle.operation_status == snapshot_pb2.OPERATION_STATUS_UNSPECIFIED
    run = await LaneScript(lane_stub, lane).start_run("go")
    await probe.check()
    open_ = await summary()
    assert open_.operation_id == run.operation_id and open_.revision == run.started.revision
    assert open_.operation_status == snapshot_pb2.OPERATION_STATUS_OPEN
    assert open_.tip_id == probe.snapshot.tip_id != ""
    await run.abort()
    await probe.check()
    assert (await summary()).operation_status == snapshot_pb2.OPERATION_STATUS_ABORTING


# -- UpdateLaneConfig ---------------------------------------------------------------------------


async def test_update_lane_config_reports_only_what_changed(lane_stub) -> None:
    probe = await created_lane(lane_stub, model="m1", level=snapshot_pb2.THINKING_LEVEL_LOW)
    lane = probe.lane_id
    new_model = snapshot_pb2.ModelRef(provider="prov", model_id="m2")
    answer = await lane_stub.UpdateLaneConfig(
        pb.UpdateLaneConfigRequest(lane_id=lane, model=new_model)
    )
    events = await probe.check()
    change = only(events, "config_update")
    assert kinds(events) == ["config_update"]
    assert change.model.value == new_model
    assert change.model.previous == snapshot_pb2.ModelRef(provider="prov", model_id="m1")
    assert not change.HasField("thinking_level") and not change.HasField("active_tools")
    assert answer.revision == probe.snapshot.revision
    assert answer.configuration == probe.snapshot.configuration
    assert probe.snapshot.configuration.model == new_model

    # Nothing changes: no event, the same revision.
    same = await lane_stub.UpdateLaneConfig(
        pb.UpdateLaneConfigRequest(
            lane_id=lane,
            model=new_model,
            thinking_level=snapshot_pb2.THINKING_LEVEL_LOW,
            active_tool_names=pb.ToolNames(names=["read"]),
        )
    )
    assert await probe.check() == []
    assert same.revision == answer.revision
    assert same.configuration == probe.snapshot.configuration

    # Two fields at once, one of them unchanged: one event naming the two that changed.
    await lane_stub.UpdateLaneConfig(
        pb.UpdateLaneConfigRequest(
            lane_id=lane,
            model=new_model,
            thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH,
            active_tool_names=pb.ToolNames(names=["read", "write"]),
        )
    )
    events = await probe.check()
    change = only(events, "config_update")
    assert not change.HasField("model")
    assert change.thinking_level.value == snapshot_pb2.THINKING_LEVEL_HIGH
    assert change.thinking_level.previous == snapshot_pb2.THINKING_LEVEL_LOW
    assert list(change.active_tools.value) == ["read", "write"]
    assert list(change.active_tools.previous) == ["read"]

    # An empty ToolNames replaces the list with nothing; absent fields are left alone.
    await lane_stub.UpdateLaneConfig(
        pb.UpdateLaneConfigRequest(lane_id=lane, active_tool_names=pb.ToolNames())
    )
    change = only(await probe.check(), "config_update")
    assert list(change.active_tools.value) == [] and list(change.active_tools.previous) == [
        "read",
        "write",
    ]
    assert probe.snapshot.configuration == snapshot_pb2.LaneConfiguration(
        model=new_model, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
    )


# -- EnqueueMessage -----------------------------------------------------------------------------


def custom_entry(kind: str, data: str) -> entries_pb2.CustomEntry:
    return entries_pb2.CustomEntry(custom_type=kind, data_json=data)


async def enqueue(stub: Any, lane: str, kind: Q.ValueType, item: Any) -> str:
    """EnqueueMessage of ``item`` (a message or a custom entry); its entry id."""
    answer = await LaneScript(stub, lane).enqueue(item, kind)
    return answer.entry_id


async def test_enqueue_emits_the_whole_ordered_queue(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    items: list[tuple[Q.ValueType, Any]] = [
        (Q.QUEUE_KIND_STEER, user("steer")),
        (Q.QUEUE_KIND_FOLLOW_UP, user("follow")),
        (Q.QUEUE_KIND_NEXT_RUN, messages_pb2.AgentMessage(
            custom=messages_pb2.CustomMessage(role="note", data_json='{"n": 9007199254740993}'))),
        (Q.QUEUE_KIND_WRITE, custom_entry("marker", '{"big": 18446744073709551616}')),
    ]  # fmt: skip
    expected: list[snapshot_pb2.QueuedItem] = []
    for kind, item in items:
        entry_id = await enqueue(lane_stub, lane, kind, item)
        queued = snapshot_pb2.QueuedItem(entry_id=entry_id, kind=kind)
        if isinstance(item, entries_pb2.CustomEntry):
            queued.custom.CopyFrom(item)
        else:
            queued.message.CopyFrom(item)
        expected.append(queued)
        events = await probe.check()
        assert kinds(events) == ["queue_update"]
        assert list(events[0].queue_update.queues) == expected
        assert list(probe.snapshot.queues) == expected
    assert len({q.entry_id for q in expected}) == 4


# -- StartRun captures the inbox ----------------------------------------------------------------


async def fill_inbox(stub: Any, lane: str) -> dict[str, str]:
    """Queue, in this order: write W1, steer S1, follow-up F1, next-run N1, steer S2,
    follow-up F2, next-run N2. Returns name -> entry id."""
    order = [
        ("W1", Q.QUEUE_KIND_WRITE, custom_entry("marker", "{}")),
        ("S1", Q.QUEUE_KIND_STEER, user("S1")),
        ("F1", Q.QUEUE_KIND_FOLLOW_UP, user("F1")),
        ("N1", Q.QUEUE_KIND_NEXT_RUN, user("N1")),
        ("S2", Q.QUEUE_KIND_STEER, user("S2")),
        ("F2", Q.QUEUE_KIND_FOLLOW_UP, user("F2")),
        ("N2", Q.QUEUE_KIND_NEXT_RUN, user("N2")),
    ]
    return {name: await enqueue(stub, lane, kind, item) for name, kind, item in order}


def entry_ids(snapshot: snapshot_pb2.LaneSnapshot) -> list[str]:
    return [e.id for e in snapshot.transcript]


@pytest.mark.parametrize(
    ("mode", "captured", "left"),
    [
        pytest.param(ALL, ["W1", "S1", "F1", "N1", "S2", "F2", "N2"], [], id="all"),
        pytest.param(ONE, ["W1", "S1", "F1", "N1", "N2"], ["S2", "F2"], id="one_at_a_time"),
    ],
)
async def test_start_run_captures_queued_items_before_the_prompt(
    lane_stub, mode: int, captured: list[str], left: list[str]
) -> None:
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    ids = await fill_inbox(lane_stub, lane)
    await probe.check()
    settings = pb.RunSettings(steering_mode=mode, follow_up_mode=mode)  # type: ignore[arg-type]
    run = await LaneScript(lane_stub, lane).start_run("the prompt", settings=settings)
    events = await probe.check()
    # Captured items keep their entry ids and inbox order, then the prompt.
    transcript = entry_ids(probe.snapshot)
    assert transcript[:-1] == [ids[name] for name in captured]
    assert probe.snapshot.transcript[-1].message.message.user.content[0].text.text == "the prompt"
    assert [q.entry_id for q in probe.snapshot.queues] == [ids[name] for name in left]
    # run_start; per message entry message_start, message_end, entry_added (a custom entry:
    # entry_added only); then queue_update with what is left.
    expected = ["run_start"]
    for name in captured:
        expected += (
            ["entry_added"] if name == "W1" else ["message_start", "message_end", "entry_added"]
        )
    expected += ["message_start", "message_end", "entry_added", "queue_update"]
    assert kinds(events) == expected
    assert [q.entry_id for q in events[-1].queue_update.queues] == [ids[n] for n in left]
    assert probe.snapshot.stats.message_count == len(captured)  # minus W1, plus the prompt
    assert probe.snapshot.operation.id == run.operation_id
    assert probe.snapshot.operation.from_tip_id == ""


async def test_start_run_without_queue_items_emits_no_queue_update(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    await LaneScript(lane_stub, probe.lane_id).start_run("hi")
    assert kinds(await probe.check()) == [
        "run_start",
        "message_start",
        "message_end",
        "entry_added",
    ]


async def test_start_run_from_the_queue_alone(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    queued = await enqueue(lane_stub, probe.lane_id, Q.QUEUE_KIND_FOLLOW_UP, user("later"))
    await LaneScript(lane_stub, probe.lane_id).start_run()  # no prompt
    events = await probe.check()
    assert entry_ids(probe.snapshot) == [queued] and list(probe.snapshot.queues) == []
    assert kinds(events)[-1] == "queue_update"


# -- StartTurn delivers steering / follow-ups ---------------------------------------------------


async def start_run(stub: Any, probe: Probe, mode: pb.DeliveryMode.ValueType = ALL) -> RunScript:
    settings = pb.RunSettings(steering_mode=mode, follow_up_mode=mode)
    run = await LaneScript(stub, probe.lane_id).start_run("go", settings=settings)
    await probe.check()
    return run


async def start_turn(probe: Probe, run: RunScript) -> tuple[str, list[Any]]:
    turn_id = await run.start_turn()
    events = await probe.check()
    assert kinds(events)[-1] == "turn_start" and events[-1].turn_start.turn_id == turn_id
    return turn_id, events


#: StartTurn's events when it places a queued message first.
PLACED_THEN_TURN = ["message_start", "message_end", "entry_added", "queue_update", "turn_start"]


async def test_start_turn_places_steering_not_follow_ups_when_an_assistant_is_needed(
    lane_stub,
) -> None:
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    run = await start_run(lane_stub, probe)
    steer = await enqueue(lane_stub, lane, Q.QUEUE_KIND_STEER, user("steer"))
    follow = await enqueue(lane_stub, lane, Q.QUEUE_KIND_FOLLOW_UP, user("follow"))
    await probe.check()
    turn_id, events = await start_turn(probe, run)
    assert kinds(events) == PLACED_THEN_TURN
    assert entry_ids(probe.snapshot)[-1] == steer
    assert [q.entry_id for q in probe.snapshot.queues] == [follow]
    # The assistant finishes without tools: a finishing point, so the follow-up comes now.
    await run.settle(turn_id, "done")
    await probe.check()
    _, events = await start_turn(probe, run)
    assert kinds(events) == PLACED_THEN_TURN
    assert entry_ids(probe.snapshot)[-1] == follow and list(probe.snapshot.queues) == []


async def test_start_turn_after_a_tool_batch_needs_the_assistant(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    run = await start_run(lane_stub, probe)
    turn_id, _ = await start_turn(probe, run)
    await run.settle(turn_id, tool_calls=["c0"])  # stop reason TOOL_USE
    await probe.check()
    await run.call("c0").synthetic(pb.SYNTHETIC_CAUSE_UNKNOWN_TOOL)
    await probe.check(["c0"])
    follow = await enqueue(lane_stub, lane, Q.QUEUE_KIND_FOLLOW_UP, user("follow"))
    await probe.check()
    _, events = await start_turn(probe, run)
    assert kinds(events) == ["turn_start"]  # the tool results need an assistant: no follow-up
    assert [q.entry_id for q in probe.snapshot.queues] == [follow]


async def test_start_turn_one_at_a_time_takes_the_oldest_steering_message(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    run = await start_run(lane_stub, probe, ONE)
    first = await enqueue(lane_stub, lane, Q.QUEUE_KIND_STEER, user("s1"))
    second = await enqueue(lane_stub, lane, Q.QUEUE_KIND_STEER, user("s2"))
    await probe.check()
    turn_id, events = await start_turn(probe, run)
    assert entry_ids(probe.snapshot)[-1] == first
    assert [q.entry_id for q in events[-2].queue_update.queues] == [second]
    await run.settle(turn_id, "ok")
    await probe.check()
    await start_turn(probe, run)
    assert entry_ids(probe.snapshot)[-1] == second and list(probe.snapshot.queues) == []


# -- RecordUsage --------------------------------------------------------------------------------


async def test_record_usage_updates_the_totals(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    first = messages_pb2.Usage(
        input=10, output=5, cache_read=2, cache_write=1, total_tokens=18,
        cost=messages_pb2.UsageCost(input=0.5, output=0.25, total=0.75),
    )  # fmt: skip
    answer = await lane_stub.RecordUsage(pb.RecordUsageRequest(lane_id=lane, usage=first))
    events = await probe.check()
    assert kinds(events) == ["usage"] and answer.usage_id
    assert answer.revision == probe.snapshot.revision
    assert probe.snapshot.stats.usage == first
    run = await start_run(lane_stub, probe)
    turn_id, _ = await start_turn(probe, run)
    model_usage = messages_pb2.Usage(input=100, output=50, total_tokens=150)
    settled = (await run.settle(turn_id, "hi", usage=model_usage)).settled
    await probe.check()
    adjustment = messages_pb2.Usage(output=-5, total_tokens=-5)
    await lane_stub.RecordUsage(
        pb.RecordUsageRequest(
            lane_id=lane, usage=adjustment, entry_id=settled.entry_id, adjustment=True
        )
    )
    assert kinds(await probe.check()) == ["usage"]
    totals = probe.snapshot.stats.usage
    assert (totals.input, totals.output, totals.cache_read, totals.cache_write) == (110, 50, 2, 1)
    assert totals.total_tokens == 18 + 150 - 5
    assert totals.cost.total == pytest.approx(0.75)


# -- a whole run --------------------------------------------------------------------------------


async def test_full_run_leaves_last_result_and_no_operation(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    run = await LaneScript(lane_stub, probe.lane_id).start_run("hello")
    await probe.check()
    prompt_entry = probe.snapshot.tip_id
    settled = (await run.turn("hi there")).settled
    await probe.check()
    assert settled.entry_id == probe.snapshot.tip_id and list(settled.tool_calls) == []
    assert kinds(probe.events[-3:]) == ["message_end", "entry_added", "turn_end"]
    end = await run.end()
    events = await probe.check()
    assert kinds(events) == ["run_end"]
    snapshot = probe.snapshot
    assert not snapshot.HasField("operation")
    last = snapshot.last_result
    assert last == end.result and end.revision == snapshot.revision
    assert last.operation_id == run.operation_id
    assert last.kind == snapshot_pb2.OPERATION_KIND_RUN
    assert last.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED
    assert last.from_tip_id == "" and last.tip_id == settled.entry_id
    assert not last.HasField("error")
    assert last.started_time.ToDatetime() <= last.ended_time.ToDatetime()
    assert entry_ids(snapshot) == [prompt_entry, settled.entry_id]
    assert snapshot.stats.message_count == 2


async def test_next_run_starts_from_the_last_tip(lane_stub) -> None:
    probe = await created_lane(lane_stub)
    lane = LaneScript(lane_stub, probe.lane_id)
    run = await lane.start_run("go")
    await probe.check()
    settled = (await run.turn("hi there")).settled
    await run.end()
    second = await lane.start_run("again")
    snapshot = await probe.capture()
    assert snapshot.operation.id == second.operation_id
    assert snapshot.operation.from_tip_id == settled.entry_id
    assert entry_ids(snapshot)[:2] == [probe.snapshot.transcript[0].id, settled.entry_id]


@pytest.mark.parametrize(
    "command",
    ["EnqueueMessage", "RecordUsage", "UpdateLaneConfig", "StartRun", "CreateLane"],
)
async def test_last_result_survives_later_commands(lane_stub, command: str) -> None:
    # snapshot.last_result is "the result of the lane's last ended operation": later commands
    # that end no operation leave it as it is (and the fold keeps it).
    probe = await created_lane(lane_stub)
    lane = probe.lane_id
    run = await LaneScript(lane_stub, lane).start_run("hello")
    await run.end(
        snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
        snapshot_pb2.OperationError(code="boom", message="it broke"),
    )
    await probe.check()
    ended = probe.snapshot.last_result
    assert ended.operation_id == run.operation_id and ended.error.code == "boom"
    requests = {
        "EnqueueMessage": pb.EnqueueMessageRequest(
            lane_id=lane, kind=Q.QUEUE_KIND_NEXT_RUN, message=user("next")
        ),
        "RecordUsage": pb.RecordUsageRequest(lane_id=lane, usage=messages_pb2.Usage(input=1)),
        "UpdateLaneConfig": pb.UpdateLaneConfigRequest(
            lane_id=lane, thinking_level=snapshot_pb2.THINKING_LEVEL_HIGH
        ),
        "StartRun": pb.StartRunRequest(lane_id=lane, prompt=[user("again")]),
        "CreateLane": pb.CreateLaneRequest(lane_id=lane),
    }
    await getattr(lane_stub, command)(requests[command])
    await probe.check()  # fold == capture
    assert probe.snapshot.last_result == ended


async def test_tool_run_end_to_end_keeps_fold_equal_to_capture(lane_stub) -> None:
    probe = await created_lane(lane_stub, tools=("t",))
    run = await LaneScript(lane_stub, probe.lane_id).start_run("go")
    await probe.check()
    answer = (await run.turn("call", tool_calls=[("a", "t", {"x": 1}), "b"])).settled
    await probe.check()
    assert [(c.tool_call_id, c.source_index) for c in answer.tool_calls] == [("a", 1), ("b", 2)]
    for call_id in ("a", "b"):
        await run.call(call_id).start()
        await probe.check(["a"])
    staged = (await run.call("b").stage("b out")).staged
    assert staged is not None
    assert staged.staged.tool_call_id == "b" and not staged.batch_complete
    await probe.check(["a", "b"])
    staged = (await run.call("a").stage("a out", is_error=True)).staged
    assert staged is not None
    assert list(staged.placed_tool_call_ids) == ["a", "b"] and staged.batch_complete
    await probe.check(["a", "b"])
    results = [answer.tool_calls[0].result_entry_id, answer.tool_calls[1].result_entry_id]
    assert entry_ids(probe.snapshot)[-2:] == results
    await run.turn("all done")
    await run.end()
    await probe.check()
    assert probe.snapshot.last_result.tip_id == probe.snapshot.tip_id
