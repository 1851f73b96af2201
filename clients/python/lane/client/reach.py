"""Whether the lane service can be reached, and what to tell a person when it cannot.

gRPC reports a failed connection as UNAVAILABLE with a transport message such as ``failed to
connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote
host: Connection refused``. :func:`cause_of` shortens that to its cause (``connection refused``)
and :func:`explain` adds what to do about it, naming the target::

    cannot reach the lane service at 127.0.0.1:1: connection refused. Is the service running
    (lane serve)? Point --target or LANE_TARGET at it.

:func:`probe` makes one health check with a short deadline, so a wrong target fails in seconds
instead of after a command's whole retry budget.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.errors import LaneError, lane_error

__all__ = [
    "DEFAULT_PORT",
    "Unreachable",
    "cause_of",
    "explain",
    "fix_for",
    "normalize_target",
    "probe",
]

#: The port the service listens on by default (``LANE_LISTEN=127.0.0.1:50051``); a target
#: without a port means this one (gRPC itself would pick 443).
DEFAULT_PORT = 50051

_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")

#: Pieces of gRPC transport messages, the cause they mean, and the fix to suggest. The first
#: match wins.
_CAUSES: tuple[tuple[str, str, str], ...] = (
    (
        "connection refused",
        "connection refused",
        "Is the service running (lane serve)? Point --target or LANE_TARGET at it.",
    ),
    (
        "wrong_version_number",
        "TLS handshake failed: the service does not speak TLS",
        "Drop --tls / LANE_TLS (and the certificate options), or enable TLS on the service.",
    ),
    (
        "certificate_verify_failed",
        "TLS handshake failed: the service's certificate is not trusted",
        "Pass --ca-file (LANE_CA_FILE) with the CA that signed the service's certificate.",
    ),
    (
        "certificate_required",
        "TLS handshake failed: the service requires a client certificate",
        "Pass --cert-file and --key-file (LANE_CLIENT_CERT_FILE, LANE_CLIENT_KEY_FILE).",
    ),
    (
        "handshake",
        "TLS handshake failed",
        "Check --ca-file, --cert-file and --key-file against the service's TLS settings.",
    ),
    (
        "domain name not found",
        "unknown host",
        "Check the host name in --target or LANE_TARGET.",
    ),
    (
        "errors resolving",
        "unknown host",
        "Check the host name in --target or LANE_TARGET.",
    ),
    (
        "shutting down",
        "the service is shutting down",
        "Wait for it to come back, or point --target or LANE_TARGET at another one.",
    ),
)
_SOCKET_CLOSED_PLAINTEXT = (
    "the connection was closed during set-up",
    "The service may require TLS: add --tls (and --ca-file) or set LANE_TLS=on. Is --target "
    "or LANE_TARGET the lane service?",
)
_NO_ANSWER = (
    "no answer",
    "Is the host reachable and the port right? Check --target or LANE_TARGET, and firewalls.",
)


class Unreachable(Exception):
    """The lane service at a target could not be reached; the message says why and what to
    do about it."""

    def __init__(self, target: str, cause: str, fix: str) -> None:
        super().__init__(f"cannot reach the lane service at {target}: {cause}. {fix}")
        self.target = target
        self.cause = cause
        self.fix = fix


def normalize_target(target: str) -> str:
    """``target`` with :data:`DEFAULT_PORT` added when it names a host without a port
    (``localhost``, ``10.0.0.5``, ``[::1]``, ``::1``). Targets with a URI scheme
    (``dns:///...``, ``unix:...``) are left to gRPC."""
    target = target.strip()
    if not target or "://" in target or target.startswith(_SCHEMES):
        return target
    if target.startswith("["):
        return target if "]:" in target else f"{target}:{DEFAULT_PORT}"
    if target.count(":") > 1:  # a bare IPv6 address
        return f"[{target}]:{DEFAULT_PORT}"
    if ":" in target:
        return target
    return f"{target}:{DEFAULT_PORT}"


def cause_of(error: LaneError, *, tls: bool = False) -> str:
    """The short cause of a transport failure (``connection refused``, ``unknown host``, ...),
    else the error's own message."""
    return _diagnose(error, tls=tls)[0]


def fix_for(error: LaneError, *, tls: bool = False) -> str:
    """What to do about ``error``: the fix :func:`explain` suggests (may be empty)."""
    return _diagnose(error, tls=tls)[1]


def explain(error: LaneError, target: str, *, tls: bool = False) -> str:
    """A message for a person about ``error`` from the service at ``target``: the cause and
    the fix for transport failures and refused tokens; the error itself otherwise."""
    if error.code == grpc.StatusCode.UNAUTHENTICATED:
        return (
            f"{error}. The service at {target} needs a bearer token: set LANE_TOKEN "
            "(or pass --token) to one of its LANE_AUTH_TOKENS."
        )
    if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and (
        not error.reason
    ):
        cause, fix = _diagnose(error, tls=tls)
        return str(Unreachable(target, cause, fix))
    return str(error)


def _diagnose(error: LaneError, *, tls: bool) -> tuple[str, str]:
    message = error.message.lower()
    if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return _NO_ANSWER
    for piece, cause, fix in _CAUSES:
        if piece in message:
            return cause, fix
    if "socket closed" in message or "connection reset" in message:
        if not tls:
            return _SOCKET_CLOSED_PLAINTEXT
        return (
            "the connection was closed during set-up",
            "The service may require a client certificate: pass --cert-file and --key-file.",
        )
    if error.reason:
        return str(error), ""
    return error.message or error.code.name, ""


async def probe(channel: grpc.aio.Channel, target: str, *, within: float, tls: bool) -> None:
    """Check within ``within`` seconds that ``channel`` connects to a gRPC server; raise
    :class:`Unreachable` naming ``target``, the cause and the fix when it does not.

    Any answer to the health check counts (even UNIMPLEMENTED): the server is there. The
    service answers health checks without a token, so a missing token shows up later, on the
    first real call."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=within)
    except grpc.aio.AioRpcError as err:
        error = lane_error(err)
        if error.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return
        cause, fix = _diagnose(error, tls=tls)
        if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            cause = f"no answer within {within:g}s"
        raise Unreachable(target, cause, fix) from None
