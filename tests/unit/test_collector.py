"""The garbage collector's tuning for a serving process (service/lane/server/app/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from lane.server.app.collector import GEN0_THRESHOLD, tune_for_serving


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_collector")
def test_serving_freezes_what_start_up_left_and_collects_the_young_less_often() -> None:
    gc.unfreeze()
    _, older, oldest = gc.get_threshold()
    survivor = [object()]  # alive at start-up: frozen with the rest
    tune_for_serving()
    assert gc.get_threshold() == (GEN0_THRESHOLD, older, oldest)
    assert gc.get_freeze_count() > 0
    # Frozen: in none of the generations a collection walks.
    assert gc.is_tracked(survivor)
    assert all(tracked is not survivor for tracked in gc.get_objects())
