"""A fleet of WatchLane streams in a process of its own, for the benchmarks.

The benchmarks that need watchers (:mod:`bench.watch_delivery`, ``bench.commit_throughput
--watchers N``) start this module as a subprocess with :func:`start_fleet`, so the watchers'
receive loop has its own interpreter, event loop and CPU account: the commands the benchmark
sends do not delay the receive timestamps, and the watchers do not slow the senders.

Each watcher is a real ``WatchLane`` stream without ``after_revision`` (one snapshot, then every
event group), opened through :func:`lane.client.connect.open_channel` with the watchers spread
over ``channels`` channels (HTTP/2 connections), and read to the end. Every group must continue
exactly from the watcher's last revision (a gap, a duplicate or an overlap is recorded as that
watcher's error), and a stream that fails or ends is an error too: nothing is resumed or
hidden. The receive time is ``time.time()`` right after the message is handed to the loop, and
the latency of a group is that minus its first event's ``commit_time`` (same host, same clock).

Protocol (one JSON object per line): the parent writes the configuration on stdin, then
commands; the child writes ``{"event": "ready", ...}`` once every watcher has its snapshot, and
``{"event": "result", ...}`` after ``finish``, then exits. Commands: ``window_start`` and
``window_end`` (count and time what arrives in between), ``finish`` with ``expect`` (the lane
revision each watcher must reach) and ``timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from lane.client.connect import open_channel
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Watchers taking their snapshot at once: the service's pool has 10 connections and a 3 s
#: checkout timeout, so a thousand snapshots at once would be refused with UNAVAILABLE.
ATTACH_CONCURRENCY = 16
_LAG_PROBE_SECONDS = 0.005


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """count, p50, p90, p99 and max of ``values`` (nearest rank), in the values' unit."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}

    def rank(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]

    return {
        "count": len(ordered),
        "p50": rank(0.5),
        "p90": rank(0.9),
        "p99": rank(0.99),
        "max": ordered[-1],
    }


# -- the child: the watchers themselves ---------------------------------------------------------


@dataclass
class _Watcher:
    lane_id: str
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    snapshot_revision: int = -1
    revision: int = -1
    expect: int | None = None
    groups: int = 0
    events: int = 0
    window_groups: int = 0
    window_events: int = 0
    error: str | None = None
    #: (first revision, events, commit_time, receive time) of every group, with ``records``.
    records: list[tuple[int, int, float, float]] = field(default_factory=list)

    def fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
        self.ready.set()
        self.caught_up.set()

    def check_caught_up(self) -> None:
        if self.expect is not None and self.revision >= self.expect:
            self.caught_up.set()


@dataclass
class _Fleet:
    keep_records: bool
    recording: bool = False
    stopping: bool = False
    window_started: float = 0.0
    window_seconds: float = 0.0
    latencies: array[float] = field(default_factory=lambda: array("d"))
    lags: array[float] = field(default_factory=lambda: array("d"))


async def _follow(
    watcher: _Watcher,
    stub: lane_service_pb2_grpc.LaneServiceAsyncStub,
    fleet: _Fleet,
    attach: asyncio.Semaphore,
) -> None:
    chunks_left = -1
    attaching = True
    await attach.acquire()
    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=watcher.lane_id))
    try:
        try:
            async for response in call:
                received = time.time()
                kind = response.WhichOneof("item")
                if kind == "event_group":
                    events = response.event_group.events
                    first = events[0].revision if events else -1
                    if chunks_left != 0 or first != watcher.revision + 1:
                        watcher.fail(
                            f"group at revision {first} after revision {watcher.revision}"
                            f" (snapshot chunks left: {chunks_left})"
                        )
                        return
                    for offset, event in enumerate(events):
                        if event.revision != first + offset:
                            watcher.fail(f"group from {first} holds revision {event.revision}")
                            return
                    commit = events[0].commit_time
                    commit_time = commit.seconds + commit.nanos * 1e-9
                    watcher.revision = first + len(events) - 1
                    watcher.groups += 1
                    watcher.events += len(events)
                    if fleet.recording:
                        watcher.window_groups += 1
                        watcher.window_events += len(events)
                        fleet.latencies.append(received - commit_time)
                    if fleet.keep_records:
                        watcher.records.append((first, len(events), commit_time, received))
                    watcher.check_caught_up()
                elif kind == "snapshot":
                    if watcher.revision >= 0:
                        watcher.fail("a second snapshot")
                        return
                    watcher.revision = response.snapshot.snapshot.revision
                    watcher.snapshot_revision = watcher.revision
                    chunks_left = response.snapshot.following_chunks
                elif kind == "transcript_chunk":
                    chunks_left -= 1
                if chunks_left == 0 and attaching:
                    attaching = False
                    attach.release()
                    watcher.ready.set()
        except grpc.aio.AioRpcError as exc:
            if not fleet.stopping:
                watcher.fail(f"{exc.code().name}: {exc.details()}")
            return
        if not fleet.stopping:
            watcher.fail("the stream ended")
    finally:
        call.cancel()
        if attaching:
            attach.release()


