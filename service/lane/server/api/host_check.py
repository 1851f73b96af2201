"""The HTTP port's answer to DNS rebinding: with auth off, only requests addressed to this
machine by a loopback name are served.

Auth off, anyone who reaches the port reaches every lane, and the service allows that only on
a loopback address. A browser reaches it too, from any page: a page whose own host name an
attacker makes resolve to 127.0.0.1 sends its requests here with that name as their ``Host``
(and its ``Origin``), and the browser lets the page read the answers, the origin being its own.
So, auth off, a request is served only when its ``Host``, and its ``Origin`` when it has one,
name a loopback host (``localhost``, ``127.0.0.1`` and the rest of ``127.0.0.0/8``, ``[::1]``),
the address the port is bound to, or a host of ``LANE_HTTP_ALLOWED_HOSTS``; any other is
refused PERMISSION_DENIED ``HOST_NOT_ALLOWED`` (the web view's files too, with HTTP 403).

Auth on, the check is off: a bearer token is no ambient credential a browser adds by itself,
so a rebound page gets no further than any other caller without a token, and a deployment
behind a proxy may use any host name.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

import grpc
from google.rpc import code_pb2

from lane.server.api.errors import status_of

#: ``LANE_HTTP_ALLOWED_HOSTS`` may name this to serve every host name (e.g. behind a proxy
#: that checks them itself).
ANY_HOST = "*"


def host_name(authority: str) -> str:
    """The host of a ``Host`` value (``name``, ``name:port``, ``[v6]:port``), lower case."""
    value = authority.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, colon, port = value.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        value = name
    return value.rstrip(".")


def is_loopback_host(name: str) -> bool:
    """Whether ``name`` (a host, without port or brackets) is this machine's loopback."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostCheck:
    """Which ``Host`` and ``Origin`` the HTTP port serves (see the module docstring)."""

    def __init__(self, *, enabled: bool, bound_host: str, allowed: Iterable[str] = ()) -> None:
        names = {host_name(name) for name in allowed}
        self._any = not enabled or ANY_HOST in names
        self._allowed = frozenset({*names, host_name(bound_host)})

    def allows(self, name: str) -> bool:
        """Whether requests naming host ``name`` (as :func:`host_name` reads it) are served."""
        return self._any or name in self._allowed or is_loopback_host(name)

    def refusal(self, host: str | None, origin: str | None) -> grpc.Status | None:
        """The PERMISSION_DENIED status for a request of these ``Host`` and ``Origin`` headers,
        or None when it is served. No ``Host`` (HTTP/1.0) or no ``Origin`` (not a browser's
        cross-origin request) is no refusal."""
        if self._any:
            return None
        if host is not None and not self.allows(host_name(host)):
            return _refused("Host", host)
        if origin is not None:
            # "null": a sandboxed page or a file, whose requests may come from anywhere.
            parts = urlsplit(origin.strip())
            if origin.strip() == "null" or not self.allows((parts.hostname or "").rstrip(".")):
                return _refused("Origin", origin)
        return None


def _refused(header: str, value: str) -> grpc.Status:
    return status_of(
        code_pb2.PERMISSION_DENIED,
        "HOST_NOT_ALLOWED",
        f"with auth off this port serves requests addressed to this machine's loopback "
        f"(localhost, 127.0.0.1, [::1]) only, and the {header} {value[:200]!r} is not; "
        "list the host in LANE_HTTP_ALLOWED_HOSTS, or turn auth on",
        {"header": header.lower(), "value": value[:200]},
    )
