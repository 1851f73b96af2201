"""An operation in the contract's words: its OperationState and Lease (what a driver taking over
needs), the lease a request asks for, and the answer of a command opening one."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import Message
from lane.limits import DEFAULT_LEASE_SECONDS
from lane.v1 import lane_service_pb2 as pb

from lane.server.domain.state import CallStatus, Continuation, Operation, Phase
from lane.server.domain.transition import OperationOpened
from lane.server.store.run_settings import settings_message

R = TypeVar("R", bound=Message)

_PHASES = {
    Phase.IDLE: pb.RUN_PHASE_IDLE,
    Phase.TURN_OPEN: pb.RUN_PHASE_TURN_OPEN,
    Phase.TOOLS: pb.RUN_PHASE_TOOLS,
}
_STATUSES = {
    CallStatus.PLANNED: pb.TOOL_CALL_STATUS_PLANNED,
    CallStatus.EFFECT_PENDING: pb.TOOL_CALL_STATUS_EFFECT_PENDING,
    CallStatus.OUTCOME_READY: pb.TOOL_CALL_STATUS_OUTCOME_READY,
    CallStatus.COMPLETED: pb.TOOL_CALL_STATUS_COMPLETED,
}


def lease_of(operation: Operation) -> pb.Lease | None:
    """The live or lapsed lease of ``operation``; None when never leased or released."""
    if operation.lease_holder is None:
        return None
    lease = pb.Lease(token=operation.lease_token, driver_id=operation.lease_holder)
    if operation.lease_expires is not None:
        lease.expire_time.FromDatetime(operation.lease_expires)
    return lease


def operation_state(operation: Operation) -> pb.OperationState:
    """The run's durable state as the contract shows it."""
    state = pb.OperationState(
        operation_id=operation.operation_id,
        kind=operation.kind,
        phase=_PHASES[operation.phase],
        cancel_requested=operation.cancel_requested,
        turn_id=operation.turn_id or "",
        settings=settings_message(operation.settings),
        may_finish=operation.continuation == Continuation.MAY_FINISH,
    )
    lease = lease_of(operation)
    if lease is not None:
        state.lease.CopyFrom(lease)
    batch = operation.batch
    if batch is not None:
        state.assistant.CopyFrom(batch.assistant)
        for call in batch.calls:
            row = pb.ToolCallState(
                source_index=call.source_index,
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                result_entry_id=call.result_entry_id,
                status=_STATUSES[call.status],
                replay=pb.ReplayPolicy.ValueType(call.replay),
            )
            if call.arguments_json is not None:
                row.arguments_json = call.arguments_json
            if call.checkpoint is not None:
                row.checkpoint.CopyFrom(call.checkpoint)
            state.tool_calls.append(row)
    return state


def lease_asked(driver_id: str, seconds: int) -> tuple[str, int] | None:
    """The (driver id, seconds) lease a request asks for (0 seconds: the default), or None
    for an unleased operation (no driver id)."""
    return (driver_id, lease_length(seconds)) if driver_id else None


def lease_length(seconds: int) -> int:
    """A requested lease length in seconds, 0 meaning the default."""
    return seconds or DEFAULT_LEASE_SECONDS


def opened(response: type[R], t: OperationOpened) -> R:
    """The answer of a command opening an operation: its id, the lane's revision after it, and
    its lease (None: unleased)."""
    operation = t.operation
    return response(
        operation_id=operation.operation_id, revision=t.state.revision, lease=lease_of(operation)
    )
