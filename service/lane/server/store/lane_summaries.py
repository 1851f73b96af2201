"""Lanes in one line each, for lane lists: ListLanes pages and WatchLanes listings, the
summaries of lanes that changed in another process, and the heads a poll compares.

Each summary row is read in one statement: the lane row, its open operation, its last ended
operation's result, the count of its running tool calls, and the commit time of its newest
event (the lane's last activity; retention always keeps a lane's newest events). The status is
computed here in SQL, so a listing can be filtered by it and paged; its rules are
``lane_summary.py``'s, and the tests hold the two to each other.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.store.codec import decode
from lane.server.store.lane_ref import LANE_SCAN
from lane.server.store.lane_summary import OpenOperation, summary

#: The statuses in SQL, first rule that applies wins (lane_summary.py).
_STATUS = (
    "CASE WHEN o.operation_id IS NULL THEN"
    f"  CASE WHEN l.faulted THEN {pb.LANE_STATUS_FAULTED} ELSE {pb.LANE_STATUS_IDLE} END"
    f" WHEN o.cancel_requested THEN {pb.LANE_STATUS_ABORTING}"
    f" WHEN o.kind = {snapshot_pb2.OPERATION_KIND_COMPACTION} THEN {pb.LANE_STATUS_COMPACTING}"
    f" WHEN o.deferred IS NOT NULL THEN {pb.LANE_STATUS_SUSPENDED}"
    f" WHEN o.retry IS NOT NULL THEN {pb.LANE_STATUS_RETRY_WAITING}"
    f" ELSE {pb.LANE_STATUS_RUNNING} END"
)

_SUMMARIES = (
    "SELECT * FROM (SELECT l.lane_id, l.revision, l.tip_id, l.incarnation, l.faulted,"
    " l.usage_totals, o.operation_id, o.kind, o.started_time, o.cancel_requested,"
    " l.last_operation_id, r.result,"
    " coalesce(h.commit_time, l.created_time) AS activity,"
    " (SELECT count(*) FROM tool_calls t WHERE t.namespace = l.namespace"
    "   AND t.lane_id = l.lane_id AND t.operation_id = l.current_operation_id"
    "   AND t.status = 'effect_pending') AS running,"
    f" {_STATUS} AS status"
    " FROM lanes l"
    " LEFT JOIN operations o ON o.namespace = l.namespace AND o.lane_id = l.lane_id"
    "  AND o.operation_id = l.current_operation_id"
    " LEFT JOIN operations r ON r.namespace = l.namespace AND r.lane_id = l.lane_id"
    "  AND r.operation_id = l.last_operation_id"
    " LEFT JOIN events h ON h.namespace = l.namespace AND h.lane_id = l.lane_id"
    "  AND h.revision = l.revision"
    " WHERE l.namespace = %(ns)s{lanes}) s"
)


class LaneFilter(NamedTuple):
    """Which lanes of a namespace a list shows: all of them by default."""

    #: Only lanes whose id starts with this.
    prefix: str = ""
    #: Only these lanes (None: no such filter).
    lane_ids: frozenset[str] | None = None
    #: Only lanes in these statuses (empty: all).
    statuses: frozenset[int] = frozenset()

    def admits_id(self, lane_id: str) -> bool:
        """Whether a lane with this id may match (its status aside)."""
        return lane_id.startswith(self.prefix) and (
            self.lane_ids is None or lane_id in self.lane_ids
        )

    def admits_status(self, status: int) -> bool:
        """Whether a lane in ``status`` matches (its id aside)."""
        return not self.statuses or status in self.statuses


class SummaryRow(NamedTuple):
    """A lane's summary as read: the keyword arguments of ``lane_summary.summary``."""

    lane_id: str
    revision: int
    tip_id: str
    incarnation: int
    status: int
    faulted: bool
    usage_totals: messages_pb2.Usage
    operation: OpenOperation | None
    running_tool_calls: int
    last_operation_id: str
    last_result_status: int
    last_activity: datetime

    def line(self) -> pb.LaneSummary:
        """The summary as the contract shows it."""
        return summary(**self._asdict())


