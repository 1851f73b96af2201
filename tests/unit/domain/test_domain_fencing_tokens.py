"""Fencing tokens across a lane's incarnations (leases.granted): a lane deleted and created
again under its id is a later incarnation, and none of its tokens is one a driver of the
deleted lane may hold, even for a run with the same operation id."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from lane.server.domain import guards, lanes, leases, runs
from lane.server.domain.errors import Aborted
from lane.server.domain.state import LaneState
from tests.unit.domain.support import default_configuration, run_settings, user

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def leased_run(incarnation: int) -> LaneState:
    """A new lane of ``incarnation`` with run ``run-1`` leased to a driver."""
    state = replace(
        lanes.create_lane("lane", default_configuration(), NOW).state, incarnation=incarnation
    )
    return runs.start_run(
        state, "run-1", [user("go")], run_settings(), NOW, lambda: "e1", lease=("driver", 30)
    ).state


def token(state: LaneState) -> int:
    assert state.operation is not None
    return state.operation.lease_token


def test_a_later_incarnation_never_grants_a_token_of_an_earlier_one() -> None:
    earlier, later = leased_run(7), leased_run(8)
    assert token(earlier) == (7 << leases.TOKEN_BITS) + 1
    assert token(later) == (8 << leases.TOKEN_BITS) + 1
    # Takeovers go on counting within the incarnation, always below the next one's.
    operation = earlier.operation
    assert operation is not None
    taken = leases.granted(earlier, operation, "other", 30, NOW)
    assert token(earlier) < taken.lease_token < token(later)
    # The earlier lane's driver holds nothing of the later lane's run.
    assert later.operation is not None
    with pytest.raises(Aborted) as caught:
        guards.driving(later, "run-1", token(earlier))
    assert caught.value.reason == "STALE_LEASE"


def test_a_run_leased_before_its_lane_had_an_incarnation_keeps_counting_up() -> None:
    # Rows from before incarnations were numbered: a small token, then the incarnation's range.
    state = leased_run(0)
    assert token(state) == 1
    numbered = replace(state, incarnation=3)
    assert numbered.operation is not None
    assert leases.granted(numbered, numbered.operation, "d", 30, NOW).lease_token == (3 << 32) + 1
