"""Taking a lane out as an export file and bringing one in as a new lane, in bounded memory.

**Export.** The store reads the lane a page at a time (about :data:`EXPORT_PAGE_BYTES` of
rows) from one snapshot; each page becomes lines in a worker thread (encoding is Python at some
50 MB/s) only when the caller asks for it, so an export holds a page and its lines, whatever
the lane's size.

**Import.** :class:`LaneImport` takes the file's pieces as they arrive and checks it a batch of
whole lines at a time (about :data:`IMPORT_BATCH_BYTES`, in a worker thread): the domain's
:class:`~lane.server.domain.import_check.ImportCheck` and the caller's check of each message's
content. The checked rows go to a temporary file, not to the database: nothing is written
until the whole file is checked, and a client that sends slowly holds no connection. The rows
are then read back a batch at a time and written in one transaction. An import holds a batch,
its current line (at most ``MAX_LINE_BYTES``) and the check's index of the rows' ids.

:class:`TransferUsage` counts what both hold, for the tests and the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

from lane.v1 import entries_pb2, events_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.domain.export_format import (
    EVENT_GROUP,
    MAX_LINE_BYTES,
    RECORD_TYPES,
    ExportHead,
    Record,
    event_group_line,
    head_lines,
    invalid,
    record_line,
)
from lane.server.domain.import_check import ImportCheck
from lane.server.store import ExportPage, ImportBatch, LaneRef, Store
from lane.server.store.codec import decode, encode

#: Bytes of rows per page an export reads (a page may run over by one row).
EXPORT_PAGE_BYTES = 1 << 20
#: Bytes of whole lines an import checks at a time, and of rows it writes at a time.
IMPORT_BATCH_BYTES = 1 << 20


class TransferUsage:
    """What a process's exports and imports use: how many are open, the bytes of file data
    they hold now, and the most they held at once."""

    __slots__ = ("held", "open", "peak")

    def __init__(self) -> None:
        self.open = 0
        self.held = 0
        self.peak = 0

    def hold(self, size: int) -> None:
        """Count ``size`` more bytes held."""
        self.held += size
        self.peak = max(self.peak, self.held)

    def release(self, size: int) -> None:
        """Count ``size`` bytes no longer held."""
        self.held -= size


# -- export -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def exporting(
    store: Store, lane: LaneRef, idle_seconds: float, held: TransferUsage
) -> AsyncIterator[AsyncIterator[bytes]]:
    """The idle lane's export file, as blobs of whole lines (the header and lane record, then
    a page of rows each), read from one snapshot while the block lasts (LANE_BUSY while an
    operation is open, LANE_NOT_FOUND). ``idle_seconds``: the longest the caller waits
    between blobs."""
    held.open += 1
    try:
        async with store.exporting(lane, idle_seconds) as (head, pages):
            # Closed before the transaction ends: the pages' cursors are its own.
            blobs = _blobs(head, pages(EXPORT_PAGE_BYTES), store.clock(), held)
            async with contextlib.aclosing(blobs):
                yield blobs
    finally:
        held.open -= 1


async def _blobs(
    head: ExportHead,
    pages: AsyncGenerator[ExportPage, None],
    now: datetime,
    held: TransferUsage,
) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(pages):
        yield head_lines(head, now)
        async for page in pages:
            size = page.size
            held.hold(size)
            try:
                lines = await asyncio.to_thread(_page_lines, page)
            finally:
                held.release(size)
            del page  # its rows, before the caller takes the lines
            yield lines


def _page_lines(page: ExportPage) -> bytes:
    """A page of rows as the file's lines."""
    if page.kind == EVENT_GROUP:
        return b"".join(
            event_group_line([decode(events_pb2.HarnessEvent, body) for body in record])
            for record in page.records
        )
    kind = RECORD_TYPES[page.kind]
    return b"".join(record_line(page.kind, decode(kind, body)) for (body,) in page.records)


# -- import -------------------------------------------------------------------------------------


