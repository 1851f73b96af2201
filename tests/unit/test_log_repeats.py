"""RepeatLimiter: one line per kind per window, then the count of the repeats, on a clock and
a timer the tests drive (no real waiting)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from psycopg import OperationalError

from lane.server.api import errors
from lane.server.log_repeats import RepeatLimiter

NAME = "lane.test.repeats"


class Clock:
    """A clock the test moves, and the timers scheduled on it (run with :meth:`advance`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def schedule(self, delay: float, callback: Callable[[], None]) -> object:
        self.timers.append((self.now + delay, callback))
        return callback

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, callback in due:
            callback()


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.INFO, logger=NAME)
    return lambda: [r.getMessage() for r in caplog.records if r.name == NAME]


def limiter(clock: Clock, *, timers: bool = True) -> RepeatLimiter:
    return RepeatLimiter(
        logging.getLogger(NAME),
        10.0,
        clock=clock,
        schedule=clock.schedule if timers else (lambda delay, callback: None),
    )


def test_an_outage_writes_one_line_then_the_count_when_the_window_ends(lines) -> None:
    clock = Clock()
    log = limiter(clock)
    for n in range(1161):
        log.warning("database unavailable: %s", f"refused #{n}")
        clock.now += 0.008  # 1,161 calls in 9.3 s
    assert lines() == ["database unavailable: refused #0"]
    clock.advance(0.8)  # the window ends: its timer writes the count
    assert lines()[1:] == ["… 1,160 more in the last 10 s: database unavailable: refused #1160"]
    log.warning("database unavailable: %s", "refused again")  # a new window starts in full
    assert lines()[2:] == ["database unavailable: refused again"]


def test_without_a_timer_the_count_comes_with_the_next_line_of_its_kind(lines) -> None:
    clock = Clock()
    log = limiter(clock, timers=False)
    log.warning("busy: %s", 1)
    log.warning("busy: %s", 2)
    log.warning("busy: %s", 3)
    clock.advance(30)
    log.warning("busy: %s", 4)
    assert lines() == ["busy: 1", "… 2 more in the last 10 s: busy: 3", "busy: 4"]


def test_kinds_are_counted_apart_and_a_lone_line_has_no_count(lines) -> None:
    clock = Clock()
    log = limiter(clock)
    log.warning("busy: %s", "a")
    log.warning("down: %s", "b")
    log.warning("down: %s", "c")
    log.log(logging.INFO, "down: %s", "d")  # another level: another kind
    clock.advance(10)
    assert lines() == ["busy: a", "down: b", "down: d", "… 1 more in the last 10 s: down: c"]


def test_flush_writes_what_is_held_back_and_a_stale_timer_writes_nothing(lines) -> None:
    clock = Clock()
    log = limiter(clock)
    log.warning("down")
    log.warning("down")
    log.flush()
    assert lines() == ["down", "… 1 more in the last 10 s: down"]
    log.warning("down")  # a new window; the old one's timer is still scheduled
    clock.advance(10)
    assert lines()[2:] == ["down"]


def test_lines_below_the_loggers_level_are_not_counted(lines, caplog) -> None:
    caplog.set_level(logging.ERROR, logger=NAME)
    clock = Clock()
    log = limiter(clock)
    for _ in range(3):
        log.warning("quiet")
    clock.advance(10)
    log.flush()
    assert lines() == []


def test_the_error_table_rate_limits_database_warnings(monkeypatch, caplog) -> None:
    clock = Clock()
    monkeypatch.setattr(
        errors, "_outage_log", RepeatLimiter(errors.log, clock=clock, schedule=clock.schedule)
    )
    caplog.set_level(logging.WARNING, logger=errors.log.name)
    for _ in range(50):
        _, reason = errors.error_answer(OperationalError("connection refused"))
        assert reason == "UNAVAILABLE"
    clock.advance(10)
    assert [r.getMessage() for r in caplog.records if r.name == errors.log.name] == [
        "database unavailable: connection refused",
        "… 49 more in the last 10 s: database unavailable: connection refused",
    ]
