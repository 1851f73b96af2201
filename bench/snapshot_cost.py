"""Snapshot cost: a long transcript's snapshot through WatchLane versus selecting and encoding
the same rows, and the service's memory while it streams it.

Run from the repository root (virtualenv active)::

    python -m bench.snapshot_cost [--entries 10000] [--repeats 5] [--database-url URL]

docs/contract.md: "Snapshot of a 10,000-entry transcript: <= 2 x the cost of selecting and encoding
the same rows; server memory bounded by the chunk size". One run:

1. **Build.** The real service runs as a subprocess (``python -m lane.server.app``). One lane gets
   ``--entries`` transcript entries through the API, in runs of: StartRun with
   ``--prompts-per-run`` user messages, then ``--turns-per-run`` turns of StartTurn,
   SettleAssistantMessage (text and ``--calls`` tool calls) and, per call, StartToolCall and
   StageToolOutcome (the result is placed), then a text-only final turn and EndRun. Texts are
   seeded random words; sizes scale with ``--mean-entry-bytes``: user messages 0.2-1.5 x,
   assistant texts 0.2-2 x plus 0.1-0.4 x of arguments per call, tool results 0.2-4 x (about
   1.2 KiB per entry on average at the default 1000). A small lane is built too, for warm-up.
2. **Planner statistics.** The entries table was filled within the last minute or so, and
   autovacuum has usually not analyzed it yet. The service's recursive transcript query is
   timed once as it is (``--probe-timeout``), then ``ANALYZE entries`` runs (unless
   ``--no-analyze``), so the rounds below see the statistics a lane that was not filled
   moments ago has. (Without them PostgreSQL plans the walk as a nested loop that scans all
   the lane's entries for every step: quadratic in the transcript's length.)
3. **Restart.** The service is stopped and started again, so the memory readings start from a
   process that has never held the transcript. A watch and a GetLaneSnapshot of the small
   lane warm it up; then its VmRSS is read.
4. **Memory.** The first WatchLane snapshot of the long lane is read to its last transcript
   chunk while the service's peak resident memory is tracked (VmHWM, reset through
   ``/proc/PID/clear_refs`` first, and VmRSS sampled every 2 ms); its growth over the warm
   reading is compared with the chunk size (the service's ``WatchSettings.chunk_bytes``) and
   with the transcript's size. ``--concurrent K`` watchers then snapshot it at once.
5. **Timing**, ``--repeats`` rounds, each in this order, medians reported:

   - *baseline*, in this process on one psycopg connection: the service's own recursive
     transcript query (the same rows, tip to newest compaction), each row decoded as a
     ``lane.v1.Entry`` and the entries encoded as ``TranscriptChunk`` messages of the chunk
     size. Also, for comparison: a plain ``SELECT ... ORDER BY seq`` of the lane's entries
     instead of the recursive walk, and the rows' bytes framed into chunk messages without
     decoding (a lower bound: the stored bodies already are encoded entries).
   - *WatchLane*: from the call until the last transcript chunk has arrived (messages are
     received as bytes; only the head's ``following_chunks`` is read, from the wire).
   - *GetLaneSnapshot*: the whole answer, or the time until it is refused when it is over
     the 4 MiB message limit (RESOURCE_EXHAUSTED ``SNAPSHOT_TOO_LARGE``).

   The first round's messages are decoded afterwards and checked: every entry, in the
   baseline's order.

``--py-spy FILE`` profiles the service during the timed rounds. Every process and directory
started here is stopped and removed on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from lane.client.testing import LaneScript, RunScript, ToolCallSpec
from lane.v1 import entries_pb2, lane_service_pb2_grpc, messages_pb2
from lane.v1 import lane_service_pb2 as pb

from bench.commit_throughput import (
    Database,
    finish_profiler,
    provision_database,
    run_service,
    start_profiler,
)
from bench.entry import add_database_url, run_benchmark
from bench.memory import Memory, PeakSampler
from lane.server.api.watch import WatchSettings

TARGET_RATIO = 2.0  # docs/contract.md, Targets
#: "Bounded by the chunk size" is read as: the peak growth while one snapshot streams stays
#: within this many chunks (one being encoded, one in gRPC's send buffer, one of slack).
BOUND_IN_CHUNKS = 3
RPC_TIMEOUT_SECONDS = 120.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
NAMESPACE = "default"  # the service's namespace with auth off

_WATCH_METHOD = "/lane.v1.LaneService/WatchLane"
_SNAPSHOT_METHOD = "/lane.v1.LaneService/GetLaneSnapshot"
_CHAIN_SQL = (
    "WITH RECURSIVE chain AS ("
    " SELECT entry_id, parent_id, kind, body, 0 AS depth FROM entries"
    " WHERE namespace = %(ns)s AND lane_id = %(lane)s AND entry_id = %(tip)s"
    " UNION ALL"
    " SELECT e.entry_id, e.parent_id, e.kind, e.body, chain.depth + 1"
    " FROM entries e JOIN chain"
    "  ON e.namespace = %(ns)s AND e.lane_id = %(lane)s AND e.entry_id = chain.parent_id"
    " WHERE chain.kind <> 'compaction')"
    " SELECT body FROM chain ORDER BY depth DESC"
)
_PLAIN_SQL = "SELECT body FROM entries WHERE namespace = %(ns)s AND lane_id = %(lane)s ORDER BY seq"
_WORDS = str.split(
    "the a of to and in is that for it with as on be this are by file line function value error"
    " test run call result output input return data lane service event entry tool model user"
    " assistant turn batch commit revision snapshot watcher stream chunk message state check"
    " build config path module import class method type string number list map table row query"
    " index cache server client request response status code time memory process thread task"
)


# -- building the lane through the API --------------------------------------------------------


@dataclass
class Builder:
    """Builds a lane's transcript through the real RPCs, with seeded random texts."""

    stub: lane_service_pb2_grpc.LaneServiceAsyncStub
    rng: random.Random
    scale: float
    prompts_per_run: int
    turns_per_run: int
    calls: int
    rpcs: int = 0
    next_call: int = 0

    def _text(self, low: float, high: float) -> str:
        target = int(self.rng.uniform(low, high) * self.scale)
        words: list[str] = []
        size = 0
        while size < target:
            chunk = self.rng.choices(_WORDS, k=32)
            words += chunk
            size += sum(len(w) + 1 for w in chunk)
        return " ".join(words)[:target]

    def _block(self, low: float, high: float) -> messages_pb2.ContentBlock:
        return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=self._text(low, high)))

    async def build(self, lane_id: str, entries: int) -> None:
        lane = await LaneScript.create(self.stub, lane_id)
        self.rpcs += 1
        placed = 0
        while placed < entries:
            # A run places its prompts, its tool turns (an assistant entry and a result per
            # call each) and a final assistant answer (EndRun COMPLETED needs one); never
            # leave a single entry for the next run, which places at least two.
            remaining = entries - placed
            prompts = max(1, min(self.prompts_per_run, remaining - 1))
            turns = min(self.turns_per_run, (remaining - prompts - 1) // (self.calls + 1))
            if remaining - prompts - 1 - turns * (self.calls + 1) == 1:
                prompts += -1 if prompts > 1 else 1
            run = await lane.start_run(*(self._text(200, 1500) for _ in range(prompts)))
            self.rpcs += 1
            placed += prompts
            for _ in range(turns):
                await self._turn(run, self.calls)
                placed += self.calls + 1
            await self._turn(run, 0)
            placed += 1
            await run.end()
            self.rpcs += 1

    async def _turn(self, run: RunScript, calls: int) -> None:
        words = self._text(200, 2000)
        ids: list[str] = []
        asked: list[ToolCallSpec] = []
        for _ in range(calls):
            self.next_call += 1
            ids.append(f"call-{self.next_call}")
            asked.append((ids[-1], "shell", {"cmd": self._text(100, 400), "timeout": 30}))
        usage = messages_pb2.Usage(input=self.rng.randint(1000, 90000), output=500)
        turn = await run.turn(words, tool_calls=asked, usage=usage)
        self.rpcs += 2  # StartTurn and SettleAssistantMessage
        for call_id in ids:
            arguments = {"cmd": "make test", "timeout": 30}
            call = await turn.call(call_id).start(arguments).stage(self._text(200, 4000))
            self.rpcs += 2
            assert call.staged is not None
            if list(call.staged.placed_tool_call_ids) != [call_id]:
                raise RuntimeError(f"{call_id} was not placed at once: {call.staged}")


# -- the baseline: select and encode the same rows --------------------------------------------


@dataclass
class BaselineTiming:
    select: float
    decode: float
    encode: float
    rows: int
    bytes: int
    ids: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.select + self.decode + self.encode


async def select_and_encode(
    conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, str], chunk_bytes: int
) -> BaselineTiming:
    """The rows of ``query`` fetched, decoded as Entry and encoded as TranscriptChunk messages
    of about ``chunk_bytes`` (timed separately)."""
    started = time.perf_counter()
    cur = await conn.execute(query, params)
    rows = await cur.fetchall()
    selected = time.perf_counter()
    entries = [entries_pb2.Entry.FromString(body) for (body,) in rows]
    decoded = time.perf_counter()
    frames: list[bytes] = []
    chunk = pb.TranscriptChunk()
    size = 0
    for entry in entries:
        entry_size = entry.ByteSize()
        if size and size + entry_size > chunk_bytes:
            frames.append(pb.WatchLaneResponse(transcript_chunk=chunk).SerializeToString())
            chunk, size = pb.TranscriptChunk(), 0
        chunk.entries.append(entry)
        size += entry_size
    frames.append(pb.WatchLaneResponse(transcript_chunk=chunk).SerializeToString())
    encoded = time.perf_counter()
    return BaselineTiming(
        select=selected - started,
        decode=decoded - selected,
        encode=encoded - decoded,
        rows=len(rows),
        bytes=sum(len(body) for (body,) in rows),
        ids=[entry.id for entry in entries],
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


async def select_and_frame(
    conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, str], chunk_bytes: int
) -> float:
    """The rows' stored bodies framed into TranscriptChunk messages without decoding (field 1
    of TranscriptChunk inside field 2 of WatchLaneResponse): the lower bound of any encoding."""
    started = time.perf_counter()
    cur = await conn.execute(query, params)
    rows = await cur.fetchall()
    frames: list[bytes] = []
    parts: list[bytes] = []
    size = 0

    def flush() -> None:
        body = b"".join(parts)
        frames.append(b"\x12" + _varint(len(body)) + body)

    for (body,) in rows:
        item = b"\x0a" + _varint(len(body)) + bytes(body)
        if size and size + len(item) > chunk_bytes:
            flush()
            parts.clear()
            size = 0
        parts.append(item)
        size += len(item)
    flush()
    return time.perf_counter() - started