class LaneImport:
    """One ImportLane's file, checked as it arrives and kept as rows in a temporary file
    (module docstring). Feed it with :meth:`received`, :meth:`check` what that returns (in a
    worker thread), then :meth:`check` :meth:`rest`; :func:`import_lane` does the rest.
    :meth:`close` it in every case."""

    def __init__(
        self, lane: LaneRef, check_content: Callable[[Record], None], held: TransferUsage
    ) -> None:
        self.lane = lane
        self._check = ImportCheck(lane.lane_id)
        self._check_content = check_content
        self._held = held
        self._counted = 0
        # A line not yet whole, and whole lines not yet checked.
        self._partial = bytearray()
        self._ready: list[bytes] = []
        self._ready_bytes = 0
        self._rows: BinaryIO = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._pending: tuple[str, tuple[Any, ...]] | None = None
        held.open += 1

    def _hold(self, size: int) -> None:
        self._counted += size
        self._held.hold(size)

    def _release(self, size: int) -> None:
        self._counted -= size
        self._held.release(size)

    def received(self, data: bytes) -> list[bytes]:
        """Take the file's next piece; return the whole lines to :meth:`check` now (once they
        make a batch; else none)."""
        self._hold(len(data))
        self._partial += data
        end = self._partial.rfind(b"\n")
        if end < 0:
            if len(self._partial) > MAX_LINE_BYTES:
                line = self._check.lines + len(self._ready) + 1
                raise invalid(line, f"the line is longer than {MAX_LINE_BYTES} bytes")
            return []
        lines = bytes(self._partial[:end]).split(b"\n")
        del self._partial[: end + 1]
        self._ready.extend(lines)
        self._ready_bytes += end + 1
        if self._ready_bytes < IMPORT_BATCH_BYTES:
            return []
        return self._take_ready()

    def rest(self) -> list[bytes]:
        """The lines not yet returned, the file's end read (its last line may lack its
        newline)."""
        if self._partial:
            self._ready.append(bytes(self._partial))
            self._ready_bytes += len(self._partial)
            self._partial.clear()
        return self._take_ready()

    def _take_ready(self) -> list[bytes]:
        lines, self._ready = self._ready, []
        return lines

    def check(self, lines: list[bytes]) -> None:
        """Check ``lines`` (the next of the file) and keep their rows (a worker thread's work:
        parsing is Python at tens of MB/s)."""
        size = sum(len(line) + 1 for line in lines)
        try:
            for raw in lines:
                record = self._check.take(raw)
                if record is not None:
                    self._check_content(record)
                    self._keep(record)
        finally:
            self._ready_bytes -= size
            self._release(min(size, self._counted))

    def _keep(self, record: Record) -> None:
        kind, message = record
        rows = self._rows
        # Each row as (table, columns): the columns IMPORT_COLUMNS names, the body last but
        # for events, whose commit time follows as (seconds, nanos). marshal: this process's
        # own values, read back by it.
        if isinstance(message, entries_pb2.Entry):
            payload = message.WhichOneof("payload")
            columns = (message.id, message.parent_id or None, message.seq, payload)
            marshal.dump(("entries", (*columns, encode(message))), rows)
        elif isinstance(message, events_pb2.UsageRow):
            marshal.dump(("usage_rows", (message.id, message.seq, encode(message))), rows)
        elif kind == EVENT_GROUP:
            assert isinstance(message, list)
            group_end = message[-1].revision
            for event in message:  # naming the new lane (ImportCheck renamed them)
                time = event.commit_time
                kept = (event.revision, group_end, event.WhichOneof("kind"), encode(event))
                marshal.dump(("events", (*kept, time.seconds, time.nanos)), rows)

    def finish(self) -> ExportHead:
        """The checks that need the whole file; the new lane's head (a worker thread's
        work)."""
        head = self._check.finish()
        head.lane.lane_id = self.lane.lane_id
        # Operation ids are unique within a namespace and stay the exported lane's.
        head.lane.ClearField("last_result")
        self._rows.flush()
        self._rows.seek(0)
        return head

    async def batches(self) -> AsyncIterator[ImportBatch]:
        """The kept rows, a batch of one table at a time (read in a worker thread)."""
        while read := await asyncio.to_thread(self._read_batch):
            batch, size = read
            self._hold(size)
            try:
                yield batch
            finally:
                self._release(size)

    def _read_batch(self) -> tuple[ImportBatch, int] | None:
        """The next batch of kept rows of one table, and its bodies' bytes."""
        table = ""
        rows: list[tuple[Any, ...]] = []
        size = 0
        while size < IMPORT_BATCH_BYTES:
            row = self._pending or self._next_row()
            self._pending = None
            if row is None:
                break
            if table and row[0] != table:
                self._pending = row
                break
            table, columns = row
            if table == "events":
                *kept, seconds, nanos = columns
                columns = (*kept, _commit_time(seconds, nanos))
                size += len(kept[-1])
            else:
                size += len(columns[-1])
            rows.append(columns)
        return (ImportBatch(table, rows), size) if rows else None

    def _next_row(self) -> tuple[str, tuple[Any, ...]] | None:
        try:
            row: tuple[str, tuple[Any, ...]] = marshal.load(self._rows)
        except EOFError:
            return None
        return row

    @property
    def counts(self) -> tuple[int, int]:
        """The file's entries and events."""
        return len(self._check.entries), self._check.event_count

    def close(self) -> None:
        """Drop the kept rows and what the import holds."""
        self._rows.close()
        self._release(self._counted)
        self._held.open -= 1


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _commit_time(seconds: int, nanos: int) -> datetime:
    return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


async def import_lane(store: Store, lane_import: LaneImport) -> pb.ImportLaneResponse:
    """Create the lane ``lane_import`` names from its file, whole and checked (the last lines
    given to :meth:`LaneImport.check`): its events and lane record name the new lane; its last
    result is not kept (operation ids belong to the exported lane)."""
    head = await asyncio.to_thread(lane_import.finish)
    await store.import_lane(lane_import.lane, head, lane_import.batches())
    entries, events = lane_import.counts
    return pb.ImportLaneResponse(
        lane_id=lane_import.lane.lane_id,
        revision=head.lane.revision,
        entry_count=entries,
        event_count=events,
    )
