"""The two distributions as users install them, from their wheels.

``lane-client`` (``clients/python``) and ``lane-service`` (the root) are built with
``pip wheel --no-deps`` and installed into fresh virtualenvs, their dependencies resolved by pip
as configured on the machine (its cache makes a re-run quick):

- the client wheel alone: no database package and no server importable, ``lane serve`` says how
  to install the server, the README's "A driver in Python" runs against the real service and
  type-checks under ``mypy --strict`` against the installed wheel (its ``py.typed`` markers);
- the server wheel beside it: ``lane serve`` starts on a fresh database (the migrations ship),
  serves the web view's page (the static files ship) and answers the client-only ``lane``.

Slow (two virtualenvs, a few dozen packages installed): ``-m 'not slow'`` leaves it out.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import pytest
from lane.client.cli_serve import SERVER_NOT_INSTALLED, SERVER_PACKAGE

from lane.server.app.server import RunningServer
from tests.integration.test_readme_example import example as readme_driver
from tests.support.servers import serving

pytestmark = [
    pytest.mark.slow,
    # Building and installing take most of it: ~40 s with a warm pip cache.
    pytest.mark.timeout(600),
]

ROOT = Path(__file__).resolve().parents[2]
CLIENT_SOURCE = ROOT / "clients" / "python"
#: What a driver author must never get with the client.
SERVER_ONLY = (SERVER_PACKAGE, "psycopg", "psycopg_pool", "pgserver", "prometheus_client")
#: The server package's directory in its wheel.
SERVER_DIR = SERVER_PACKAGE.replace(".", "/")


@dataclass(frozen=True)
class Wheels:
    client: Path
    server: Path


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def lane(self) -> Path:
        return self.path / "bin" / "lane"


def outside_env() -> dict[str, str]:
    """Our environment minus what would leak this checkout or its settings into a venv."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LANE_")}


def pip(*args: str | Path) -> None:
    """This interpreter's pip; fails the test with pip's output when pip fails."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--quiet", *map(str, args)],
        capture_output=True,
        text=True,
        env=outside_env(),
        timeout=540,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def make_venv(path: Path, *wheels: Path) -> Venv:
    """A fresh virtualenv holding ``wheels`` and their dependencies (this interpreter's pip
    installs into it: ``pip --python``)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    venv = Venv(path)
    pip("--python", venv.python, "install", *wheels)
    return venv


def only(found: list[Path]) -> Path:
    assert len(found) == 1, found
    return found[0]


