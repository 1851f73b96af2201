"""The HTTP port serves the web view's committed build (service/lane/server/web/static) at ``/``
beside the Connect app: the files byte for byte with their types and security headers, HEAD without
a body, 404 for other paths and 405 for other methods, while the service's methods still answer
under ``/lane.v1.LaneService/``."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lane.server.app.server import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

STATIC = Path(__file__).resolve().parents[2] / "service" / "lane" / "server" / "web" / "static"


def fetch(
    url: str, method: str = "GET", body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request; errors are answers too."""
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


@pytest.mark.parametrize(
    ("path", "name", "content_type"),
    [
        ("/", "index.html", "text/html; charset=utf-8"),
        ("/index.html", "index.html", "text/html; charset=utf-8"),
        ("/app.js", "app.js", "text/javascript; charset=utf-8"),
        ("/style.css", "style.css", "text/css; charset=utf-8"),
    ],
)
async def test_the_built_files_are_served(
    http_server: RunningServer, path: str, name: str, content_type: str
) -> None:
    url = f"http://127.0.0.1:{http_server.http_port}{path}"
    status, headers, body = await asyncio.to_thread(fetch, url)
    assert status == 200
    assert body == (STATIC / name).read_bytes()
    assert headers["content-type"] == content_type
    assert headers["content-security-policy"].startswith("default-src 'self'")
    assert headers["x-content-type-options"] == "nosniff"

    status, headers, body = await asyncio.to_thread(fetch, url, "HEAD")
    assert (status, body) == (200, b"")
    assert headers["content-length"] == str((STATIC / name).stat().st_size)


async def test_other_paths_and_methods_are_refused(http_server: RunningServer) -> None:
    base = f"http://127.0.0.1:{http_server.http_port}"
    status, _, _ = await asyncio.to_thread(fetch, f"{base}/secrets.txt")
    assert status == 404
    status, _, _ = await asyncio.to_thread(fetch, f"{base}/lane.v1.LaneServiceX/ListLanes")
    assert status == 404
    status, headers, _ = await asyncio.to_thread(fetch, f"{base}/", "POST", b"{}")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    # The service's methods are the Connect app's, beside the page.
    status, headers, body = await asyncio.to_thread(
        fetch, f"{base}/lane.v1.LaneService/ListLanes", "POST", b"{}"
    )
    assert status == 200 and headers["content-type"] == "application/json"
    assert body.startswith(b"{")
