"""What ListLanes and WatchLanes share: the lane filter a request asks for, the page tokens of
both orders, and a summary row as the contract shows it."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from lane.v1 import lane_service_pb2 as pb

from lane.server.api import validation as v
from lane.server.domain.errors import InvalidArgument
from lane.server.store import ActivityPosition, LaneFilter

#: Starts a page token of the last-activity order (never in a lane id: ids are printable).
_ACTIVITY_TOKEN = "\x1factivity\x1f"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def lane_filter(
    prefix: str, statuses: Sequence[int], lane_ids: Sequence[str] | None = None
) -> LaneFilter:
    """The filter of a request's ``lane_id_prefix``, ``statuses`` and ``lane_ids`` (None: the
    request has no such field), validated."""
    if prefix:
        v.require_id(prefix, "lane_id_prefix")
    v.require(
        pb.LANE_STATUS_UNSPECIFIED not in statuses,
        "UNKNOWN_ENUM_VALUE",
        "statuses cannot hold LANE_STATUS_UNSPECIFIED",
        "statuses",
    )
    ids = None
    if lane_ids:
        # At most MAX_LANE_FILTERS of them: counted before (validation.check_counts).
        for lane_id in lane_ids:
            v.require_id(lane_id, "lane_ids")
        ids = frozenset(lane_ids)
    return LaneFilter(prefix, ids, frozenset(statuses))


def _bad_token() -> InvalidArgument:
    return InvalidArgument(
        "INVALID_PAGE_TOKEN",
        "page_token is not a token ListLanes gave for this order",
        field="page_token",
    )


def id_token(lane_id: str) -> str:
    """The page token after ``lane_id`` in id order."""
    return base64.urlsafe_b64encode(lane_id.encode()).decode()


def activity_token(position: ActivityPosition) -> str:
    """The page token after ``position`` in last-activity order."""
    micros = (position.activity - _EPOCH) // timedelta(microseconds=1)
    text = f"{_ACTIVITY_TOKEN}{micros}\x1f{position.lane_id}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def _decoded(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise _bad_token() from None


def after_id(token: str) -> str:
    """The lane id an id-order page token continues after ('' for no token)."""
    if not token:
        return ""
    after = _decoded(token)
    if not after.isprintable():
        raise _bad_token()
    return after


def after_activity(token: str) -> ActivityPosition | None:
    """Where a last-activity page token continues (None for no token)."""
    if not token:
        return None
    text = _decoded(token)
    if not text.startswith(_ACTIVITY_TOKEN):
        raise _bad_token()
    micros, separator, lane_id = text[len(_ACTIVITY_TOKEN) :].partition("\x1f")
    if not separator or not micros.lstrip("-").isdigit() or not lane_id.isprintable():
        raise _bad_token()
    try:
        activity = _EPOCH + timedelta(microseconds=int(micros))
    except OverflowError:
        raise _bad_token() from None
    return ActivityPosition(activity, lane_id)
