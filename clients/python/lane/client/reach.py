"""Whether the lane service can be reached, and what to tell a person when it cannot.

gRPC reports a failed connection as UNAVAILABLE with a transport message such as ``failed to
connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote
host: Connection refused``. :func:`cause_of` shortens that to its cause (``connection refused``)
and :func:`explained` adds what to do about it, naming the target::

    cannot reach the lane service at 127.0.0.1:1: connection refused. Is the service running
    (lane serve)? Point --target or LANE_TARGET at it.

:func:`probe` makes one health check with a short deadline, so a wrong target fails in seconds
instead of after a command's whole retry budget.

The CLI and the SDK share the diagnosis; only the words of the fix differ (:data:`CLI` names
``--target`` and ``LANE_TLS``, :data:`SDK` names ``LaneClient``'s arguments), so a person reads
what to change where they made the mistake. :class:`Unreachable` is a
:class:`~lane.client.errors.LaneError` (UNAVAILABLE, or DEADLINE_EXCEEDED when nothing
answered): SDK callers catch it as any other failed call.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lane.client.errors import LaneError, lane_error

__all__ = [
    "CLI",
    "DEFAULT_PORT",
    "SDK",
    "FirstContact",
    "Unreachable",
    "Wording",
    "cause_of",
    "explained",
    "fix_for",
    "is_transport_failure",
    "normalize_target",
    "probe",
    "scheme_problem",
]

#: The port the service listens on by default (``LANE_LISTEN=127.0.0.1:50051``); a target
#: without a port means this one (gRPC itself would pick 443).
DEFAULT_PORT = 50051

_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")
_URL = re.compile(r"^(https?)://", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Wording:
    """How a fix names what a person changes: the CLI's options and variables, or the SDK's
    arguments. Each is a phrase the fixes below are made of."""

    #: Where the target is set.
    target: str
    #: Plaintext instead of TLS.
    no_tls: str
    #: TLS instead of plaintext.
    tls: str
    #: Trusting the service's CA.
    ca: str
    #: Presenting a client certificate.
    cert: str
    #: Passing a bearer token.
    token: str


#: The ``lane`` command's words.
CLI = Wording(
    target="--target or LANE_TARGET",
    no_tls="Drop --tls / LANE_TLS (and the certificate options)",
    tls="add --tls (and --ca-file) or set LANE_TLS=on",
    ca="Pass --ca-file (LANE_CA_FILE) with the CA that signed the service's certificate",
    cert="pass --cert-file and --key-file (LANE_CLIENT_CERT_FILE, LANE_CLIENT_KEY_FILE)",
    token="set LANE_TOKEN (or pass --token)",
)
#: The Python SDK's words (``LaneClient(target, credentials=..., token=...)``).
SDK = Wording(
    target="the target (LaneClient(target), open_channel(target))",
    no_tls="Connect without TLS credentials",
    tls="pass credentials=tls_credentials(ca_file=...) to LaneClient",
    ca="Pass the CA that signed the service's certificate: tls_credentials(ca_file=...)",
    cert="pass cert_file and key_file to tls_credentials(...)",
    token="pass token=... to LaneClient",
)

#: Pieces of gRPC transport messages, the cause they mean, and the fix to suggest (a
#: template of :class:`Wording` fields). The first match wins.
_CAUSES: tuple[tuple[str, str, str], ...] = (
    (
        "connection refused",
        "connection refused",
        "Is the service running (lane serve)? Point {target} at it.",
    ),
    (
        "wrong_version_number",
        "TLS handshake failed: the service does not speak TLS",
        "{no_tls}, or enable TLS on the service.",
    ),
    (
        "certificate_verify_failed",
        "TLS handshake failed: the service's certificate is not trusted",
        "{ca}.",
    ),
    (
        "certificate_required",
        "TLS handshake failed: the service requires a client certificate",
        "{Cert}.",
    ),
    (
        "handshake",
        "TLS handshake failed",
        "Check the CA, the client certificate and its key against the service's TLS settings.",
    ),
    ("domain name not found", "unknown host", "Check the host name in {target}."),
    ("errors resolving", "unknown host", "Check the host name in {target}."),
    (
        "shutting down",
        "the service is shutting down",
        "Wait for it to come back, or point {target} at another one.",
    ),
)
_SOCKET_CLOSED_PLAINTEXT = (
    "the connection was closed during set-up",
    "The service may require TLS: {tls}. Is {target} the lane service?",
)
_SOCKET_CLOSED_TLS = (
    "the connection was closed during set-up",
    "The service may require a client certificate: {cert}.",
)
_NO_ANSWER = (
    "no answer",
    "Is the host reachable and the port right? Check {target}, and firewalls.",
)


def _words(template: str, wording: Wording) -> str:
    phrases = {name: getattr(wording, name) for name in Wording.__slots__}
    phrases["Cert"] = wording.cert[:1].upper() + wording.cert[1:]
    return template.format(**phrases)


class Unreachable(LaneError):
    """The lane service at a target could not be reached; the message says why and what to
    do about it (``target``, ``cause``, ``fix``). UNAVAILABLE, or DEADLINE_EXCEEDED when
    nothing answered in time."""

    def __init__(
        self,
        target: str,
        cause: str,
        fix: str,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
    ) -> None:
        where = f" at {target}" if target else ""
        message = f"cannot reach the lane service{where}: {cause}." + (f" {fix}" if fix else "")
        super().__init__(code, "", message)
        self.target = target
        self.cause = cause
        self.fix = fix

    def __str__(self) -> str:
        return self.message + self.retries_note()

    def with_message(self, message: str) -> LaneError:
        error = Unreachable(self.target, self.cause, self.fix, self.code)
        error.message = message
        error.gave_up = self.gave_up
        return error


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


def scheme_problem(target: str, wording: Wording = CLI) -> str | None:
    """What is wrong with a ``target`` written as a URL (``http://host:port``: gRPC would take
    the scheme for a host name and report an unknown host); None when it is not one."""
    match = _URL.match(target.strip())
    if match is None:
        return None
    bare = target.strip()[match.end() :].rstrip("/")
    also = f" and {wording.tls}" if match.group(1).lower() == "https" else ""
    return f"the target is HOST:PORT, not a URL: drop the scheme ({bare!r}){also}"


def is_transport_failure(error: LaneError) -> bool:
    """Whether ``error`` is the transport's (no connection, no answer), not the service's
    answer: UNAVAILABLE or DEADLINE_EXCEEDED without an ErrorInfo reason."""
    codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return error.code in codes and not error.reason


def cause_of(error: LaneError, *, tls: bool = False) -> str:
    """The short cause of a transport failure (``connection refused``, ``unknown host``, ...),
    else the error's own message."""
    return _diagnose(error, tls=tls, wording=CLI)[0]