# -- the service's answers, as bytes ----------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _skip(data: bytes, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return _read_varint(data, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == 2:
        length, pos = _read_varint(data, pos)
        return pos + length
    if wire_type == 5:
        return pos + 4
    raise ValueError(f"unexpected wire type {wire_type}")


def following_chunks(raw: bytes) -> int:
    """``snapshot.following_chunks`` of an encoded WatchLaneResponse, read from the wire
    without decoding the snapshot (which holds up to a chunk of transcript)."""
    tag, pos = _read_varint(raw, 0)
    if tag != (1 << 3 | 2):  # field 1 (snapshot), length-delimited
        raise ValueError(f"the first message is not a snapshot head (tag {tag})")
    length, pos = _read_varint(raw, pos)
    end = pos + length
    chunks = 0
    while pos < end:
        tag, pos = _read_varint(raw, pos)
        if tag == (2 << 3 | 0):  # following_chunks
            chunks, pos = _read_varint(raw, pos)
        else:
            pos = _skip(raw, pos, tag & 7)
    return chunks


async def watch_snapshot(channel: grpc.aio.Channel, lane_id: str) -> tuple[float, list[bytes]]:
    """Seconds from the WatchLane call until its last transcript chunk arrived; the messages."""
    watch: grpc.aio.UnaryStreamMultiCallable[pb.WatchLaneRequest, bytes] = channel.unary_stream(
        _WATCH_METHOD,
        request_serializer=pb.WatchLaneRequest.SerializeToString,
        response_deserializer=None,
    )
    started = time.perf_counter()
    call = watch(pb.WatchLaneRequest(lane_id=lane_id), timeout=RPC_TIMEOUT_SECONDS)
    try:
        head = await call.read()
        if not isinstance(head, bytes):
            raise RuntimeError("the watch ended before its snapshot")
        messages = [head]
        for _ in range(following_chunks(head)):
            chunk = await call.read()
            if not isinstance(chunk, bytes):
                raise RuntimeError("the watch ended before its last transcript chunk")
            messages.append(chunk)
        return time.perf_counter() - started, messages
    finally:
        call.cancel()


