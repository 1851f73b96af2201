"""Errors of the Python lane client.

The service answers every refusal with a gRPC status carrying one ``google.rpc.ErrorInfo``
(domain ``lane.v1``) whose ``reason`` is stable and whose ``metadata`` holds the values of the
message (docs/contract.md). :func:`lane_error` turns a failed call into a :class:`LaneError` that
exposes them directly::

    try:
        await stub.GetLaneSnapshot(request)
    except grpc.aio.AioRpcError as err:
        raise lane_error(err) from err

A status without rich details (a transport failure such as UNAVAILABLE "connection refused")
gives an empty ``reason`` and empty ``metadata``.

The reasons a caller acts on have their own subclasses, so code says ``except StaleLease:``
rather than comparing strings. They are derived from the one list of reasons,
``lane.v1.Reason`` (``protos/lane/v1/reasons.proto``), which the TypeScript client's
generated code holds too; :attr:`LaneError.reason_code` is a refusal's reason as that enum::

    try:
        await client.acquire_operation(lane_id, operation_id, driver_id="worker-7")
    except LeaseHeld:
        ...  # another driver's lease is live: wait for it to lapse
"""

from __future__ import annotations

from typing import ClassVar

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from lane.v1 import reasons_pb2
from lane.v1.reasons_pb2 import Reason

__all__ = [
    "DEFAULT_ORPHAN_SECONDS",
    "LaneBusy",
    "LaneError",
    "LaneNotFound",
    "LeaseHeld",
    "NotReplayable",
    "OperationCancelled",
    "OperationNotOpen",
    "RequestIdReused",
    "RevisionOutOfRange",
    "StaleLease",
    "TooLarge",
    "TooManyWatchers",
    "Unauthenticated",
    "WatchProtocolError",
    "freeing_hint",
    "lane_error",
    "reason_name",
    "status_error",
]

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_PREFIX = "REASON_"


def reason_name(reason: Reason.ValueType) -> str:
    """The ErrorInfo ``reason`` string a :class:`Reason` travels as (``"LEASE_HELD"``)."""
    return Reason.Name(reason).removeprefix(_PREFIX)


def _reason_code(name: str) -> Reason.ValueType:
    try:
        return Reason.Value(_PREFIX + name) if name else reasons_pb2.REASON_UNSPECIFIED
    except ValueError:  # a reason newer than this client
        return reasons_pb2.REASON_UNSPECIFIED


class LaneError(Exception):
    """A failed lane service call: its status code, ErrorInfo reason and metadata, message.

    Raised as the subclass of its reason when it has one (:class:`StaleLease`, ...)."""

    #: The reasons a subclass stands for.
    reasons: ClassVar[frozenset[Reason.ValueType]] = frozenset()

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str = "",
        message: str = "",
        metadata: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(code, reason, message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})
        #: Seconds the service asked the caller to wait before trying again (its
        #: ``google.rpc.RetryInfo``), or None when it did not say.
        self.retry_after = retry_after
        #: Set when a caller retried the call and gave up: (attempts made, seconds spent).
        self.gave_up: tuple[int, float] | None = None

    @property
    def reason_code(self) -> Reason.ValueType:
        """:attr:`reason` as the contract's enum; ``REASON_UNSPECIFIED`` when there is none or
        this client does not know it."""
        return _reason_code(self.reason)

    def __str__(self) -> str:
        reason = f" {self.reason}" if self.reason else ""
        return f"{self.code.name}{reason}: {self.message}{self.retries_note()}"

    def retries_note(self) -> str:
        """`` (gave up after N attempts in S s)`` when the call was retried, else ``""``."""
        if self.gave_up is None:
            return ""
        attempts, seconds = self.gave_up
        return f" (gave up after {attempts} attempts in {seconds:.1f}s)"

    def with_message(self, message: str) -> LaneError:
        """This error (its class, code, reason, metadata) with another message."""
        error = type(self)(self.code, self.reason, message, self.metadata, self.retry_after)
        error.gave_up = self.gave_up
        return error

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, "
            f"message={self.message!r}, metadata={self.metadata!r})"
        )


class Unauthenticated(LaneError):
    """No token, or one the service does not know: fix the credentials."""

    reasons = frozenset({reasons_pb2.REASON_TOKEN_MISSING, reasons_pb2.REASON_TOKEN_UNKNOWN})


class LaneNotFound(LaneError):
    """The lane does not exist in the caller's namespace."""

    reasons = frozenset({reasons_pb2.REASON_LANE_NOT_FOUND})


class LaneBusy(LaneError):
    """The lane already has an open operation (``metadata["openOperationId"]``; who holds it:
    ``leaseHolder``, ``leaseExpires``, ``leaseLive``, ``cancelRequested``). Its text ends with
    how to free the lane (:func:`freeing_hint`)."""

    reasons = frozenset({reasons_pb2.REASON_LANE_BUSY})

    def __str__(self) -> str:
        hint = freeing_hint(self.metadata)
        return f"{super().__str__()}. {hint}" if hint else super().__str__()


#: How long the service waits after a lease lapsed before it ends the run itself, when its
#: operator kept the default (``LANE_ORPHAN_SECONDS``).
DEFAULT_ORPHAN_SECONDS = 600