def fix_for(error: LaneError, *, tls: bool = False, wording: Wording = CLI) -> str:
    """What to do about ``error``: the fix :func:`explained` suggests (may be empty)."""
    return _diagnose(error, tls=tls, wording=wording)[1]


def explained(
    error: LaneError,
    target: str,
    *,
    tls: bool = False,
    wording: Wording = CLI,
    token: bool = False,
) -> LaneError:
    """``error`` from the service at ``target``, saying what to do about it (its ``str()`` is
    the message for a person): a transport
    failure as :class:`Unreachable` (the cause and the fix, in ``wording``), a refused token
    with how to pass one, a lane not found with a hint about namespaces when the caller sent a
    ``token``; any other error as it is."""
    if isinstance(error, Unreachable):
        return error
    if error.code == grpc.StatusCode.UNAUTHENTICATED:
        return error.with_message(
            f"{error.message}. The service at {target} needs a bearer token: {wording.token}, "
            "one of its LANE_AUTH_TOKENS"
        )
    if is_transport_failure(error):
        cause, fix = _diagnose(error, tls=tls, wording=wording)
        unreachable = Unreachable(target, cause, fix, error.code)
        unreachable.gave_up = error.gave_up
        return unreachable
    if token and error.reason == "LANE_NOT_FOUND":
        return error.with_message(
            f"{error.message}. With auth on, a token sees only its own namespace's lanes: is "
            "this the token the lane was made with?"
        )
    return error


def _diagnose(error: LaneError, *, tls: bool, wording: Wording) -> tuple[str, str]:
    message = error.message.lower()
    if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return _NO_ANSWER[0], _words(_NO_ANSWER[1], wording)
    for piece, cause, fix in _CAUSES:
        if piece in message:
            return cause, _words(fix, wording)
    if "socket closed" in message or "connection reset" in message:
        cause, fix = _SOCKET_CLOSED_TLS if tls else _SOCKET_CLOSED_PLAINTEXT
        return cause, _words(fix, wording)
    if error.reason:
        return str(error), ""
    return error.message or error.code.name, ""


async def probe(
    channel: grpc.aio.Channel,
    target: str,
    *,
    within: float,
    tls: bool,
    wording: Wording = CLI,
) -> None:
    """Check within ``within`` seconds that ``channel`` connects to a gRPC server; raise
    :class:`Unreachable` naming ``target``, the cause and the fix (in ``wording``) when it
    does not.

    Any answer to the health check counts (even UNIMPLEMENTED): the server is there. The
    service answers health checks without a token, so a missing token shows up later, on the
    first real call."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=within)
    except grpc.aio.AioRpcError as err:
        error = lane_error(err)
        if not is_transport_failure(error):
            return
        cause, fix = _diagnose(error, tls=tls, wording=wording)
        if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            cause = f"no answer within {within:g}s"
        raise Unreachable(target, cause, fix, error.code) from None


class FirstContact:
    """Failing fast on a stream: until :meth:`made` (the service sent something), a transport
    failure :meth:`check` sees raises :class:`Unreachable` once ``within`` seconds passed
    since this was made (None: never). Afterwards failures are left to the caller's retries."""

    def __init__(self, target: str, within: float | None, *, wording: Wording = SDK) -> None:
        self.target = target
        self.within = within
        self.wording = wording
        self._until = None if within is None else time.monotonic() + within

    def made(self) -> None:
        """The service answered: from now on, failures are outages to ride out."""
        self._until = None

    def check(self, error: LaneError) -> None:
        """Raise :class:`Unreachable` for ``error`` if it is a transport failure before first
        contact and the time to make it is up."""
        if self._until is None or not is_transport_failure(error):
            return
        if time.monotonic() >= self._until:
            cause, fix = _diagnose(error, tls=False, wording=self.wording)
            raise Unreachable(self.target, cause, fix, error.code) from error