def check_watch(messages: Sequence[bytes], expected_ids: Sequence[str]) -> str | None:
    """None when the messages carry exactly the expected entries in order, else what differs."""
    head = pb.WatchLaneResponse.FromString(messages[0]).snapshot
    ids = [entry.id for entry in head.snapshot.transcript]
    for raw in messages[1:]:
        ids += [entry.id for entry in pb.WatchLaneResponse.FromString(raw).transcript_chunk.entries]
    if ids == list(expected_ids):
        return None
    return f"the watch delivered {len(ids)} entries, the baseline selected {len(expected_ids)}"


async def get_snapshot(channel: grpc.aio.Channel, lane_id: str) -> tuple[float, str]:
    """Seconds for GetLaneSnapshot and its outcome ("OK", or the refusal's code and details)."""
    get: grpc.aio.UnaryUnaryMultiCallable[pb.GetLaneSnapshotRequest, bytes] = channel.unary_unary(
        _SNAPSHOT_METHOD,
        request_serializer=pb.GetLaneSnapshotRequest.SerializeToString,
        response_deserializer=None,
    )
    started = time.perf_counter()
    try:
        await get(pb.GetLaneSnapshotRequest(lane_id=lane_id), timeout=RPC_TIMEOUT_SECONDS)
    except grpc.aio.AioRpcError as err:
        code = err.code().name if err.code() is not None else "?"
        return time.perf_counter() - started, f"{code}: {err.details()}"
    return time.perf_counter() - started, "OK"


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Rounds:
    chain: list[BaselineTiming] = field(default_factory=list)
    plain: list[BaselineTiming] = field(default_factory=list)
    framed: list[float] = field(default_factory=list)
    watch: list[float] = field(default_factory=list)
    get: list[float] = field(default_factory=list)
    get_outcome: str = ""
    watch_messages: int = 0
    watch_bytes: int = 0
    check: str | None = None
    peak_growth_kib: list[int] = field(default_factory=list)


