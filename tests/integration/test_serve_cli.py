"""``lane serve``: a flag per setting (flag beats environment beats default), a help that lists
every setting with its variable and default, docs/configuration.md's table generated from the
same settings, and bad flag values reported as the flag."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from lane.server.app.config import SETTINGS, Settings
from tests.integration.test_app import _free_port
from tests.support.servers import serving

ROOT = Path(__file__).resolve().parents[2]


def lane_env(**extra: str) -> dict[str, str]:
    """Our environment without LANE_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANE_")}
    env["GRPC_ENABLE_FORK_SUPPORT"] = "0"
    return env | extra


async def test_flags_beat_the_environment(fresh_database_url: str, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    # The environment holds values that would stop start-up: the flags must win over them.
    env = lane_env(LANE_LISTEN="nowhere", LANE_GRACE_SECONDS="soon", LANE_WORKERS="0")
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lane.client", "serve",
            "--listen", f"127.0.0.1:{port}", "--database-url", fresh_database_url,
            "--workers", "1", "--grace-seconds", "0.5", "--log-format", "json",
            env=env, cwd=tmp_path, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        assert await asyncio.wait_for(serving(port, process), 30), log.read_text()
        assert f"listening on 127.0.0.1:{port}" in log.read_text()
        assert log.read_text().lstrip().startswith("{")  # --log-format json took effect
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(process.wait(), 20)
    assert status == 0, log.read_text()


async def test_a_bad_flag_value_is_reported_as_the_flag(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lane.client", "serve", "--grace-seconds", "soon",
        "--data-dir", str(tmp_path / "data"),
        env=lane_env(), cwd=tmp_path, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert "configuration error: --grace-seconds 'soon': expected a number of seconds" in (
        err.decode()
    )
    assert not (tmp_path / "data").exists()


async def test_help_lists_every_setting_with_its_variable_and_default() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lane.client", "serve", "--help",
        env=lane_env(COLUMNS="200"), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    text = " ".join(out.decode().split())
    assert len(SETTINGS) >= 21
    for setting in SETTINGS:
        assert f"${setting.variable}" in text or setting.secret, setting
        assert setting.variable in text and setting.default in text, setting
        has_flag = re.search(re.escape(setting.flag) + r"(?![\w-])", text) is not None
        assert has_flag != setting.secret, setting


def test_the_configuration_doc_lists_every_setting() -> None:
    # docs/configuration.md's generated table: one row per variable, with its flag and default.
    doc = (ROOT / "docs" / "configuration.md").read_text()
    rows = {
        cells[0].strip("` "): cells
        for line in doc.splitlines()
        if line.startswith("| `LANE_")
        for cells in [line.strip("|").split(" | ")]
    }
    assert set(rows) == {setting.variable for setting in SETTINGS}
    for setting in SETTINGS:
        flag, default = rows[setting.variable][1:3]
        assert (setting.flag in flag) != setting.secret and setting.default in default, setting


def test_the_configuration_doc_is_generated_from_the_settings_table() -> None:
    # scripts/settings_doc.py --check renders SETTINGS and compares it with the doc's table.
    process = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "settings_doc.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr


class Recording(dict[str, str]):
    """An environment that notes every variable read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)


def test_settings_read_exactly_the_variables_of_the_table() -> None:
    environ = Recording()
    Settings.from_env(environ)
    assert environ.read == {setting.variable for setting in SETTINGS}
