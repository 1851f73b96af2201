"""The HTTP port's probe paths, for Kubernetes ``httpGet`` probes and load balancers:
``GET /livez`` (200 while the process answers) and ``GET /readyz`` (200 while ready, 503 with
the reason while not: the database unreachable or read-only, or shutdown begun). What live and
ready mean is in ``service/lane/server/app/readiness.py``; the gRPC health service says the same.

They need no token, like the gRPC health service: they reveal no lane. A probe comes by the
pod's IP (the kubelet sends ``Host: <pod IP>:<port>``) or by a host name the operator
configured; a Host check on this port must let those through.
"""

from __future__ import annotations

from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGISendCallable,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    Scope,
)

from lane.server.app.readiness import Readiness

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
PROBE_PATHS = frozenset({LIVENESS_PATH, READINESS_PATH})


class ProbeApp:
    """Answers :data:`PROBE_PATHS` (an ASGI app; other paths are not routed here)."""

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        assert scope["type"] == "http"
        if scope["method"] not in ("GET", "HEAD"):
            status, body, extra = 405, "use GET\n", [(b"allow", b"GET, HEAD")]
        elif scope["path"] == LIVENESS_PATH:
            status, body, extra = 200, "live\n", []
        elif self._readiness.ready:
            status, body, extra = 200, "ready\n", []
        else:
            status, body, extra = 503, f"not ready: {self._readiness.reason}\n", []
        payload = body.encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(payload)).encode()),
            (b"cache-control", b"no-store"),
            *extra,
        ]
        head = scope["method"] == "HEAD"
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": status,
            "headers": headers,
            "trailers": False,
        }
        await send(start)
        body_event: HTTPResponseBodyEvent = {
            "type": "http.response.body",
            "body": b"" if head else payload,
            "more_body": False,
        }
        await send(body_event)