def metadata(wheel: Path) -> tuple[list[str], list[str]]:
    """The wheel's file names and its Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = archive.read(meta_name)
    requires = HeaderParser().parsestr(meta.decode()).get_all("Requires-Dist") or []
    return names, requires


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def run(*args: str | Path, cwd: Path) -> tuple[int, str, str]:
    """Run a command to its end (two minutes at most): its status, output and errors."""
    process = await asyncio.create_subprocess_exec(
        *map(str, args),
        cwd=cwd,
        env=outside_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    out = tmp_path_factory.mktemp("wheels")
    # No build isolation: hatchling comes with the dev extra, so no build environment is made.
    for source in (CLIENT_SOURCE, ROOT):
        pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", out, source)
    return Wheels(
        client=only(sorted(out.glob("lane_client-*.whl"))),
        server=only(sorted(out.glob("lane_service-*.whl"))),
    )


@pytest.fixture(scope="module")
def client_venv(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("client") / "venv", wheels.client)


@pytest.fixture(scope="module")
def server_venv(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("server") / "venv", wheels.client, wheels.server)


def test_each_wheel_holds_its_own_packages(wheels: Wheels) -> None:
    names, requires = metadata(wheels.client)
    packaged = {name.split("/")[0] for name in names if not name.startswith("lane_client-")}
    assert packaged == {"lane"}
    for marker in ("lane/py.typed", "lane/client/py.typed", "lane/v1/py.typed"):
        assert marker in names
    assert {"lane/limits.py", "lane/v1/lane_service_pb2.py", "lane/client/driver.py"} <= set(names)
    assert not [n for n in names if n.endswith("__init__.py") and n.count("/") == 1]  # namespace
    required = {re.split(r"[^A-Za-z0-9_.-]", line, maxsplit=1)[0].lower() for line in requires}
    assert not required & {"psycopg", "psycopg-pool", "pgserver", "prometheus-client"}
    assert {"grpcio", "protobuf", "jsonschema", "openai", "anthropic"} <= required

    client_names = set(names)
    names, requires = metadata(wheels.server)
    assert [n for n in names if not n.startswith((f"{SERVER_DIR}/", "lane_service-"))] == []
    assert client_names.isdisjoint(names)  # no file in both: either uninstalls cleanly
    assert f"{SERVER_DIR}/web/static/index.html" in names
    assert f"{SERVER_DIR}/store/schema/0001_initial.sql" in names
    version = wheels.client.name.split("-")[1]
    assert f"lane-client=={version}" in requires


@pytest.mark.asyncio(loop_scope="session")
async def test_the_client_alone_drives_a_lane(
    wheels: Wheels, client_venv: Venv, lane_server: RunningServer, tmp_path: Path
) -> None:
    """Run from a directory outside the checkout, so nothing of it is importable by accident."""
    probe = f"import importlib.util as u; print([n for n in {SERVER_ONLY!r} if u.find_spec(n)])"
    status, out, err = await run(client_venv.python, "-c", probe, cwd=tmp_path)
    assert status == 0, err
    assert out.strip() == "[]"

    status, out, err = await run(client_venv.lane, "--version", cwd=tmp_path)
    version = wheels.client.name.split("-")[1]
    assert (status, out) == (0, f"lane {version}\n"), err

    status, out, err = await run(client_venv.lane, "serve", cwd=tmp_path)
    assert (status, err.strip()) == (1, SERVER_NOT_INSTALLED)
    assert "Traceback" not in out + err
    status, out, err = await run(client_venv.lane, "serve", "--help", cwd=tmp_path)
    assert status == 0, err
    assert "pip install lane-service" in " ".join(out.split())

    code = readme_driver()
    assert '"127.0.0.1:50051"' in code
    code = code.replace('"127.0.0.1:50051"', f'"127.0.0.1:{lane_server.port}"')
    status, out, err = await run(client_venv.python, "-c", code, cwd=tmp_path)
    assert status == 0, err
    assert out.split() == ["completed"]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_driver_type_checks_against_the_client_wheel(
    client_venv: Venv, tmp_path: Path
) -> None:
    """mypy --strict sees the installed wheel's types (PEP 561), not Any: the README's driver
    passes, and one wrong use of lane.client and of lane.limits is each reported."""
    (tmp_path / "driver.py").write_text(readme_driver())
    (tmp_path / "wrong.py").write_text(
        "from lane.client import ToolResult\n"
        "from lane.limits import MAX_LEASE_SECONDS\n"
        "seconds: str = MAX_LEASE_SECONDS\n"
        "result: int = ToolResult(content='x')\n"
    )
    mypy = (sys.executable, "-m", "mypy", "--strict", "--no-incremental")
    where = ("--python-executable", client_venv.python, "--cache-dir", tmp_path / "cache")
    status, out, err = await run(*mypy, *where, "driver.py", cwd=tmp_path)
    assert status == 0, out + err
    status, out, err = await run(*mypy, *where, "wrong.py", cwd=tmp_path)
    assert status == 1, out + err
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["3", "4"], out
    assert '"int", variable has type "str"' in errors[0]
    assert '"ToolResult", variable has type "int"' in errors[1]


@pytest.mark.asyncio(loop_scope="session")
async def test_the_server_wheel_serves(
    wheels: Wheels, server_venv: Venv, client_venv: Venv, fresh_database_url: str, tmp_path: Path
) -> None:
    status, out, err = await run(server_venv.lane, "serve", "--help", cwd=tmp_path)
    assert status == 0, err
    assert "--database-url" in out and "not installed" not in out

    port, http_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            server_venv.lane, "serve", "--listen", f"127.0.0.1:{port}",
            "--http-listen", f"127.0.0.1:{http_port}", "--database-url", fresh_database_url,
            "--workers", "1", "--grace-seconds", "0.5",
            cwd=tmp_path, env=outside_env(), stdout=sink, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        assert await asyncio.wait_for(serving(port, process), 60), log.read_text()
        # The client-only install's `lane` against the server wheel's service.
        status, out, err = await run(
            client_venv.lane, "lanes", "--target", f"127.0.0.1:{port}", cwd=tmp_path
        )
        assert status == 0, out + err
        page = await asyncio.to_thread(fetch, f"http://127.0.0.1:{http_port}/")
        with zipfile.ZipFile(wheels.server) as archive:
            assert page == archive.read(f"{SERVER_DIR}/web/static/index.html")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(process.wait(), 30)
    assert status == 0, log.read_text()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body: bytes = answer.read()
        return body
