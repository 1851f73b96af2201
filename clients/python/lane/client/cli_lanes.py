"""``lane lanes``: the caller's lanes as a table, once (ListLanes) or live (``--watch``:
WatchLanes, the table redrawn on each change; not on a terminal, one line per change)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

HEADER = ("LANE", "STATUS", "REVISION", "OPERATION", "RUNNING", "TOKENS", "LAST RESULT", "ACTIVE")
#: The statuses by the name the command takes and shows.
STATUSES = {
    pb.LaneStatus.Name(value).removeprefix("LANE_STATUS_").lower().replace("_", "-"): value
    for value in pb.LaneStatus.values()
    if value != pb.LANE_STATUS_UNSPECIFIED
}
_STATUS_NAMES = {value: name for name, value in STATUSES.items()}


def ago(line: pb.LaneSummary, now: float) -> str:
    """How long ago the lane was last active, in the largest whole unit."""
    if not line.HasField("last_activity_time"):
        return "-"
    seconds = max(0, int(now - line.last_activity_time.ToDatetime(UTC).timestamp()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def row(line: pb.LaneSummary, now: float) -> tuple[str, ...]:
    """One lane's cells, in :data:`HEADER` order."""
    result = line.last_result_status
    return (
        line.lane_id,
        _STATUS_NAMES.get(line.status, "?"),
        str(line.revision),
        line.operation_id or "-",
        str(line.running_tool_calls),
        f"{line.usage_totals.total_tokens:,}",
        snapshot_pb2.OperationResultStatus.Name(result)
        .removeprefix("OPERATION_RESULT_STATUS_")
        .lower()
        if result
        else "-",
        ago(line, now),
    )


def table(lines: Iterable[pb.LaneSummary], now: float | None = None) -> list[str]:
    """The lanes as text lines, a header first, columns aligned."""
    at = time.time() if now is None else now
    rows = [HEADER, *(row(line, at) for line in lines)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]


async def list_once(stub: Any, request: pb.ListLanesRequest, out: TextIO) -> int:
    """Print every lane ListLanes gives for ``request``, page after page."""
    from lane.client.commands import call

    lines: list[pb.LaneSummary] = []
    while True:
        page = await call(stub.ListLanes, request)
        lines.extend(page.lanes)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    print("\n".join(table(lines)), file=out)
    return 0


async def watch(
    stub: Any, prefix: str, statuses: Sequence[int], out: TextIO, *, redraw: bool
) -> int:
    """Follow the lanes until interrupted: redraw the table on each change (``redraw``), or
    print one line per changed or removed lane."""
    from lane.client.lane_list import watch_lanes

    async for view in watch_lanes(stub, prefix=prefix, statuses=statuses):
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        if redraw:
            lines = sorted(view.lanes.values(), key=lambda line: line.lane_id)
            out.write("\x1b[H\x1b[2J")  # home, clear
            print(f"{len(lines)} lanes · live · {stamp}", file=out)
            print("\n".join(table(lines)), file=out)
        else:
            now = time.time()
            for line in view.changed:
                print(f"{stamp}  " + "  ".join(row(line, now)), file=out)
            for removal in view.removed:
                gone = "deleted" if removal.deleted else "left the filter"
                print(f"{stamp}  {removal.lane_id}  {gone}", file=out)
        out.flush()
    return 0


def run(args: Any, stub: Any) -> Any:
    """The work of ``lane lanes`` with the parsed ``args``: a coroutine for run_client."""
    statuses = [STATUSES[name] for name in args.status or ()]
    if args.watch:
        return watch(stub, args.prefix, statuses, sys.stdout, redraw=sys.stdout.isatty())
    request = pb.ListLanesRequest(page_size=args.page_size, lane_id_prefix=args.prefix)
    request.statuses.extend(statuses)
    if args.by_activity:
        request.order = pb.LANE_ORDER_LAST_ACTIVITY
    return list_once(stub, request, sys.stdout)