async def _probe_lag(fleet: _Fleet) -> None:
    """How late this process's event loop runs a timer: the part of a receive latency that is
    the watchers' own queueing, not the service's."""
    while True:
        started = time.perf_counter()
        await asyncio.sleep(_LAG_PROBE_SECONDS)
        if fleet.recording:
            fleet.lags.append(time.perf_counter() - started - _LAG_PROBE_SECONDS)


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _stdin_lines() -> AsyncIterator[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 28)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield json.loads(line)


async def _child(channels: int) -> None:
    lines = _stdin_lines()
    config = await anext(lines)
    fleet = _Fleet(keep_records=bool(config["records"]))
    watchers = [_Watcher(lane_id) for lane_id in config["lanes"]]
    attach = asyncio.Semaphore(ATTACH_CONCURRENCY)
    async with contextlib.AsyncExitStack() as stack:
        opened = [open_channel(config["target"]) for _ in range(max(1, channels))]
        for channel in opened:
            stack.push_async_callback(channel.close)
        stubs = [lane_service_pb2_grpc.LaneServiceStub(channel) for channel in opened]
        started = time.monotonic()
        tasks = [
            asyncio.create_task(_follow(w, stubs[i % len(stubs)], fleet, attach))
            for i, w in enumerate(watchers)
        ]
        probe = asyncio.create_task(_probe_lag(fleet))
        for watcher in watchers:
            await watcher.ready.wait()
        _emit(
            {
                "event": "ready",
                "watchers": len(watchers),
                "failed": sum(w.error is not None for w in watchers),
                "seconds": time.monotonic() - started,
            }
        )
        async for command in lines:
            if command["cmd"] == "window_start":
                fleet.recording, fleet.window_started = True, time.monotonic()
            elif command["cmd"] == "window_end":
                fleet.recording = False
                fleet.window_seconds = time.monotonic() - fleet.window_started
            elif command["cmd"] == "finish":
                expect: dict[str, int] = command["expect"]
                for watcher in watchers:
                    watcher.expect = expect.get(watcher.lane_id, watcher.revision)
                    watcher.check_caught_up()
                drain_started = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(float(command["timeout"])):
                        for watcher in watchers:
                            await watcher.caught_up.wait()
                drained = time.monotonic() - drain_started
                fleet.stopping = True
                probe.cancel()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(probe, *tasks, return_exceptions=True)
                _emit(
                    {
                        "event": "result",
                        "drain_seconds": drained,
                        "window_seconds": fleet.window_seconds,
                        "latency": percentiles(fleet.latencies),
                        "loop_lag": percentiles(fleet.lags),
                        "watchers": [
                            {
                                "lane_id": w.lane_id,
                                "snapshot_revision": w.snapshot_revision,
                                "revision": w.revision,
                                "expect": w.expect,
                                "groups": w.groups,
                                "events": w.events,
                                "window_groups": w.window_groups,
                                "window_events": w.window_events,
                                "error": w.error,
                                "records": w.records,
                            }
                            for w in watchers
                        ],
                    }
                )
                return


