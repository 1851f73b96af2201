"""Plausible requests for every RPC, aimed at one lane of the world (:func:`template`).

A template uses the lane's ids and mostly valid content, so that it meets the lane's state
machine (and is often accepted); the fuzzer then often overwrites a few of its fields with
random values. Enum fields take plain numbers here: the proto's enum types are only hints.

The ids are drawn once per request into an :class:`~lane.client.testing.Aim`, which puts each
into every request type that has a field for it; a template sets only its content (and an id
it overrides, e.g. a fresh lane for CreateLane).
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import Message
from hypothesis import strategies as st
from lane.client.testing import Aim
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.outage.fuzz_transfer import EMPTY_FILE
from tests.outage.fuzz_values import (
    METHODS,
    Ctx,
    Draw,
    int_values,
    json_objects,
    json_texts,
    one_in,
    pick,
)
from tests.outage.fuzz_world import STOP, TOOL_USE, assistant_msg, call_block, text_block, user_msg

PENDING = messages_pb2.STOP_REASON_PENDING
ERROR = messages_pb2.STOP_REASON_ERROR
LENGTH = messages_pb2.STOP_REASON_LENGTH
_USAGE_FIELDS = messages_pb2.Usage.DESCRIPTOR.fields_by_name


def template(draw: Draw, ctx: Ctx, method: str) -> Message:
    """A plausible ``method`` request for ``ctx.lane``."""
    # Drawn in this order (keyword arguments are evaluated as written) for every template, used
    # or not, so that a seed draws the same requests.
    aim = Aim(
        lane_id=ctx.lane.lane_id,
        request_id=ctx.request_id(draw),
        operation_id=ctx.op(draw),
        lease_token=ctx.token(draw),
        tool_call_id=ctx.call(draw),
        turn_id=ctx.turn(draw),
    )
    return TEMPLATES[method](draw, ctx, aim)


# -- content ----------------------------------------------------------------------------------


def _tool_result(draw: Draw) -> messages_pb2.ToolResult:
    result = messages_pb2.ToolResult(content=[text_block(draw(st.sampled_from(("ok", "", "é"))))])
    if draw(st.booleans()):
        result.details_json = draw(json_texts)
    if one_in(draw, 4):
        result.added_tool_names.append("extra")
    if one_in(draw, 6):
        result.terminate = True
    return result


def _assistant(draw: Draw, ctx: Ctx, stop: int | None = None) -> messages_pb2.AssistantMessage:
    """An assistant message: text, up to three tool calls (ids c0.., sometimes a known one)."""
    blocks = [text_block(draw(st.sampled_from(("hello", "calling", ""))))]
    calls = draw(st.integers(0, 3))
    for index in range(calls):
        known = ctx.call(draw)
        blocks.append(
            call_block(
                known if one_in(draw, 4) else f"c{index}",
                draw(st.sampled_from(("t", "read", "write"))),
                draw(json_texts) if one_in(draw, 6) else draw(json_objects),
            )
        )
    if stop is None:
        usual = TOOL_USE if calls else STOP
        stop = draw(st.sampled_from((usual, usual, usual, LENGTH, ERROR, 5, 6, PENDING, 0)))
    message = assistant_msg(*blocks, stop=stop)
    if one_in(draw, 4):
        message.usage.input = draw(int_values(_USAGE_FIELDS["input"]))
    return message


def _prompt(draw: Draw) -> messages_pb2.AgentMessage:
    if one_in(draw, 10):
        return messages_pb2.AgentMessage(
            custom=messages_pb2.CustomMessage(role="note", data_json=draw(json_texts))
        )
    return user_msg(draw(st.sampled_from(("go", "again", "é"))))


def _compaction_entry(draw: Draw) -> entries_pb2.CompactionEntry:
    entry = entries_pb2.CompactionEntry(
        summary=draw(st.sampled_from(("summary", "summary", "summary", ""))),
        tokens_before=draw(st.sampled_from((0, 10, -1))),
        retained_tail=[_prompt(draw) for _ in range(draw(st.integers(0, 1)))],
    )
    if draw(st.booleans()):
        entry.details_json = draw(json_texts)
    return entry


def _error(draw: Draw) -> snapshot_pb2.OperationError:
    error = snapshot_pb2.OperationError(
        code=draw(st.sampled_from(("boom", "boom", ""))), message="m"
    )
    if draw(st.booleans()):
        error.details_json = draw(json_texts)
    return error


# -- one template per RPC ---------------------------------------------------------------------
# Each takes the ids from ``aim`` (Aim.request puts in those its request type has), then draws
# its content in a fixed order.


def _create_lane(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    lane = ctx.world.fresh("new-lane") if one_in(draw, 5) else aim.lane_id
    request = aim.request(pb.CreateLaneRequest, lane_id=lane)
    if draw(st.booleans()):
        request.configuration.thinking_level = draw(st.integers(0, 6))
        request.configuration.model.provider = "p"
        request.configuration.active_tool_names.append("t")
    return request


def _ids_only(request_type: type[Message]) -> Template:
    """The template of an RPC whose request holds nothing but ids."""
    return lambda draw, ctx, aim: aim.request(request_type)


def _statuses(draw: Draw) -> list[int]:
    """A lane status filter: mostly empty, sometimes with values the contract lacks."""
    statuses: list[int] = draw(
        st.lists(st.sampled_from((0, 1, 2, 3, 4, 5, 6, 7, 8, -1)), max_size=3)
    )
    return statuses


def _list_lanes(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = pb.ListLanesRequest(
        page_size=draw(st.sampled_from((0, 1, 5, 1000))),
        page_token=pick(draw, ctx.world.page_tokens, ("",)),
        lane_id_prefix=draw(st.sampled_from(("", ctx.lane.lane_id[:4], ctx.lane.lane_id))),
        order=draw(st.sampled_from((0, 0, 1, 2))),
    )
    request.statuses.extend(_statuses(draw))  # type: ignore[arg-type]
    return request


def _watch_lanes(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = pb.WatchLanesRequest(
        lane_id_prefix=draw(st.sampled_from(("", ctx.lane.lane_id[:4], ctx.lane.lane_id))),
    )
    if draw(st.booleans()):
        request.lane_ids.extend([ctx.lane.lane_id, "no-such-lane"])
    request.statuses.extend(_statuses(draw))  # type: ignore[arg-type]
    return request


def _read_lane_events(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    # Mostly the start of the log or a few events in (a group boundary or not), sometimes
    # beyond any head or below zero; the incarnation mostly unnamed.
    return aim.request(
        pb.ReadLaneEventsRequest,
        after_revision=draw(st.sampled_from((0, 0, 1, 2, 3, 7, 1 << 40, -1))),
        incarnation=draw(st.sampled_from(("", "", "1", "0", "x"))),
        page_size=draw(st.sampled_from((0, 1, 3, 10_000, 10_001, -1))),
    )


def _update_lane_config(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.UpdateLaneConfigRequest)
    if draw(st.booleans()):
        request.model.provider, request.model.model_id = "p", "m2"
    if draw(st.booleans()):
        request.thinking_level = draw(st.integers(0, 6))
    if draw(st.booleans()):
        request.active_tool_names.names.extend(["t", "read"][: draw(st.integers(0, 2))])
    return request


def _enqueue_message(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.EnqueueMessageRequest)
    request.kind = draw(st.integers(0, 4))
    if request.kind == snapshot_pb2.QUEUE_KIND_WRITE:
        request.custom.custom_type = "note"
        request.custom.data_json = draw(json_texts)
    else:
        request.message.CopyFrom(_prompt(draw))
    return request


def _start_run(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(
        pb.StartRunRequest, prompt=[_prompt(draw) for _ in range(draw(st.integers(0, 2)))]
    )
    request.settings.tool_execution = draw(st.integers(0, 2))
    if one_in(draw, 3):
        request.driver_id = ctx.driver(draw)
        request.lease_seconds = draw(st.sampled_from((0, 1, 600, 3600)))
    if one_in(draw, 5):
        # StartRun chooses its operation id (Aim leaves it out): the aimed one, or a fresh one.
        request.operation_id = aim.operation_id if draw(st.booleans()) else ctx.world.fresh("op")
    return request


def _end_run(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.EndRunRequest, status=draw(st.sampled_from((1, 1, 1, 3, 4, 2, 0))))
    if request.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED or one_in(draw, 6):
        request.error.CopyFrom(_error(draw))
    return request


def _start_turn(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    # StartTurn chooses its turn id (Aim leaves it out): mostly the service's, sometimes ours.
    turn_id = ctx.world.fresh("turn") if one_in(draw, 4) else ""
    return aim.request(pb.StartTurnRequest, turn_id=turn_id)


def _settle_assistant_message(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    return aim.request(pb.SettleAssistantMessageRequest, message=_assistant(draw, ctx))


def _record_usage(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    usage = messages_pb2.Usage(
        input=draw(int_values(_USAGE_FIELDS["input"])),
        total_tokens=draw(int_values(_USAGE_FIELDS["total_tokens"])),
    )
    usage.cost.total = draw(st.sampled_from((0.0, 0.5, 1e308, float("nan"), float("inf"))))
    return aim.request(
        pb.RecordUsageRequest,
        usage=usage,
        entry_id=ctx.entry(draw) if draw(st.booleans()) else "",
        adjustment=draw(st.booleans()),
    )


def _start_tool_call(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    arguments = draw(json_texts) if one_in(draw, 4) else draw(json_objects)
    return aim.request(
        pb.StartToolCallRequest, arguments_json=arguments, replay=draw(st.integers(0, 2))
    )


def _update_tool_call(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    return aim.request(
        pb.UpdateToolCallRequest, partial_result=_tool_result(draw), checkpoint=draw(st.booleans())
    )


def _stage_tool_outcome(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.StageToolOutcomeRequest)
    if draw(st.booleans()):
        request.executed.result.CopyFrom(_tool_result(draw))
        request.executed.is_error = draw(st.booleans())
    else:
        request.synthetic.cause = draw(st.integers(0, 6))
        request.synthetic.message = draw(st.sampled_from(("", "why")))
        request.synthetic.terminate = draw(st.booleans())
    return request


def _watch_lane(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.WatchLaneRequest)
    if draw(st.booleans()):
        head = ctx.lane.revision
        request.after_revision = draw(
            st.sampled_from((0, head, head + 1, max(head - 1, 0), -1, 2**63 - 1))
        )
    return request


def _acquire_operation(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    return aim.request(
        pb.AcquireOperationRequest,
        driver_id=ctx.driver(draw),
        lease_seconds=draw(st.sampled_from((0, 1, 60, 3600, 3601, -1))),
    )


def _renew_lease(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    return aim.request(pb.RenewLeaseRequest, lease_seconds=draw(st.sampled_from((0, 30, 30, 3601))))


def _append_assistant_stream(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.AppendAssistantStreamRequest)
    for _ in range(draw(st.integers(0, 2))):
        stop = draw(st.sampled_from((PENDING, PENDING, PENDING, STOP)))
        partial = request.partials.add(message=_assistant(draw, ctx, stop=stop))
        if draw(st.booleans()):
            partial.stream_event_json = draw(json_texts)
    return request


def _schedule_retry(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(
        pb.ScheduleRetryRequest,
        max_attempts=draw(st.sampled_from((3, 0, 1, 2, 3, 10, 10, 2**31 - 1, 3))),
        delay_ms=draw(st.sampled_from((0, 10, 0, 10, 86_400_000, 86_400_001, -1, 2**63 - 1, 0))),
        error_message="e",
    )
    if draw(st.booleans()):
        stop = draw(st.sampled_from((ERROR, ERROR, STOP)))
        request.failed_message.CopyFrom(_assistant(draw, ctx, stop=stop))
    return request


def _suspend_run(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    deferred = snapshot_pb2.DeferredState(
        handle_json=draw(json_texts), poll_json=draw(st.sampled_from(("", '{"p": 1}')))
    )
    return aim.request(pb.SuspendRunRequest, deferred=deferred)


def _start_compaction(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.StartCompactionRequest, reason=draw(st.integers(0, 3)))
    if one_in(draw, 3):
        request.driver_id = ctx.driver(draw)
    if one_in(draw, 4):
        # StartCompaction chooses its operation id (Aim leaves it out).
        request.operation_id = ctx.world.fresh("op")
    return request


def _end_compaction(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.EndCompactionRequest, status=draw(st.sampled_from((1, 1, 2, 3, 4, 0))))
    if request.status == snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED or one_in(draw, 5):
        request.entry.CopyFrom(_compaction_entry(draw))
    if request.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED or one_in(draw, 5):
        request.error.CopyFrom(_error(draw))
    return request


def _compact_run(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    entry = _compaction_entry(draw)
    return aim.request(pb.CompactRunRequest, entry=entry, reason=draw(st.integers(0, 3)))


def _navigate_lane(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.NavigateLaneRequest, target_entry_id=ctx.entry(draw))
    if draw(st.booleans()):
        request.summary.summary = "left"
        if draw(st.booleans()):
            request.summary.details_json = draw(json_texts)
    return request


def _report_fault(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    code = draw(st.sampled_from(("boom", "boom", "")))
    return aim.request(pb.ReportFaultRequest, code=code, message="m")


def _report_handler_error(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    error = draw(st.sampled_from(("oops", "oops", "")))
    request = aim.request(pb.ReportHandlerErrorRequest, error=error)
    if draw(st.booleans()):
        request.stack = "at x"
    if draw(st.booleans()):
        request.hook = "before_tool"
    else:
        request.event = "tool_end"
    return request


def _set_lane_value(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    request = aim.request(pb.SetLaneValueRequest)
    if draw(st.booleans()):
        name = draw(st.sampled_from(("session", "")))
        request.session_name.CopyFrom(events_pb2.SessionNameValue(name=name))
    else:
        label = events_pb2.EntryLabelValue(target_id=ctx.entry(draw), label="mark")
        request.entry_label.CopyFrom(label)
    return request


def _delete_lane(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    # Mostly lanes imports created, so that the world's lanes stay for the checks.
    lane = pick(draw, ctx.world.imported, (aim.lane_id, "no-such-lane"), newest=False)
    return aim.request(pb.DeleteLaneRequest, lane_id=lane, force=draw(st.booleans()))


def _import_lane(draw: Draw, ctx: Ctx, aim: Aim) -> Message:
    # The first message of an import (its generic and encoded variants); the fuzzer sends
    # import files through fuzz_transfer.import_case.
    return aim.request(pb.ImportLaneRequest, data=EMPTY_FILE)


Template = Callable[[Draw, Ctx, Aim], Message]
TEMPLATES: dict[str, Template] = {
    "CreateLane": _create_lane,
    "GetLaneSnapshot": _ids_only(pb.GetLaneSnapshotRequest),
    "ListLanes": _list_lanes,
    "UpdateLaneConfig": _update_lane_config,
    "EnqueueMessage": _enqueue_message,
    "StartRun": _start_run,
    "AbortOperation": _ids_only(pb.AbortOperationRequest),
    "EndRun": _end_run,
    "StartTurn": _start_turn,
    "SettleAssistantMessage": _settle_assistant_message,
    "RecordUsage": _record_usage,
    "StartToolCall": _start_tool_call,
    "UpdateToolCall": _update_tool_call,
    "StageToolOutcome": _stage_tool_outcome,
    "WatchLane": _watch_lane,
    "WatchLanes": _watch_lanes,
    "AcquireOperation": _acquire_operation,
    "RenewLease": _renew_lease,
    "ReleaseLease": _ids_only(pb.ReleaseLeaseRequest),
    "ReplayToolCall": _ids_only(pb.ReplayToolCallRequest),
    "GetOperation": _ids_only(pb.GetOperationRequest),
    "AppendAssistantStream": _append_assistant_stream,
    "ScheduleRetry": _schedule_retry,
    "StartRetry": _ids_only(pb.StartRetryRequest),
    "SuspendRun": _suspend_run,
    "ResumeRun": _ids_only(pb.ResumeRunRequest),
    "StartCompaction": _start_compaction,
    "EndCompaction": _end_compaction,
    "CompactRun": _compact_run,
    "NavigateLane": _navigate_lane,
    "ReportFault": _report_fault,
    "ReportHandlerError": _report_handler_error,
    "SetLaneValue": _set_lane_value,
    "DeleteLane": _delete_lane,
    "ExportLane": _ids_only(pb.ExportLaneRequest),
    "ReadLaneEvents": _read_lane_events,
    "ImportLane": _import_lane,
}
assert set(TEMPLATES) == set(METHODS), set(METHODS) ^ set(TEMPLATES)
