"""The service's layers import only earlier ones (docs/development.md): domain → store → hub →
commands → api → app. The contracts (lane.v1) are everyone's; metrics, logs and traces
(log_repeats too) everyone's but the domain's; gRPC is the api's and the app's alone. The
store is closed: outside ``store/`` nothing reaches its pool, cache or group committer, only
its methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service" / "lane" / "server"
LAYERS = ("domain", "store", "hub", "commands", "api", "app")
SHARED = ("metrics", "logs", "log_repeats", "traces")
#: Third-party packages a layer must not use, and the layers that must not.
FORBIDDEN = {
    "grpc": ("domain", "store", "hub", "commands"),
    "grpc_status": ("domain", "store", "hub", "commands"),
    "psycopg": ("domain", "commands"),
    "psycopg_pool": ("domain", "commands"),
}
#: Contract modules a layer must not use: the domain knows no service messages (requests,
#: responses, frames); it works on the lane's own values (lane.v1's snapshot, event, entry and
#: message types) and its own (domain/run_inputs.py).
FORBIDDEN_CONTRACTS = {"lane.v1.lane_service_pb2": ("domain",)}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``from lane.server import metrics``:
    ``lane.server.metrics``)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def violations(layer: str, root: Path = SERVICE) -> list[str]:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    if layer != "domain":
        allowed.update(SHARED)
    found = []
    for path in sorted((root / layer).rglob("*.py")):
        for module in sorted(imported(path)):
            parts = module.split(".")
            inner = parts[2:] if parts[:2] == ["lane", "server"] else []
            layered = bool(inner) and inner[0] in (*LAYERS, *SHARED)
            if layered and inner[0] not in allowed:
                found.append(f"{path.relative_to(root)} imports {module}")
            if layer in FORBIDDEN.get(parts[0], ()) or any(
                layer in layers and (module == name or module.startswith(f"{name}."))
                for name, layers in FORBIDDEN_CONTRACTS.items()
            ):
                found.append(f"{path.relative_to(root)} imports {module}")
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_earlier_layers(layer: str) -> None:
    assert violations(layer) == []


def test_the_check_catches_a_layer_reaching_up(tmp_path: Path) -> None:
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "bad.py").write_text(
        "import grpc\nfrom lane.server.api import base\nfrom lane.server import metrics\n"
        "from lane.server.store import Store\n"
    )
    assert violations("commands", tmp_path) == [
        "commands/bad.py imports grpc",
        "commands/bad.py imports lane.server.api",
        "commands/bad.py imports lane.server.api.base",
    ]


#: What a Store keeps to itself: the rest of the service calls its methods instead.
STORE_INSIDES = ("pool", "cache", "_cache", "committer")


def _last_name(node: ast.expr) -> str:
    """The name an expression ends in (``self.store``: ``store``), '' when none."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def store_insides_used(root: Path = SERVICE) -> list[str]:
    """Every use of a store's insides (``store.pool``, ``self.store.cache``, ...) outside
    ``store/``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root)
        if where.parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in STORE_INSIDES
                and "store" in _last_name(node.value).lower()
            ):
                found.append(f"{where}:{node.lineno} uses {_last_name(node.value)}.{node.attr}")
    return found


def test_nothing_outside_the_store_reaches_its_pool_or_cache() -> None:
    assert store_insides_used() == []


def test_the_check_catches_a_reach_into_the_store(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "app" / "bad.py").write_text(
        "async def f(store, hub):\n"
        "    async with store.pool.connection() as conn:\n"
        "        await conn.execute('SELECT 1')\n"
        "    return hub.store.cache.get(1), store.clock(), hub.cache\n"
    )
    (tmp_path / "store" / "fine.py").write_text("def g(self):\n    return self.store.pool\n")
    assert store_insides_used(tmp_path) == [
        "app/bad.py:2 uses store.pool",
        "app/bad.py:4 uses store.cache",
    ]


def test_the_domain_imports_no_service_messages(tmp_path: Path) -> None:
    assert not any("lane_service_pb2" in found for found in violations("domain"))
    (tmp_path / "domain").mkdir()
    (tmp_path / "domain" / "bad.py").write_text(
        "from lane.v1 import lane_service_pb2, snapshot_pb2\n"
        "from lane.v1.lane_service_pb2 import RunSettings\n"
    )
    assert violations("domain", tmp_path) == [
        "domain/bad.py imports lane.v1.lane_service_pb2",
        "domain/bad.py imports lane.v1.lane_service_pb2.RunSettings",
    ]
