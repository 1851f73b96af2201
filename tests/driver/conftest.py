"""Every driver test runs twice: commands over a DriveLane session (the driver's default) and
as unary RPCs (``Driver(..., session=False)``). The tests build drivers without naming the
transport; the fixture changes the default of ``Driver(session=...)`` for the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lane.client.driver import Driver


@pytest.fixture(autouse=True, params=["session", "unary"])
def driver_transport(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """``session``: the default; ``unary``: drivers made in the test default to unary RPCs."""
    if request.param == "unary":
        defaults = Driver.__init__.__kwdefaults__
        assert defaults is not None and defaults["session"] is True
        monkeypatch.setitem(defaults, "session", False)
    yield request.param
