"""Domain errors: every refusal the state machine can give, each with a stable reason.

Every error maps to exactly one gRPC status code (the api layer's one error table reads
``code``) and carries a stable ``reason`` for ``google.rpc.ErrorInfo`` plus ``metadata`` naming
every dynamic value in the message::

    LaneError
    ├── InvalidArgument      malformed request, whatever the state
    ├── NotFound             no such lane / operation / tool call
    ├── AlreadyExists        request id reused with different content
    ├── FailedPrecondition   the state machine forbids the command now
    ├── Aborted              lost a race; retry the whole step
    ├── OutOfRange           revision below the retention floor or beyond the head
    ├── ResourceExhausted    a limit was hit
    └── Corruption           durable state violates an invariant (capture faults loudly)
"""

from __future__ import annotations

from enum import Enum


class Code(Enum):
    """The status codes the service answers with (names as in google.rpc.Code)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DATA_LOSS = "DATA_LOSS"


class LaneError(Exception):
    """A refused command. Nothing was written."""

    code: Code = Code.FAILED_PRECONDITION
    #: When set, how long the caller should wait before trying again (a transient refusal).
    retry_after_seconds: float | None = None

    def __init__(self, reason: str, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {key: str(value) for key, value in metadata.items()}


class InvalidArgument(LaneError):
    """The request is malformed, whatever the lane's state."""

    code = Code.INVALID_ARGUMENT


class NotFound(LaneError):
    """The lane, operation or tool call does not exist."""

    code = Code.NOT_FOUND


class AlreadyExists(LaneError):
    """The request id was used before with different content."""

    code = Code.ALREADY_EXISTS


class FailedPrecondition(LaneError):
    """The lane's state forbids the command."""

    code = Code.FAILED_PRECONDITION


class Aborted(LaneError):
    """The command lost a race; retry the whole step."""

    code = Code.ABORTED


class OutOfRange(LaneError):
    """A revision below the retention floor or beyond the head."""

    code = Code.OUT_OF_RANGE


class ResourceExhausted(LaneError):
    """A published limit was hit."""

    code = Code.RESOURCE_EXHAUSTED


class Corruption(LaneError):
    """Durable state violates an invariant; the lane needs repair, not a retry."""

    code = Code.DATA_LOSS
