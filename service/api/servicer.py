"""The LaneService servicer: validate, decode into domain calls, run them through the store."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc, messages_pb2, snapshot_pb2

from service.api import validation as v
from service.api.errors import lane_error_status, unary
from service.api.framing import serialize
from service.api.operation_state import lease_of, operation_state
from service.api.watch import WatchSettings, watch_lane
from service.domain import lanes, leases, placement, runs, tools
from service.domain.errors import InvalidArgument, NotFound
from service.domain.ids import new_id
from service.domain.jsontext import require_json_object
from service.domain.state import LaneState
from service.domain.transition import Transition
from service.hub import Hub
from service.store import Store
from service.store.requests import RequestKey

Context = grpc.aio.ServicerContext[Any, Any]


def _cancel_requested(state: LaneState) -> bool:
    return state.operation is not None and state.operation.cancel_requested


class LaneServicer(lane_service_pb2_grpc.LaneServiceServicer):
    """Implements lane.v1.LaneService on a :class:`Store` and a :class:`Hub`."""

    def __init__(self, store: Store, hub: Hub, watch_settings: WatchSettings) -> None:
        self.store = store
        self.hub = hub
        self.watch_settings = watch_settings

    # -- lanes ---------------------------------------------------------------------------------

    @unary
    async def CreateLane(
        self, request: pb.CreateLaneRequest, context: Context
    ) -> pb.CreateLaneResponse:
        v.require_id(request.lane_id, "lane_id")
        v.require_id(request.request_id, "request_id", optional=True)
        v.check_message(request.configuration, "configuration")
        key = RequestKey.of("CreateLane", request, request.request_id)
        return await self.store.create_lane(request.lane_id, request.configuration, key)

    @unary
    async def GetLaneSnapshot(
        self, request: pb.GetLaneSnapshotRequest, context: Context
    ) -> pb.GetLaneSnapshotResponse:
        v.require_id(request.lane_id, "lane_id")
        return pb.GetLaneSnapshotResponse(snapshot=await self.store.snapshot(request.lane_id))

    @unary
    async def ListLanes(
        self, request: pb.ListLanesRequest, context: Context
    ) -> pb.ListLanesResponse:
        v.require(
            0 <= request.page_size <= v.MAX_PAGE_SIZE,
            "INVALID_PAGE_SIZE",
            f"page_size must be between 0 and {v.MAX_PAGE_SIZE}",
            "page_size",
        )
        after = ""
        if request.page_token:
            try:
                after = base64.urlsafe_b64decode(request.page_token.encode()).decode()
                if not after.isprintable():
                    raise ValueError(after)
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise InvalidArgument(
                    "INVALID_PAGE_TOKEN",
                    "page_token is not a token ListLanes gave",
                    field="page_token",
                ) from None
        found, last = await self.store.list_lanes(request.page_size or v.DEFAULT_PAGE_SIZE, after)
        token = base64.urlsafe_b64encode(last.encode()).decode() if last else ""
        return pb.ListLanesResponse(lanes=found, next_page_token=token)

    async def _command(
        self,
        method: str,
        request: Any,
        decide: Callable[[LaneState, datetime], tuple[Transition, Any]],
        answer_type: type[Any],
    ) -> Any:
        v.require_id(request.lane_id, "lane_id")
        request_id = getattr(request, "request_id", "")  # lease renewal/release have none
        v.require_id(request_id, "request_id", optional=True)
        key = RequestKey.of(method, request, request_id)
        return await self.store.command(request.lane_id, decide, answer_type, key)

    @unary
    async def UpdateLaneConfig(
        self, request: pb.UpdateLaneConfigRequest, context: Context
    ) -> pb.UpdateLaneConfigResponse:
        v.check_message(request, "")
        model = request.model if request.HasField("model") else None
        level = request.thinking_level or None
        tools_ = (
            list(request.active_tool_names.names) if request.HasField("active_tool_names") else None
        )

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.UpdateLaneConfigResponse]:
            t = lanes.update_config(
                state, now, model=model, thinking_level=level, active_tool_names=tools_
            )
            return t, pb.UpdateLaneConfigResponse(
                revision=t.state.revision, configuration=t.state.configuration
            )

        return await self._command("UpdateLaneConfig", request, decide, pb.UpdateLaneConfigResponse)  # type: ignore[no-any-return]

    @unary
    async def EnqueueMessage(
        self, request: pb.EnqueueMessageRequest, context: Context
    ) -> pb.EnqueueMessageResponse:
        v.check_message(request, "")
        v.require(
            request.kind != snapshot_pb2.QUEUE_KIND_UNSPECIFIED,
            "MISSING_FIELD",
            "kind is required",
            "kind",
        )
        item = snapshot_pb2.QueuedItem(entry_id=new_id(), kind=request.kind)
        if request.kind == snapshot_pb2.QUEUE_KIND_WRITE:
            v.require(
                request.HasField("custom"), "INVALID_MESSAGE", "a WRITE item needs custom", "custom"
            )
            v.require(
                bool(request.custom.custom_type),
                "MISSING_FIELD",
                "custom.custom_type is required",
                "custom.custom_type",
            )
            item.custom.CopyFrom(request.custom)
        else:
            v.require(
                request.HasField("message"),
                "INVALID_MESSAGE",
                "a queued message needs message",
                "message",
            )
            v.require_kind(request.message, "message", "user", "custom")
            item.message.CopyFrom(request.message)

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.EnqueueMessageResponse]:
            t = lanes.enqueue(state, item, now)
            return t, pb.EnqueueMessageResponse(entry_id=item.entry_id, revision=t.state.revision)

        return await self._command("EnqueueMessage", request, decide, pb.EnqueueMessageResponse)  # type: ignore[no-any-return]

    # -- runs ----------------------------------------------------------------------------------

    @unary
    async def StartRun(self, request: pb.StartRunRequest, context: Context) -> pb.StartRunResponse:
        v.check_message(request, "")
        v.require_id(request.operation_id, "operation_id", optional=True)
        for index, message in enumerate(request.prompt):
            v.require_kind(message, f"prompt[{index}]", "user", "custom")
        operation_id = request.operation_id or new_id()
        v.require_id(request.driver_id, "driver_id", optional=True)
        v.require(
            bool(request.driver_id) or not request.lease_seconds,
            "INVALID_LEASE",
            "lease_seconds needs driver_id",
            "lease_seconds",
        )
        lease = (
            (request.driver_id, v.lease_seconds(request.lease_seconds))
            if request.driver_id
            else None
        )

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartRunResponse]:
            t = runs.start_run(
                state, operation_id, request.prompt, request.settings, now, new_id, lease
            )
            answer = pb.StartRunResponse(operation_id=operation_id, revision=t.state.revision)
            granted = lease_of(t.state.operation) if t.state.operation else None
            if granted is not None:
                answer.lease.CopyFrom(granted)
            return t, answer

        return await self._command("StartRun", request, decide, pb.StartRunResponse)  # type: ignore[no-any-return]

    @unary
    async def AbortOperation(
        self, request: pb.AbortOperationRequest, context: Context
    ) -> pb.AbortOperationResponse:
        v.require_id(request.operation_id, "operation_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.AbortOperationResponse]:
            t = runs.abort_operation(state, request.operation_id, now)
            return t, pb.AbortOperationResponse(
                revision=t.state.revision, newly_requested=bool(t.events)
            )

        return await self._command("AbortOperation", request, decide, pb.AbortOperationResponse)  # type: ignore[no-any-return]

    @unary
    async def EndRun(self, request: pb.EndRunRequest, context: Context) -> pb.EndRunResponse:
        v.require_id(request.operation_id, "operation_id")
        v.check_message(request, "")
        failed = request.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED
        v.require(
            request.status
            in (
                snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED,
                snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
                snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED,
            ),
            "INVALID_STATUS",
            "status must be COMPLETED, FAILED or ABORTED",
            "status",
        )
        v.require(
            request.HasField("error") == failed,
            "INVALID_ERROR",
            "error is required with status FAILED and only then",
            "error",
        )
        if failed:
            v.require(
                bool(request.error.code), "MISSING_FIELD", "error.code is required", "error.code"
            )
        error = request.error if failed else None

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.EndRunResponse]:
            t = runs.end_run(
                state,
                request.operation_id,
                request.status,
                error,
                now,
                new_id,
                lease_token=request.lease_token,
            )
            assert t.state.last_result is not None
            return t, pb.EndRunResponse(result=t.state.last_result, revision=t.state.revision)

        return await self._command("EndRun", request, decide, pb.EndRunResponse)  # type: ignore[no-any-return]

    # -- turns ---------------------------------------------------------------------------------

    @unary
    async def StartTurn(
        self, request: pb.StartTurnRequest, context: Context
    ) -> pb.StartTurnResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id", optional=True)
        turn_id = request.turn_id or new_id()

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartTurnResponse]:
            t = runs.start_turn(state, request.operation_id, turn_id, now, request.lease_token)
            return t, pb.StartTurnResponse(turn_id=turn_id, revision=t.state.revision)

        return await self._command("StartTurn", request, decide, pb.StartTurnResponse)  # type: ignore[no-any-return]

    @unary
    async def SettleAssistantMessage(
        self, request: pb.SettleAssistantMessageRequest, context: Context
    ) -> pb.SettleAssistantMessageResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.turn_id, "turn_id")
        v.require(request.HasField("message"), "MISSING_FIELD", "message is required", "message")
        message = request.message
        v.require(
            message.stop_reason
            not in (messages_pb2.STOP_REASON_UNSPECIFIED, messages_pb2.STOP_REASON_PENDING),
            "INVALID_STOP_REASON",
            "a settled assistant message needs a final stop_reason (not PENDING)",
            "message.stop_reason",
        )
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        v.check_tool_calls(message, "message")

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.SettleAssistantMessageResponse]:
            t = runs.settle_assistant(
                state,
                request.operation_id,
                request.turn_id,
                message,
                now,
                new_id,
                request.lease_token,
            )
            operation = t.state.operation
            batch = operation.batch if operation else None
            return t, pb.SettleAssistantMessageResponse(
                entry_id=t.state.tip_id,
                revision=t.state.revision,
                tool_calls=[
                    pb.PlannedToolCall(
                        tool_call_id=c.tool_call_id,
                        tool_name=c.tool_name,
                        source_index=c.source_index,
                        result_entry_id=c.result_entry_id,
                    )
                    for c in (batch.calls if batch else ())
                ],
                cancel_requested=_cancel_requested(t.state),
            )

        return await self._command(  # type: ignore[no-any-return]
            "SettleAssistantMessage", request, decide, pb.SettleAssistantMessageResponse
        )

    @unary
    async def RecordUsage(
        self, request: pb.RecordUsageRequest, context: Context
    ) -> pb.RecordUsageResponse:
        v.require(request.HasField("usage"), "MISSING_FIELD", "usage is required", "usage")
        v.require_id(request.entry_id, "entry_id", optional=True)
        usage_id = new_id()

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.RecordUsageResponse]:
            t = runs.record_usage(
                state, usage_id, request.usage, request.entry_id or None, request.adjustment, now
            )
            return t, pb.RecordUsageResponse(usage_id=usage_id, revision=t.state.revision)

        return await self._command("RecordUsage", request, decide, pb.RecordUsageResponse)  # type: ignore[no-any-return]

    # -- tool calls ----------------------------------------------------------------------------

    @unary
    async def StartToolCall(
        self, request: pb.StartToolCallRequest, context: Context
    ) -> pb.StartToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.check_message(request, "", skip_json=frozenset({"arguments_json"}))
        require_json_object(request.arguments_json, "arguments_json")
        replay = request.replay or pb.REPLAY_POLICY_NEVER

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.StartToolCallResponse]:
            t = tools.start_tool_call(
                state,
                request.operation_id,
                request.tool_call_id,
                request.arguments_json,
                replay,
                now,
                request.lease_token,
            )
            return t, pb.StartToolCallResponse(
                revision=t.state.revision, cancel_requested=_cancel_requested(t.state)
            )

        return await self._command("StartToolCall", request, decide, pb.StartToolCallResponse)  # type: ignore[no-any-return]

    @unary
    async def UpdateToolCall(
        self, request: pb.UpdateToolCallRequest, context: Context
    ) -> pb.UpdateToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.require(
            request.HasField("partial_result"),
            "MISSING_FIELD",
            "partial_result is required",
            "partial_result",
        )
        v.check_message(request, "")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.UpdateToolCallResponse]:
            t = tools.update_tool_call(
                state,
                request.operation_id,
                request.tool_call_id,
                request.partial_result,
                request.checkpoint,
                now,
                request.lease_token,
            )
            return t, pb.UpdateToolCallResponse(
                revision=t.state.revision, cancel_requested=_cancel_requested(t.state)
            )

        return await self._command("UpdateToolCall", request, decide, pb.UpdateToolCallResponse)  # type: ignore[no-any-return]

    @unary
    async def StageToolOutcome(
        self, request: pb.StageToolOutcomeRequest, context: Context
    ) -> pb.StageToolOutcomeResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")
        v.check_message(request, "")
        outcome = request.WhichOneof("outcome")
        v.require(
            outcome is not None, "MISSING_FIELD", "executed or synthetic is required", "outcome"
        )
        if outcome == "executed":
            v.require(
                request.executed.HasField("result"),
                "MISSING_FIELD",
                "executed.result is required",
                "executed.result",
            )
        else:
            cause = request.synthetic.cause
            v.require(
                cause != pb.SYNTHETIC_CAUSE_UNSPECIFIED,
                "MISSING_FIELD",
                "synthetic.cause is required",
                "synthetic.cause",
            )
            v.require(
                bool(request.synthetic.message)
                or cause not in (pb.SYNTHETIC_CAUSE_INVALID_ARGUMENTS, pb.SYNTHETIC_CAUSE_DENIED),
                "MISSING_FIELD",
                "synthetic.message is required for INVALID_ARGUMENTS and DENIED",
                "synthetic.message",
            )
        key = RequestKey.of("StageToolOutcome", request, request.request_id)

        def stage(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.StageToolOutcomeResponse]:
            t = tools.stage_tool_outcome(
                state, request.operation_id, request.tool_call_id, request, now, request.lease_token
            )
            operation = t.state.operation
            assert operation is not None and operation.batch is not None
            call = operation.batch.call(request.tool_call_id)
            assert call is not None and call.result_message is not None
            return t, pb.StageToolOutcomeResponse(
                staged_revision=t.state.revision,
                revision=t.state.revision,
                cancel_requested=_cancel_requested(t.state),
                staged=call.result_message,
            )

        v.require_id(request.lane_id, "lane_id")
        v.require_id(request.request_id, "request_id", optional=True)
        answer = await self.store.command(request.lane_id, stage, pb.StageToolOutcomeResponse, key)

        def place(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.StageToolOutcomeResponse]:
            t = placement.place_ready(state, now, new_id)
            if not t.events:
                return t, answer
            done = pb.StageToolOutcomeResponse()
            done.CopyFrom(answer)
            done.revision = t.state.revision
            done.placed_tool_call_ids.extend(
                e.entry_added.entry.message.message.tool_result.tool_call_id
                for e in t.events
                if e.WhichOneof("kind") == "entry_added"
            )
            done.batch_complete = any(e.WhichOneof("kind") == "turn_end" for e in t.events)
            return t, done

        # Placement is its own commit, after the staging commit (seed: staging < tool_end <
        # placement). A retry of a request whose staging committed still places what is ready.
        return await self.store.command(
            request.lane_id, place, pb.StageToolOutcomeResponse, amends=key
        )

    # -- ownership and recovery ----------------------------------------------------------------

    @unary
    async def AcquireOperation(
        self, request: pb.AcquireOperationRequest, context: Context
    ) -> pb.AcquireOperationResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.driver_id, "driver_id")
        seconds = v.lease_seconds(request.lease_seconds)

        def decide(
            state: LaneState, now: datetime
        ) -> tuple[Transition, pb.AcquireOperationResponse]:
            t = leases.acquire(state, request.operation_id, request.driver_id, seconds, now, new_id)
            answer = pb.AcquireOperationResponse(revision=t.state.revision)
            operation = t.state.operation
            if operation is not None:  # None only when takeover placement ended the batch's run
                answer.state.CopyFrom(operation_state(operation))
                answer.lease.CopyFrom(answer.state.lease)
            return t, answer

        return await self._command("AcquireOperation", request, decide, pb.AcquireOperationResponse)  # type: ignore[no-any-return]

    @unary
    async def RenewLease(
        self, request: pb.RenewLeaseRequest, context: Context
    ) -> pb.RenewLeaseResponse:
        v.require_id(request.operation_id, "operation_id")
        seconds = v.lease_seconds(request.lease_seconds)

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.RenewLeaseResponse]:
            t = leases.renew(state, request.operation_id, request.lease_token, seconds, now)
            assert t.state.operation is not None
            return t, pb.RenewLeaseResponse(
                lease=lease_of(t.state.operation), cancel_requested=_cancel_requested(t.state)
            )

        return await self._command("RenewLease", request, decide, pb.RenewLeaseResponse)  # type: ignore[no-any-return]

    @unary
    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: Context
    ) -> pb.ReleaseLeaseResponse:
        v.require_id(request.operation_id, "operation_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ReleaseLeaseResponse]:
            return leases.release(state, request.operation_id, request.lease_token, now), (
                pb.ReleaseLeaseResponse()
            )

        return await self._command("ReleaseLease", request, decide, pb.ReleaseLeaseResponse)  # type: ignore[no-any-return]

    @unary
    async def ReplayToolCall(
        self, request: pb.ReplayToolCallRequest, context: Context
    ) -> pb.ReplayToolCallResponse:
        v.require_id(request.operation_id, "operation_id")
        v.require_id(request.tool_call_id, "tool_call_id")

        def decide(state: LaneState, now: datetime) -> tuple[Transition, pb.ReplayToolCallResponse]:
            t = tools.replay_tool_call(
                state, request.operation_id, request.tool_call_id, request.lease_token, now
            )
            return t, pb.ReplayToolCallResponse(
                revision=t.state.revision, arguments_json=t.events[0].tool_start.arguments_json
            )

        return await self._command("ReplayToolCall", request, decide, pb.ReplayToolCallResponse)  # type: ignore[no-any-return]

    @unary
    async def GetOperation(
        self, request: pb.GetOperationRequest, context: Context
    ) -> pb.GetOperationResponse:
        v.require_id(request.lane_id, "lane_id")
        v.require_id(request.operation_id, "operation_id")
        operation = await self.store.open_operation(request.lane_id)
        if operation is None or operation.operation_id != request.operation_id:
            raise NotFound(
                "OPERATION_NOT_OPEN",
                f"operation {request.operation_id} is not open on lane {request.lane_id}",
                laneId=request.lane_id,
                operationId=request.operation_id,
            )
        return pb.GetOperationResponse(state=operation_state(operation))

    # -- watching ------------------------------------------------------------------------------

    @unary
    async def WatchLane(self, request: pb.WatchLaneRequest, context: Context) -> None:  # type: ignore[override]
        v.require_id(request.lane_id, "lane_id")
        await watch_lane(self.store, self.hub, request, context, self.watch_settings)


def _method_handlers(servicer: LaneServicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Handlers for every LaneService method, built from the service descriptor.

    Built here rather than by the generated ``add_LaneServiceServicer_to_server`` so WatchLane
    can send pre-encoded event frames (see framing.py) through a pass-through serializer.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in pb.DESCRIPTOR.services_by_name["LaneService"].methods:
        implementation = _decoding(
            getattr(servicer, method.name), message_factory.GetMessageClass(method.input_type)
        )
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        # Requests arrive as bytes and are decoded by _decoding, so undecodable bytes get
        # INVALID_ARGUMENT rather than the UNKNOWN a failing deserializer would produce.
        handlers[method.name] = make(implementation, response_serializer=serialize)
    return handlers


def _decoding(
    implementation: Callable[[Any, Context], Awaitable[Any]], request_type: type[Message]
) -> Callable[[bytes, Context], Awaitable[Any]]:
    async def handler(data: bytes, context: Context) -> Any:
        try:
            request = request_type.FromString(data)
        except DecodeError:
            error = InvalidArgument(
                "MALFORMED_REQUEST", f"the request is not a valid {request_type.DESCRIPTOR.name}"
            )
            await context.abort_with_status(lane_error_status(error))
        return await implementation(request, context)

    return handler


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LaneService"].full_name


def add_lane_service(
    server: grpc.aio.Server,
    store: Store,
    hub: Hub,
    watch_settings: WatchSettings | None = None,
) -> LaneServicer:
    """Register the LaneService on ``server``."""
    servicer = LaneServicer(store, hub, watch_settings or WatchSettings())
    handlers = _method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    return servicer
