"""Importing the service registers no metric; the app's :func:`lane.server.metrics.install` makes
the process's one registry, which every later metric update lands in.

Run in a fresh interpreter: in the test process a server may have installed it already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, json, pkgutil
import prometheus_client
import lane.server

for module in pkgutil.walk_packages(lane.server.__path__, "lane.server."):
    if module.name.endswith("__main__"):
        continue  # runs the service when imported
    importlib.import_module(module.name)

from lane.server import metrics
from lane.server.api.instrument import method_metrics

def lane_metrics(registry):
    return sorted(family.name for family in registry.collect() if family.name.startswith("lane_"))

before = {
    "installed": metrics.current.registry is not None,
    "global": lane_metrics(prometheus_client.REGISTRY),
}
method_metrics("StartRun").answered("OK", "", 0.01)  # counted nowhere yet
registry = metrics.install()
method_metrics("StartRun").answered("OK", "", 0.01)
metrics.current.events_appended.inc(3)
print(json.dumps({
    **before,
    "same_again": metrics.install() is registry,
    "lane": lane_metrics(registry),
    "global_after": lane_metrics(prometheus_client.REGISTRY),
    "process": registry.get_sample_value("process_cpu_seconds_total") is not None,
    "start_runs": registry.get_sample_value(
        "lane_commands_total", {"method": "StartRun", "code": "OK"}
    ),
    "events": registry.get_sample_value("lane_events_appended_total"),
}))
"""


def test_importing_registers_nothing_and_install_makes_one_registry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["installed"] is False
    assert seen["global"] == []
    assert seen["global_after"] == []  # never prometheus_client's global registry
    assert seen["same_again"] is True
    assert "lane_commands" in seen["lane"] and "lane_watchers_active" in seen["lane"]
    assert seen["process"] is True
    # Counted once after install: the count made before it went nowhere.
    assert seen["start_runs"] == 1.0
    assert seen["events"] == 3.0