@dataclass
class MemoryResult:
    warm: Memory
    first_growth_kib: int
    first_exact: bool
    after_first: Memory
    concurrent: int
    concurrent_growth_kib: int
    after_all: Memory


@dataclass
class BuildResult:
    lane_id: str
    tip_id: str
    revision: int
    rpcs: int
    seconds: float


@dataclass(frozen=True)
class Statistics:
    """The transcript query before the entries table was analyzed, and the ANALYZE step."""

    autoanalyzed: bool
    #: Seconds of the recursive SELECT with the statistics as the build left them (None: it
    #: ran past the probe's timeout and was cancelled; nan: not probed).
    unanalyzed_select: float | None
    analyzed: bool


async def settle_statistics(
    db: Database, built: BuildResult, probe_timeout: float, analyze: bool
) -> Statistics:
    """Time the transcript query once with the planner statistics the build left (a table
    filled within the last minute has none unless autovacuum analyzed it), then ANALYZE."""
    params = {"ns": NAMESPACE, "lane": built.lane_id, "tip": built.tip_id}
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT last_autoanalyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'entries'"
        )
        row = await cur.fetchone()
        autoanalyzed = bool(row and row[0])
        seconds: float | None = math.nan
        if probe_timeout > 0:
            await conn.execute(f"SET statement_timeout = {int(probe_timeout * 1000)}")
            started = time.perf_counter()
            try:
                await conn.execute(_CHAIN_SQL, params)
                seconds = time.perf_counter() - started
            except psycopg.errors.QueryCanceled:
                seconds = None
            await conn.execute("RESET statement_timeout")
        if analyze:
            await conn.execute("ANALYZE entries")
    return Statistics(autoanalyzed, seconds, analyze)


