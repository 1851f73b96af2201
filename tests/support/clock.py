"""A clock tests move forward, so leases lapse and runs orphan without anyone waiting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class OffsetClock:
    """The real time plus an offset only :meth:`advance` changes: a drop-in for the store's
    clock (``start_server(..., clock=clock)``). Time still flows, so commands keep their order;
    a test moves it past a lease or an orphan interval in one step instead of sleeping."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        """The time now, as the store reads it."""
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (never back: leases granted must not revive)."""
        assert seconds >= 0, "a clock moved back would revive lapsed leases"
        self.offset += timedelta(seconds=seconds)
