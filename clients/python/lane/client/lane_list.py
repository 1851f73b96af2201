"""Follow many lanes at once: a live lane list, from one WatchLanes stream.

:func:`watch_lanes` wraps the stream (docs/contract.md, WatchLanes) in an async iterator of
:class:`LanesView`::

    async for view in watch_lanes(stub, prefix="team-"):
        render(view.lanes)             # every matching lane's summary, by lane id

The first view comes once the listing is complete; then one view per message of changes (a
lane's new summary, or its removal: deleted, or out of the requested statuses), and optionally
one per heartbeat. A slow reader misses nothing that matters: the service sends each lane's
latest state, never a backlog.

Recovery, without the caller noticing: when the stream fails for a reason a watch resumes after
(UNAVAILABLE, a dropped connection, ``WATCHER_TOO_SLOW``, ``DATABASE_BUSY``,
``TOO_MANY_WATCHERS``, or nothing for ``idle_timeout``: see :func:`lane.client.watch.recovery_for`),
the iterator calls WatchLanes again after a backoff and yields the new listing with
``relisted=True``: the lanes are replaced, not merged (a lane deleted meanwhile is simply not
in it). Any other failure ends the iteration with :class:`~lane.client.errors.LaneError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

import grpc
from lane.client.errors import LaneError, WatchProtocolError, lane_error
from lane.client.retry import RetryPolicy
from lane.client.watch import DEFAULT_RETRY, Recovery, recovery_for
from lane.v1 import lane_service_pb2

if TYPE_CHECKING:
    from lane.v1.lane_service_pb2_grpc import LaneServiceAsyncStub

__all__ = ["LanesView", "watch_lanes"]

_log = logging.getLogger(__name__)

LaneSummary = lane_service_pb2.LaneSummary
LaneRemoval = lane_service_pb2.LaneRemoval


@dataclass(frozen=True, slots=True)
class LanesView:
    """What the watch shows after each step.

    ``lanes``
        Every matching lane's latest summary, by lane id: a read-only view of the watch's own
        mapping, which the next step updates in place (copy it to keep a step's state).
    ``changed``
        The summaries this step brought (the whole listing for the first view and after a
        re-listing).
    ``removed``
        The lanes this step removed: deleted, or moved out of the requested statuses.
    ``relisted``
        True when ``lanes`` is a new listing after the stream was lost: lanes it held before
        and no longer holds are gone, with no removal of their own.
    ``heartbeat``
        True for a heartbeat (only with ``include_heartbeats``): nothing changed.
    """

    lanes: Mapping[str, LaneSummary]
    changed: tuple[LaneSummary, ...] = ()
    removed: tuple[LaneRemoval, ...] = ()
    relisted: bool = False
    heartbeat: bool = False


def _request(
    prefix: str, lane_ids: Iterable[str], statuses: Iterable[int]
) -> lane_service_pb2.WatchLanesRequest:
    request = lane_service_pb2.WatchLanesRequest(lane_id_prefix=prefix, lane_ids=list(lane_ids))
    request.statuses.extend(cast(list[lane_service_pb2.LaneStatus.ValueType], list(statuses)))
    return request


async def watch_lanes(
    stub: LaneServiceAsyncStub,
    *,
    prefix: str = "",
    lane_ids: Iterable[str] = (),
    statuses: Iterable[int] = (),
    include_heartbeats: bool = False,
    idle_timeout: float | None = 30.0,
    retry: RetryPolicy = DEFAULT_RETRY,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    on_retry: Callable[[int, LaneError], object] | None = None,
) -> AsyncGenerator[LanesView, None]:
    """Follow the caller's lanes whose id starts with ``prefix``, or (``lane_ids``, at most
    1,000) those lanes, in ``statuses`` (``lane.v1.LaneStatus`` values; empty: all), for ever.

    ``include_heartbeats``, ``idle_timeout``, ``retry``, ``sleep`` and ``on_retry`` work as for
    :func:`lane.client.watch.watch_lane`. Stop by leaving the ``async for`` (or ``aclose()``):
    the stream is cancelled.
    """
    request = _request(prefix, lane_ids, statuses)
    lanes: dict[str, LaneSummary] = {}
    shown = MappingProxyType(lanes)
    listed_before = False
    attempt = 0
    deadline: float | None = None
    while True:
        call = stub.WatchLanes(request)
        error: LaneError | None = None
        try:
            async with contextlib.aclosing(
                _follow(call, lanes, shown, listed_before, include_heartbeats, idle_timeout)
            ) as steps:
                async for view in steps:
                    attempt, deadline = 0, None  # progress
                    listed_before = True
                    yield view
        except grpc.aio.AioRpcError as err:
            error = lane_error(err)
        except TimeoutError:
            error = LaneError(
                grpc.StatusCode.UNAVAILABLE,
                "WATCH_IDLE",
                f"the WatchLanes stream sent nothing for {idle_timeout}s",
            )
        finally:
            call.cancel()
        if error is None:
            error = LaneError(
                grpc.StatusCode.UNAVAILABLE,
                "STREAM_ENDED",
                "the WatchLanes stream ended without a status",
            )
        if recovery_for(error) is Recovery.RAISE:
            raise error
        attempt += 1
        if attempt == 1:
            deadline = retry.deadline()
        if retry.gives_up(attempt, deadline):
            raise error
        if on_retry is not None:
            on_retry(attempt, error)
        delay = retry.delay(attempt, random.random())
        if error.retry_after is not None:
            delay = max(delay, error.retry_after)  # the service said how long
        _log.info("lane list: watch interrupted (%s); listing again in %.2fs", error, delay)
        if delay > 0:
            await sleep(delay)


async def _follow(
    call: grpc.aio.UnaryStreamCall[
        lane_service_pb2.WatchLanesRequest, lane_service_pb2.WatchLanesResponse
    ],
    lanes: dict[str, LaneSummary],
    shown: Mapping[str, LaneSummary],
    relisting: bool,
    include_heartbeats: bool,
    idle_timeout: float | None,
) -> AsyncGenerator[LanesView, None]:
    """Read one stream into ``lanes``: a view once the listing is complete (it replaces what
    ``lanes`` held), then one per message of changes."""
    listing: dict[str, LaneSummary] = {}
    listed = False
    while True:
        async with asyncio.timeout(idle_timeout):
            received = await call.read()
        if received is grpc.aio.EOF:
            return
        response = cast(lane_service_pb2.WatchLanesResponse, received)
        if response.heartbeat:
            if not listed:
                raise WatchProtocolError("lane list: heartbeat before the listing was complete")
            if include_heartbeats:
                yield LanesView(lanes=shown, heartbeat=True)
            continue
        if not listed:
            if response.removed:
                raise WatchProtocolError("lane list: a removal inside the listing")
            for line in response.lanes:
                listing[line.lane_id] = line
            if response.listing_complete:
                listed = True
                lanes.clear()
                lanes.update(listing)
                yield LanesView(lanes=shown, changed=tuple(listing.values()), relisted=relisting)
                listing = {}
            continue
        for line in response.lanes:
            lanes[line.lane_id] = line
        for removal in response.removed:
            lanes.pop(removal.lane_id, None)
        yield LanesView(lanes=shown, changed=tuple(response.lanes), removed=tuple(response.removed))