async def build(args: argparse.Namespace, address: str, small_lane: str) -> BuildResult:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        rng = random.Random(args.seed)
        builder = Builder(
            stub, rng, args.mean_entry_bytes / 1000, args.prompts_per_run, args.turns_per_run,
            args.calls,
        )  # fmt: skip
        lane_id = f"snapshot-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        await builder.build(small_lane, 10)
        await builder.build(lane_id, args.entries)
        seconds = time.monotonic() - started
        head = await stub.ListLanes(pb.ListLanesRequest(page_size=1000))
        summary = next(lane for lane in head.lanes if lane.lane_id == lane_id)
    return BuildResult(lane_id, summary.tip_id, summary.revision, builder.rpcs, seconds)


async def measure_memory(
    args: argparse.Namespace, pid: int, channel: grpc.aio.Channel, lane_id: str
) -> MemoryResult:
    await asyncio.sleep(1.0)
    warm = Memory.of(pid)
    with PeakSampler(pid) as first:
        await watch_snapshot(channel, lane_id)
    await asyncio.sleep(1.0)
    after_first = Memory.of(pid)
    with PeakSampler(pid) as concurrent:
        await asyncio.gather(*(watch_snapshot(channel, lane_id) for _ in range(args.concurrent)))
    await asyncio.sleep(1.0)
    return MemoryResult(
        warm=warm,
        first_growth_kib=first.peak_kib - warm.rss,
        first_exact=first.hwm_kib is not None,
        after_first=after_first,
        concurrent=args.concurrent,
        concurrent_growth_kib=concurrent.peak_kib - warm.rss,
        after_all=Memory.of(pid),
    )


async def time_rounds(
    args: argparse.Namespace,
    db: Database,
    pid: int,
    channel: grpc.aio.Channel,
    built: BuildResult,
    chunk_bytes: int,
) -> Rounds:
    rounds = Rounds()
    params = {"ns": NAMESPACE, "lane": built.lane_id, "tip": built.tip_id}
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        # Warm both sides once (prepared plans, the service's code paths), untimed.
        await select_and_encode(conn, _CHAIN_SQL, params, chunk_bytes)
        await watch_snapshot(channel, built.lane_id)
        for index in range(args.repeats):
            rounds.chain.append(await select_and_encode(conn, _CHAIN_SQL, params, chunk_bytes))
            rounds.plain.append(await select_and_encode(conn, _PLAIN_SQL, params, chunk_bytes))
            rounds.framed.append(await select_and_frame(conn, _CHAIN_SQL, params, chunk_bytes))
            with PeakSampler(pid) as peak:
                seconds, messages = await watch_snapshot(channel, built.lane_id)
            rounds.peak_growth_kib.append(peak.growth_kib)
            rounds.watch.append(seconds)
            if index == 0:
                rounds.watch_messages = len(messages)
                rounds.watch_bytes = sum(len(m) for m in messages)
                rounds.check = check_watch(messages, rounds.chain[0].ids)
            seconds, outcome = await get_snapshot(channel, built.lane_id)
            rounds.get.append(seconds)
            rounds.get_outcome = outcome
            print(
                f"  round {index + 1}: baseline {rounds.chain[-1].total * 1e3:,.1f} ms,"
                f" WatchLane {rounds.watch[-1] * 1e3:,.1f} ms,"
                f" GetLaneSnapshot {rounds.get[-1] * 1e3:,.1f} ms ({outcome[:40]})",
                flush=True,
            )
    return rounds


# -- report -----------------------------------------------------------------------------------


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:,.1f} ms"


def _mib(kib: float) -> str:
    return f"{kib / 1024:,.1f} MiB"