# -- the parent's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class WatcherResult:
    lane_id: str
    snapshot_revision: int
    revision: int
    expect: int | None
    groups: int
    events: int
    window_groups: int
    window_events: int
    error: str | None
    records: list[tuple[int, int, float, float]]

    @property
    def caught_up(self) -> bool:
        return self.error is None and self.expect is not None and self.revision >= self.expect


@dataclass(frozen=True)
class FleetResult:
    watchers: list[WatcherResult]
    drain_seconds: float
    window_seconds: float
    #: commit_time -> receive, seconds, of the groups received in the window.
    latency: dict[str, float]
    #: How late the watchers' event loop ran a 5 ms timer in the window, seconds.
    loop_lag: dict[str, float]

    @property
    def errors(self) -> list[str]:
        return [f"{w.lane_id}: {w.error}" for w in self.watchers if w.error is not None]

    @property
    def behind(self) -> list[WatcherResult]:
        """Watchers that did not reach the revision they were told to expect."""
        return [w for w in self.watchers if w.error is None and not w.caught_up]

    @property
    def window_events(self) -> int:
        return sum(w.window_events for w in self.watchers)

    @property
    def window_groups(self) -> int:
        return sum(w.window_groups for w in self.watchers)


@dataclass
class Fleet:
    """The running watcher process (see :func:`start_fleet`)."""

    process: asyncio.subprocess.Process
    ready_seconds: float

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def window_start(self) -> None:
        await self._send({"cmd": "window_start"})

    async def window_end(self) -> None:
        await self._send({"cmd": "window_end"})

    async def finish(self, expect: dict[str, int], drain_seconds: float) -> FleetResult:
        """Wait (at most ``drain_seconds``) until every watcher reached its lane's revision in
        ``expect``, then stop the watchers and return what they saw."""
        await self._send({"cmd": "finish", "expect": expect, "timeout": drain_seconds})
        message = await _read_message(self.process, drain_seconds + 60)
        if message.get("event") != "result":
            raise RuntimeError(f"the watcher process answered {message!r}")
        watchers = [
            WatcherResult(
                **{k: v for k, v in w.items() if k != "records"},
                records=[(int(a), int(b), float(c), float(d)) for a, b, c, d in w["records"]],
            )
            for w in message["watchers"]
        ]
        return FleetResult(
            watchers=watchers,
            drain_seconds=float(message["drain_seconds"]),
            window_seconds=float(message["window_seconds"]),
            latency=message["latency"],
            loop_lag=message["loop_lag"],
        )


async def _read_message(process: asyncio.subprocess.Process, seconds: float) -> dict[str, Any]:
    assert process.stdout is not None
    async with asyncio.timeout(seconds):
        line = await process.stdout.readline()
    if not line:
        raise RuntimeError(f"the watcher process exited (status {await process.wait()})")
    message: dict[str, Any] = json.loads(line)
    return message


@contextlib.asynccontextmanager
async def start_fleet(
    target: str,
    lanes: Sequence[str],
    *,
    channels: int,
    records: bool,
    ready_timeout: float = 600.0,
) -> AsyncIterator[Fleet]:
    """One watcher per entry of ``lanes`` (a lane may repeat), in a subprocess, spread over
    ``channels`` channels to ``target``; yields once every watcher has its snapshot.
    ``records``: keep every group's (revision, commit_time, receive time) for the result."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.watchers",
        "--channels",
        str(channels),
        cwd=REPO_ROOT,
        env=dict(os.environ),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 28,  # the result is one line: every watcher and, with records, every group
    )
    try:
        assert process.stdin is not None
        config = {"target": target, "lanes": list(lanes), "records": records}
        process.stdin.write(json.dumps(config).encode() + b"\n")
        await process.stdin.drain()
        message = await _read_message(process, ready_timeout)
        if message.get("event") != "ready":
            raise RuntimeError(f"the watcher process answered {message!r}")
        if message["failed"]:
            raise RuntimeError(f"{message['failed']} of {message['watchers']} watchers failed")
        yield Fleet(process, float(message["seconds"]))
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watchers", description=__doc__)
    parser.add_argument("--channels", type=int, default=8, help="channels to spread over")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_child(args.channels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
