"""The web view of the HTTP port: the built page at ``/`` as an ASGI application.

``static/`` is the build of ``clients/typescript/web`` (``node clients/typescript/web/build.mjs``),
committed and shipped as package data, so serving the page needs no Node; the TypeScript test
script fails when it is stale. Never edit it by hand.

The files are read once, when the application is made, and served from memory: a page, its
script and its stylesheet, each with headers that keep the page to its own origin.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

#: URL path → file in ``static/``.
_ROUTES = {
    "/": "index.html",
    "/index.html": "index.html",
    "/app.js": "app.js",
    "/style.css": "style.css",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
#: The page loads only its own files and calls only its own origin (Connect, same port).
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    # Revalidated at each load: a new build of the service serves a new page at once.
    (b"cache-control", b"no-cache"),
]


@dataclass(frozen=True, slots=True)
class _File:
    body: bytes
    content_type: bytes


def _load() -> dict[str, _File]:
    static = resources.files(__name__) / "static"
    files: dict[str, _File] = {}
    for path, name in _ROUTES.items():
        suffix = name[name.rfind(".") :]
        files[path] = _File(static.joinpath(name).read_bytes(), _TYPES[suffix].encode())
    return files


class WebViewApp:
    """Serves the web view's files (GET and HEAD); 404 for any other path, 405 for any other
    method."""

    def __init__(self) -> None:
        self._files = _load()

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """Answer one HTTP request."""
        if scope["type"] != "http":
            return
        found = self._files.get(scope["path"])
        method = scope["method"]
        if found is None:
            await _plain(send, 404, b"not found\n")
        elif method not in ("GET", "HEAD"):
            await _plain(send, 405, b"method not allowed\n", [(b"allow", b"GET, HEAD")])
        else:
            headers = [
                (b"content-type", found.content_type),
                (b"content-length", str(len(found.body)).encode()),
                *_SECURITY_HEADERS,
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            body = b"" if method == "HEAD" else found.body
            await send({"type": "http.response.body", "body": body, "more_body": False})


async def _plain(
    send: ASGISendCallable,
    status: int,
    text: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(text)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text, "more_body": False})