def report(
    args: argparse.Namespace,
    db: Database,
    built: BuildResult,
    rounds: Rounds,
    memory: MemoryResult,
    chunk_bytes: int,
    stats: Statistics,
) -> str:
    chain = rounds.chain
    baseline = statistics.median(t.total for t in chain)
    watch = statistics.median(rounds.watch)
    ratio = watch / baseline
    transcript_kib = chain[0].bytes / 1024
    chunk_kib = chunk_bytes / 1024
    bound_kib = BOUND_IN_CHUNKS * chunk_kib
    get_fits = rounds.get_outcome == "OK"
    rows = [
        ("transcript: entries / stored bytes", f"{chain[0].rows:,} / {_mib(transcript_kib)}"),
        (
            "baseline: recursive SELECT + decode + encode (median)",
            f"{baseline * 1e3:,.1f} ms",
        ),
        (
            "  of which SELECT / decode Entry / encode chunks",
            " / ".join(
                f"{statistics.median(getattr(t, part) for t in chain) * 1e3:,.1f}"
                for part in ("select", "decode", "encode")
            )
            + " ms",
        ),
        ("baseline, plain SELECT by lane instead", _ms([t.total for t in rounds.plain])),
        ("lower bound: recursive SELECT + framing, no decoding", _ms(rounds.framed)),
        ("service: WatchLane snapshot to its last chunk (median)", f"{watch * 1e3:,.1f} ms"),
        (
            "service: GetLaneSnapshot (median)",
            _ms(rounds.get) + ("" if get_fits else " (refused)"),
        ),
        ("ratio WatchLane / baseline", f"{ratio:.2f}"),
        (
            f"target: ratio <= {TARGET_RATIO:g}",
            "met" if ratio <= TARGET_RATIO else "NOT met",
        ),
    ]
    if get_fits:
        get_ratio = statistics.median(rounds.get) / baseline
        rows.insert(-2, ("ratio GetLaneSnapshot / baseline", f"{get_ratio:.2f}"))
    growth = memory.first_growth_kib
    rows += [
        ("service: RSS before (warm, never held the transcript)", _mib(memory.warm.rss)),
        ("service: peak RSS growth, first WatchLane snapshot", _mib(growth)),
        (
            f"service: peak RSS growth, {memory.concurrent} WatchLane snapshots at once",
            _mib(memory.concurrent_growth_kib),
        ),
        ("  growth / transcript size (first snapshot)", f"{growth / transcript_kib:.2f}"),
        ("  growth / chunk size (first snapshot)", f"{growth / chunk_kib:.1f}"),
        (
            f"target: memory bounded by the chunk size (<= {BOUND_IN_CHUNKS} chunks)",
            "met" if growth <= bound_kib else "NOT met",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [
        f"snapshot cost: {chain[0].rows:,}-entry transcript, {args.repeats} rounds;"
        f" chunk size {chunk_bytes:,} bytes",
        f"PostgreSQL {db.version} ({db.description}); {os.cpu_count()} CPUs; the service is a"
        " subprocess, the baseline runs in the bench process on one psycopg connection",
        "",
        f"  {'':<{width}}  value",
        *(f"  {label:<{width}}  {value:>22}" for label, value in rows),
        "",
        f"built through the API in {built.seconds:.1f} s: {built.rpcs:,} RPCs, lane revision"
        f" {built.revision:,}",
        "planner statistics: entries "
        + ("was" if stats.autoanalyzed else "was not")
        + " analyzed by autovacuum after the build; the recursive transcript query "
        + (
            "was not timed before ANALYZE (--probe-timeout 0)"
            if stats.unanalyzed_select is not None and math.isnan(stats.unanalyzed_select)
            else f"took over {args.probe_timeout:g} s (cancelled) with those statistics"
            if stats.unanalyzed_select is None
            else f"took {stats.unanalyzed_select * 1e3:,.1f} ms with those statistics"
        )
        + "; "
        + (
            "then ANALYZE entries ran: the rounds use fresh statistics"
            if stats.analyzed
            else "no ANALYZE (--no-analyze): the rounds use whatever autovacuum left"
        ),
        f"WatchLane: {rounds.watch_messages} messages, {rounds.watch_bytes:,} bytes;"
        f" check against the baseline's rows: {rounds.check or 'OK'}",
        f"GetLaneSnapshot: {rounds.get_outcome}",
        "memory ("
        + ("VmHWM after a reset" if memory.first_exact else "VmRSS sampled every 2 ms")
        + f"): RSS after the first snapshot {_mib(memory.after_first.rss)},"
        f" after {memory.concurrent} more at once {_mib(memory.after_all.rss)};"
        " peak growth over the RSS at each timed round's start: "
        + ", ".join(_mib(kib) for kib in rounds.peak_growth_kib),
        "timings per round (ms): baseline "
        + ", ".join(f"{t.total * 1e3:.1f}" for t in chain)
        + "; WatchLane "
        + ", ".join(f"{s * 1e3:.1f}" for s in rounds.watch),
    ]
    return "\n".join(lines)


# -- entry point ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.snapshot_cost",
        description="WatchLane's snapshot of a long transcript versus selecting and encoding"
        " the same rows; the service's memory while it streams.",
    )
    parser.add_argument("--entries", type=int, default=10_000, help="transcript entries (10000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (5)")
    parser.add_argument(
        "--mean-entry-bytes",
        type=float,
        default=1000.0,
        help="scale of the entry sizes (1000: about 1.2 KiB per entry on average)",
    )
    parser.add_argument("--prompts-per-run", type=int, default=20, help="user messages per run")
    parser.add_argument("--turns-per-run", type=int, default=4, help="tool turns per run (4)")
    parser.add_argument("--calls", type=int, default=2, help="tool calls per turn (2)")
    parser.add_argument(
        "--concurrent", type=int, default=4, help="watchers snapshotting at once (4)"
    )
    parser.add_argument("--seed", type=int, default=8, help="seed of the texts (8)")
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=30.0,
        help="limit of the one transcript query timed before ANALYZE, seconds (30; 0: skip)",
    )
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not ANALYZE the entries table after the build (the rounds then run with"
        " whatever statistics autovacuum left)",
    )
    add_database_url(parser)
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="profile the service with py-spy during the timed rounds (FILE.svg: flame graph,"
        " FILE.json: speedscope, else collapsed stacks)",
    )
    args = parser.parse_args(argv)
    if args.entries < 2:
        parser.error("--entries must be at least 2 (a run places a prompt and an answer)")
    if min(args.repeats, args.prompts_per_run, args.concurrent) < 1:
        parser.error("--repeats, --prompts-per-run and --concurrent must be >= 1")
    if args.turns_per_run < 0 or args.calls < 1 or args.mean_entry_bytes <= 0:
        parser.error("--turns-per-run must be >= 0, --calls >= 1, --mean-entry-bytes > 0")
    return args


