"""Preconditions shared by the command transitions."""

from __future__ import annotations

from datetime import datetime

from lane.v1 import snapshot_pb2

from lane.server.domain.errors import Aborted, FailedPrecondition, NotFound
from lane.server.domain.state import LaneState, Operation, Phase, ToolBatch, ToolCall


def require_no_operation(state: LaneState, now: datetime | None = None) -> None:
    """Refuse to open an operation while another is open. The refusal says who holds the open
    one (its lease: live or lapsed at ``now``, when given) and whether its abort was requested,
    so a caller can tell how to free the lane: abort it, take it over once the lease lapsed, or
    wait for the service to end it."""
    operation = state.operation
    if operation is None:
        return
    kind = "compaction" if operation.kind == snapshot_pb2.OPERATION_KIND_COMPACTION else "run"
    holder = operation.lease_holder or ""
    expires = operation.lease_expires.isoformat() if operation.lease_expires else ""
    live = None if now is None else operation.lease_live(now)
    if not holder:
        owner = "not leased" if operation.lease_token == 0 else "its lease was released"
    elif live is False:
        owner = f"driver {holder}'s lease lapsed at {expires}"
    else:
        owner = f"leased to driver {holder} until {expires}"
    aborting = "; abort requested" if operation.cancel_requested else ""
    lease = {} if live is None else {"leaseLive": str(live).lower()}
    raise FailedPrecondition(
        "LANE_BUSY",
        f"lane {state.lane_id} already has open operation {operation.operation_id} "
        f"(a {kind}, {owner}{aborting})",
        laneId=state.lane_id,
        openOperationId=operation.operation_id,
        operationKind=kind,
        leaseHolder=holder,
        leaseExpires=expires,
        cancelRequested=str(operation.cancel_requested).lower(),
        **lease,
    )


def open_operation(state: LaneState, operation_id: str) -> Operation:
    """The lane's open operation with this id (of any kind), or the refusal."""
    operation = state.operation
    if operation is None or operation.operation_id != operation_id:
        raise FailedPrecondition(
            "OPERATION_NOT_OPEN",
            f"operation {operation_id} is not the open operation of lane {state.lane_id}",
            laneId=state.lane_id,
            operationId=operation_id,
            openOperationId=operation.operation_id if operation else "",
        )
    return operation


def open_run(state: LaneState, operation_id: str) -> Operation:
    """The lane's open run with this id, or the refusal that says why not."""
    operation = open_operation(state, operation_id)
    if operation.kind != snapshot_pb2.OPERATION_KIND_RUN:
        raise FailedPrecondition(
            "OPERATION_NOT_A_RUN",
            f"operation {operation_id} is not a run",
            operationId=operation_id,
        )
    return operation


def require_phase(operation: Operation, *phases: Phase) -> None:
    """Refuse unless the run is in one of ``phases``."""
    if operation.phase not in phases:
        raise FailedPrecondition(
            "WRONG_RUN_PHASE",
            f"operation {operation.operation_id} is {operation.phase.value}; "
            f"this command needs {' or '.join(p.value for p in phases)}",
            operationId=operation.operation_id,
            phase=operation.phase.value,
        )


def require_not_cancelled(operation: Operation) -> None:
    """Refuse new work once the operation's abort was requested."""
    if operation.cancel_requested:
        raise FailedPrecondition(
            "OPERATION_CANCELLED",
            f"operation {operation.operation_id} is aborting; it accepts no new work",
            operationId=operation.operation_id,
        )


def batch_call(operation: Operation, tool_call_id: str) -> tuple[ToolBatch, ToolCall]:
    """The current batch and its call ``tool_call_id``."""
    require_phase(operation, Phase.TOOLS)
    batch = operation.batch
    assert batch is not None  # phase TOOLS always has a batch
    call = batch.call(tool_call_id)
    if call is None:
        raise NotFound(
            "TOOL_CALL_NOT_FOUND",
            f"tool call {tool_call_id} is not in the current batch",
            toolCallId=tool_call_id,
            turnId=batch.turn_id,
        )
    return batch, call


def driving(state: LaneState, operation_id: str, lease_token: int) -> Operation:
    """The open run, if ``lease_token`` may drive it: the current token of a leased run, or 0
    for a run that was never leased. Anything else is a stale or foreign driver."""
    operation = open_run(state, operation_id)
    check_token(operation, lease_token)
    return operation


def check_token(operation: Operation, lease_token: int) -> None:
    """Refuse a stale or foreign ``lease_token`` (0 drives a run that was never leased)."""
    operation_id = operation.operation_id
    if operation.lease_token == 0 and lease_token == 0:
        return
    if lease_token != operation.lease_token or operation.lease_holder is None:
        raise Aborted(
            "STALE_LEASE",
            f"lease token {lease_token} does not hold operation {operation_id}"
            + (" (it is leased: commands must carry its token)" if lease_token == 0 else ""),
            operationId=operation_id,
            leaseToken=lease_token,
        )