class ActivityPosition(NamedTuple):
    """Where a page in last-activity order ended: the last lane's activity and id."""

    activity: datetime
    lane_id: str


def _lanes_clause(lanes: LaneFilter, params: dict[str, Any]) -> str:
    clause = ""
    if lanes.prefix:
        params["prefix"] = lanes.prefix
        clause += " AND starts_with(l.lane_id, %(prefix)s)"
    if lanes.lane_ids is not None:
        params["ids"] = sorted(lanes.lane_ids)
        clause += " AND l.lane_id = ANY(%(ids)s::text[])"
    return clause


def _row(row: Sequence[Any]) -> SummaryRow:
    (lane_id, revision, tip_id, incarnation, faulted, usage, operation_id, kind, started) = row[:9]
    (cancel_requested, last_operation_id, result, activity, running, status) = row[9:]
    return SummaryRow(
        lane_id=lane_id,
        revision=revision,
        tip_id=tip_id or "",
        incarnation=incarnation,
        status=status,
        faulted=faulted,
        usage_totals=decode(messages_pb2.Usage, usage),
        operation=None
        if operation_id is None
        else OpenOperation(operation_id, kind, started, cancel_requested),
        running_tool_calls=running,
        last_operation_id=last_operation_id or "",
        last_result_status=decode(snapshot_pb2.OperationResult, result).status if result else 0,
        last_activity=activity,
    )


async def read_summaries(
    conn: Any,
    namespace: str,
    lanes: LaneFilter,
    limit: int,
    *,
    after_id: str = "",
    after_activity: ActivityPosition | None = None,
    by_activity: bool = False,
) -> list[SummaryRow]:
    """Up to ``limit`` summaries of the namespace's lanes that ``lanes`` admits: in id order
    after ``after_id``, or (``by_activity``) the most recently active first, after
    ``after_activity``."""
    params: dict[str, Any] = {"ns": namespace, "limit": limit}
    sql = LANE_SCAN + _SUMMARIES.format(lanes=_lanes_clause(lanes, params))
    where = []
    if lanes.statuses:
        params["statuses"] = sorted(lanes.statuses)
        where.append("s.status = ANY(%(statuses)s::int[])")
    if by_activity:
        if after_activity is not None:
            params["after_time"], params["after_id"] = after_activity
            where.append(
                "(s.activity < %(after_time)s OR (s.activity = %(after_time)s"
                ' AND s.lane_id > %(after_id)s COLLATE "C"))'
            )
        order = ' ORDER BY s.activity DESC, s.lane_id COLLATE "C"'
    else:
        if after_id:
            params["after_id"] = after_id
            where.append('s.lane_id > %(after_id)s COLLATE "C"')
        # Code-point order whatever the database's collation, so pages are stable.
        order = ' ORDER BY s.lane_id COLLATE "C"'
    if where:
        sql += " WHERE " + " AND ".join(where)
    cur = await conn.execute(sql + order + " LIMIT %(limit)s", params)
    return [_row(row) for row in await cur.fetchall()]


async def read_heads(
    conn: Any, namespace: str, prefixes: Collection[str] | None, lane_ids: Collection[str]
) -> dict[str, tuple[int, int]]:
    """The (incarnation, revision) of the namespace's lanes: all of them when ``prefixes`` is
    None, else those whose id starts with one of ``prefixes`` or is one of ``lane_ids``."""
    params: dict[str, Any] = {"ns": namespace}
    sql = LANE_SCAN + "SELECT lane_id, incarnation, revision FROM lanes WHERE namespace = %(ns)s"
    if prefixes is not None:
        params["prefixes"] = sorted(prefixes)
        params["ids"] = sorted(lane_ids)
        sql += (
            " AND (lane_id = ANY(%(ids)s::text[]) OR EXISTS (SELECT 1"
            " FROM unnest(%(prefixes)s::text[]) p WHERE starts_with(lane_id, p)))"
        )
    cur = await conn.execute(sql, params)
    rows = await cur.fetchall()
    return {lane_id: (incarnation, revision) for lane_id, incarnation, revision in rows}