async def run(args: argparse.Namespace) -> int:
    chunk_bytes = WatchSettings().chunk_bytes
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    small_lane = f"small-{uuid.uuid4().hex[:8]}"
    async with provision_database(args.database_url) as db:
        print(f"PostgreSQL {db.version} ready ({db.description}); building ...", flush=True)
        async with run_service(db.url, notify=True) as service:
            built = await build(args, service.address, small_lane)
        print(
            f"built {args.entries:,} entries in {built.seconds:.1f} s ({built.rpcs:,} RPCs);"
            " probing the transcript query before ANALYZE ...",
            flush=True,
        )
        statistics_ = await settle_statistics(db, built, args.probe_timeout, not args.no_analyze)
        print("restarting the service ...", flush=True)
        async with (
            run_service(db.url, notify=True) as service,
            grpc.aio.insecure_channel(service.address, options=options) as channel,
        ):
            # Warm-up on the small lane: the code paths of a watch and a snapshot.
            await watch_snapshot(channel, small_lane)
            await get_snapshot(channel, small_lane)
            memory = await measure_memory(args, service.pid, channel, built.lane_id)
            print(
                f"memory: peak growth {_mib(memory.first_growth_kib)} on the first snapshot;"
                f" timing {args.repeats} rounds ...",
                flush=True,
            )
            profiler = None
            if args.py_spy is not None:
                profiler = await start_profiler(args.py_spy, service.pid, 3600)
            try:
                rounds = await time_rounds(args, db, service.pid, channel, built, chunk_bytes)
            finally:
                if profiler is not None and profiler.returncode is None:
                    profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                await finish_profiler(profiler)
    print()
    print(report(args, db, built, rounds, memory, chunk_bytes, statistics_))
    return 0 if rounds.check is None else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