def freeing_hint(metadata: dict[str, str]) -> str:
    """How to free a lane whose open operation a LANE_BUSY refusal describes (its metadata):
    ``lane abort``, a takeover once the lease lapsed, the service's orphan timeout."""
    lane = metadata.get("laneId", "")
    operation = metadata.get("openOperationId", "")
    if not lane or not operation:
        return ""
    abort = f"`lane abort {lane}` (or AbortOperation of {operation}; Driver.abort() in its driver)"
    if metadata.get("operationKind") == "run" and not metadata.get("leaseExpires"):
        return (
            f"To free the lane: {abort}, then end the run (EndRun: it is not leased, so any "
            "client may)"
        )
    takeover = f"Driver(...).recover({operation!r}) takes the run over"
    if metadata.get("leaseLive") != "false":
        ends = "when its driver winds it down, or at the latest once its lease lapses"
        when = f"once its lease lapses ({metadata.get('leaseExpires', '')})"
    else:
        ends = "within seconds: its lease lapsed, so the service ends it"
        when = "now (its lease lapsed: its driver is gone)"
    if metadata.get("cancelRequested") == "true":
        return f"Its abort was requested: the run ends {ends}. Or {takeover} {when}"
    return (
        f"To free the lane: {abort}; the run then ends {ends}. Or {takeover} {when}. Left "
        "alone, the service ends a run whose lease lapsed LANE_ORPHAN_SECONDS after it "
        f"({DEFAULT_ORPHAN_SECONDS} s by default)"
    )


class OperationNotOpen(LaneError):
    """The operation is not the lane's open one: it ended, or never was."""

    reasons = frozenset({reasons_pb2.REASON_OPERATION_NOT_OPEN})


class OperationCancelled(LaneError):
    """The run was aborted: it takes no new work (a turn, an intent); wind it down."""

    reasons = frozenset({reasons_pb2.REASON_OPERATION_CANCELLED})


class LeaseHeld(LaneError):
    """Another driver holds a live lease on the run: wait for it to lapse."""

    reasons = frozenset({reasons_pb2.REASON_LEASE_HELD})


class StaleLease(LaneError):
    """The lease token is not the run's current one (taken over or released): stop driving."""

    reasons = frozenset({reasons_pb2.REASON_STALE_LEASE})


class NotReplayable(LaneError):
    """The call may not be executed again (not replay-safe, or the run not taken over)."""

    reasons = frozenset({reasons_pb2.REASON_NOT_REPLAYABLE})


class RequestIdReused(LaneError):
    """The request id was used before with different content (or for another method)."""

    reasons = frozenset({reasons_pb2.REASON_REQUEST_ID_REUSED})


class TooLarge(LaneError):
    """The request, its commit, the lane's queue or an answer is over a limit: send less
    (``metadata`` names the part, its size and the limit)."""

    reasons = frozenset(
        {
            reasons_pb2.REASON_PAYLOAD_TOO_LARGE,
            reasons_pb2.REASON_COMMIT_TOO_LARGE,
            reasons_pb2.REASON_SNAPSHOT_TOO_LARGE,
            reasons_pb2.REASON_ANSWER_TOO_LARGE,
            reasons_pb2.REASON_QUEUE_FULL,
            reasons_pb2.REASON_TOO_MANY_TOOL_CALLS,
            reasons_pb2.REASON_TOO_MANY_CONTENT_BLOCKS,
            reasons_pb2.REASON_TOO_MANY_MESSAGES,
            reasons_pb2.REASON_TOO_MANY_TOOL_NAMES,
        }
    )


class TooManyWatchers(LaneError):
    """This server already streams the lane (or everything) to its limit of watchers: retry
    later, or on another server."""

    reasons = frozenset({reasons_pb2.REASON_TOO_MANY_WATCHERS})


class RevisionOutOfRange(LaneError):
    """A watch's ``after_revision`` is below the retention floor or above the head:
    re-snapshot."""

    reasons = frozenset({reasons_pb2.REASON_REVISION_OUT_OF_RANGE})


_TYPED: tuple[type[LaneError], ...] = (
    Unauthenticated,
    LaneNotFound,
    LaneBusy,
    OperationNotOpen,
    OperationCancelled,
    LeaseHeld,
    StaleLease,
    NotReplayable,
    RequestIdReused,
    TooLarge,
    TooManyWatchers,
    RevisionOutOfRange,
)
_BY_REASON: dict[str, type[LaneError]] = {
    reason_name(reason): cls for cls in _TYPED for reason in cls.reasons
}


def _error(
    code: grpc.StatusCode,
    reason: str,
    message: str,
    metadata: dict[str, str],
    retry_after: float | None = None,
) -> LaneError:
    """The :class:`LaneError` subclass of ``reason`` (the base class for the others)."""
    return _BY_REASON.get(reason, LaneError)(code, reason, message, metadata, retry_after)


class WatchProtocolError(Exception):
    """The WatchLane stream broke its contract (a revision gap or duplicate, a misplaced
    message). The watch stops rather than fold a history it cannot trust."""


def lane_error(err: grpc.aio.AioRpcError) -> LaneError:
    """The :class:`LaneError` of a failed call: code, message, and the ErrorInfo if any."""
    code = err.code()
    message = err.details() or ""
    reason = ""
    metadata: dict[str, str] = {}
    try:
        status = rpc_status.from_call(err)
    except ValueError:
        # The rich status disagrees with the call's own code or message: trust the call.
        status = None
    retry_after = None
    if status is not None:
        message = status.message or message
        reason, metadata = _error_info(status)
        retry_after = _retry_after(status)
    return _error(code, reason, message, metadata, retry_after)


def status_error(status: status_pb2.Status) -> LaneError:
    """The :class:`LaneError` of a ``google.rpc.Status`` (a DriveLane answer's ``error``): the
    same error :func:`lane_error` gives for the unary call refused with that status."""
    reason, metadata = _error_info(status)
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return _error(code, reason, status.message, metadata, _retry_after(status))


def _retry_after(status: status_pb2.Status) -> float | None:
    for detail in status.details:
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            return float(retry.retry_delay.ToTimedelta().total_seconds())
    return None


def _error_info(status: status_pb2.Status) -> tuple[str, dict[str, str]]:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason, dict(info.metadata)
    return "", {}
