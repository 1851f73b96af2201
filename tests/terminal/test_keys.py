"""Terminal input as keys (pure): plain keys, the common forms of special keys, a lone Escape."""

from __future__ import annotations

import pytest
from lane.client.keys import ESCAPE, parse_keys


@pytest.mark.parametrize(
    ("data", "keys"),
    [
        (b"\x1b", [ESCAPE]),
        (b"q", ["q"]),
        (b"\x1b[A\x1b[B", ["up", "down"]),
        (b"\x1bOA", ["up"]),
        (b"\x1b[5~\x1b[6~", ["pageup", "pagedown"]),
        (b"\x1b[H\x1bOH\x1b[1~\x1b[7~", ["home"] * 4),
        (b"\x1b[F\x1bOF\x1b[4~\x1b[8~", ["end"] * 4),
        (b"\x1b[15~q", ["unknown", "q"]),  # F5 is skipped whole, not read as Escape then keys
        (b"\x1b[1;2A", ["unknown"]),
        (b"\x1bq", [ESCAPE, "q"]),
    ],
)
def test_parse_keys(data: bytes, keys: list[str]) -> None:
    assert parse_keys(data) == keys
