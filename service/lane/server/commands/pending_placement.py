"""Finishing a placement its own StageToolOutcome could not commit.

StageToolOutcome commits the staging, then the placement (tools.py). When the placement commit
fails after the staging committed (the database went away between the two; the caller was
answered UNAVAILABLE), the batch's ready prefix is left unplaced. A retry with the request id
places it; one without is refused (the call is staged). So that no batch waits on the caller,
the service finishes the placement itself, in a placement commit of its own:

- a command refused FAILED_PRECONDITION on a lane whose batch has a pending placement places it
  and runs again (a retried StageToolOutcome without request id is still refused, the call being
  staged, but the batch is placed; a StartTurn or EndRun sent after the unplaced batch runs);
- the reconciler places pending prefixes of lanes that stayed quiet (maintenance.py).

The refused command itself still writes nothing: the placement is the earlier command's.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from lane.server.domain import placement
from lane.server.domain.errors import LaneError
from lane.server.domain.ids import new_id
from lane.server.domain.state import LaneState
from lane.server.domain.transition import Transition
from lane.server.store import LaneRef, Store

log = logging.getLogger(__name__)

#: How long a lane stays quiet before the reconciler places a pending prefix: far longer than
#: a StageToolOutcome takes between its two commits.
QUIET_BEFORE_PLACING = timedelta(seconds=5)


def known_pending(store: Store, lane: LaneRef) -> bool:
    """Whether the lane as this process last saw it (its cached state) has a pending
    placement: no query (the store keeps the state a refusal was decided on)."""
    known = store.known_state(lane)
    return known is not None and placement.placement_pending(known)


async def finish_placement(store: Store, lane: LaneRef) -> tuple[str, ...]:
    """Place the lane's ready prefix, if any, as its own commit (decided again on the lane's
    current state); the ids of the calls placed."""

    def step(state: LaneState, now: datetime) -> tuple[Transition, tuple[str, ...]]:
        t = placement.place_ready(state, now, new_id)
        return t, t.placed_tool_call_ids

    return await store.command(lane, step)


async def place_quiet_pending(
    store: Store, quiet_for: timedelta = QUIET_BEFORE_PLACING
) -> list[tuple[LaneRef, tuple[str, ...]]]:
    """The reconciler's pass: finish the pending placements of lanes quiet for ``quiet_for``;
    each lane placed and the calls placed there."""
    placed: list[tuple[LaneRef, tuple[str, ...]]] = []
    for lane in await store.lanes_awaiting_placement(quiet_for):
        try:
            ids = await finish_placement(store, lane)
        except LaneError as exc:
            # A lane that cannot be placed (corrupt state) must not hold up the others.
            log.warning(
                "cannot place the ready calls of lane %s/%s: %s %s",
                lane.namespace,
                lane.lane_id,
                exc.reason,
                exc.message,
            )
            continue
        if ids:
            placed.append((lane, ids))
    return placed
