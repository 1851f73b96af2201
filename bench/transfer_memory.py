"""Export and import memory: the service's peak resident memory while it exports a large lane
(read, and not read) and imports its file, beside a baseline measured in the same run.

Run from the repository root (virtualenv active)::

    python -m bench.transfer_memory [--events 60] [--event-kib 500] [--baseline-root DIR]

One database (an embedded PostgreSQL in a temp dir, or ``--database-url``); one lane whose run's
tool call reported ``--events`` progress results of ``--event-kib`` KiB (its export file is
about their product). For each service — the checkout at ``--baseline-root`` first when given
(e.g. ``git archive main | tar -x -C /tmp/main``: the same phases on the code before a change),
then this working tree — started as a subprocess (``python -m lane.server.app``), the phases
run in turn, each ``--rounds`` times from a fresh peak (VmHWM reset through
``/proc/PID/clear_refs``); the last round's growth of the service's peak over its resident
memory before it is printed (the first rounds warm the process: its worker threads'
allocator arenas, its connections, the code's first use):

- **baseline (same service):** WatchLane of the lane from revision 0, read to its head: the
  service's other stream of the same rows, bounded by its byte budget
  (``LANE_WATCH_STREAM_BYTES``);
- **export, read:** ExportLane read to its end as fast as this client takes it;
- **export, not read:** ExportLane opened and never read for ``--settle`` seconds (below the
  write deadline), then cancelled;
- **import:** ImportLane of the file (pieces of 1 MiB) under a new id, then that lane deleted.

The export file's size is printed beside them: what holding the file once costs. The figures
are memory, not time; the exit status is 0 unless a phase fails.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from bench.commit_throughput import REPO_ROOT, provision_database, run_service
from bench.entry import add_database_url, open_channels, run_benchmark
from bench.memory import hwm_kib, reset_peak, rss_kib

if TYPE_CHECKING:
    from lane.v1.lane_service_pb2_grpc import LaneServiceAsyncStub as Stub

PIECE_BYTES = 1 << 20


@dataclass
class Phase:
    """One phase's memory: resident before it, and the peak during it (KiB)."""

    label: str
    before_kib: int
    peak_kib: int

    @property
    def growth_mib(self) -> float:
        return (self.peak_kib - self.before_kib) / 1024


async def _fill(stub: Stub, events: int, kib: int) -> str:
    """An idle lane whose log holds ``events`` progress results of ``kib`` KiB."""
    lane = await LaneScript.create(stub, prefix="transfer-memory")
    run = await lane.start_run("go")
    call = (await run.turn(tool_calls=["big"])).call("big").start()
    for n in range(events):
        call.progress(f"{n:04}" + "x" * (kib * 1024))
    await call.stage("done")
    await run.turn("done")
    await run.end()
    return lane.lane_id


async def _measured(
    label: str, pid: int, phase: Callable[[], AsyncIterator[None]], rounds: int
) -> Phase:
    """Run ``phase`` ``rounds`` times, each from a fresh peak; the service's memory around the
    last (the first ones warm the process: its worker threads' allocator arenas, its
    connections, the code's first use)."""
    measured = Phase(label, 0, 0)
    for _ in range(rounds):
        await asyncio.sleep(0.5)  # what the previous phase freed, freed
        before = rss_kib(pid)
        if not reset_peak(pid):
            raise RuntimeError("cannot reset the service's peak (/proc/PID/clear_refs)")
        async for _ in phase():
            pass
        measured = Phase(label, before, hwm_kib(pid))
    return measured


async def _watch(stub: Stub, lane_id: str, head: int) -> AsyncIterator[None]:
    call = stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id, after_revision=0))
    async for response in call:
        group = response.event_group
        if response.WhichOneof("item") == "event_group" and group.events[-1].revision >= head:
            break
    call.cancel()
    yield


async def _export(stub: Stub, lane_id: str, into: list[bytes]) -> AsyncIterator[None]:
    """Read the lane's export to its end, into ``into`` (its pieces, replacing what it held)."""
    call = stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))
    into[:] = [piece.data async for piece in call]
    yield


async def _stalled_export(stub: Stub, lane_id: str, settle: float) -> AsyncIterator[None]:
    call = stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))
    await call.read()  # the export started; then nothing is read
    await asyncio.sleep(settle)
    call.cancel()
    yield


async def _import(stub: Stub, file: bytes) -> AsyncIterator[None]:
    lane_id = f"transfer-memory-copy-{uuid.uuid4().hex[:8]}"

    async def pieces() -> AsyncIterator[pb.ImportLaneRequest]:
        for start in range(0, len(file), PIECE_BYTES):
            data = file[start : start + PIECE_BYTES]
            yield pb.ImportLaneRequest(lane_id="" if start else lane_id, data=data)

    await stub.ImportLane(pieces())
    await stub.DeleteLane(pb.DeleteLaneRequest(lane_id=lane_id))
    yield


async def measure(
    database_url: str, root: Path, lane_id: str | None, args: argparse.Namespace
) -> tuple[str, list[Phase], int]:
    """Every phase on the service of the checkout at ``root`` (building the lane first when
    ``lane_id`` is None); the lane's id, the phases and the export file's size."""
    async with (
        run_service(database_url, notify=True, root=root) as service,
        open_channels(service.address, 1) as (channel,),
    ):
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        if lane_id is None:
            print(f"filling a lane with {args.events} events of {args.event_kib} KiB ...")
            lane_id = await _fill(stub, args.events, args.event_kib)
        head = (await stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
        pid = service.pid
        rounds = args.rounds
        pieces: list[bytes] = []
        phases = [
            await _measured(
                "baseline: WatchLane from 0, read",
                pid,
                lambda: _watch(stub, lane_id, head.revision),
                rounds,
            ),
            await _measured("export, read", pid, lambda: _export(stub, lane_id, pieces), rounds),
            await _measured(
                f"export, not read for {args.settle:g} s",
                pid,
                lambda: _stalled_export(stub, lane_id, args.settle),
                rounds,
            ),
        ]
        file = b"".join(pieces)
        pieces.clear()
        phases.append(
            await _measured("import of its file", pid, lambda: _import(stub, file), rounds)
        )
        return lane_id, phases, len(file)


def report(results: Sequence[tuple[str, list[Phase]]], file_bytes: int) -> str:
    labels = [phase.label for phase in results[0][1]]
    width = max(len(label) for label in labels) + 2
    lines = [
        f"export file: {file_bytes / (1 << 20):.1f} MiB; peak resident memory over the phase's"
        " start (MiB):",
        f"{'phase':<{width}}" + "".join(f"{name:>24}" for name, _ in results),
    ]
    for at, label in enumerate(labels):
        row = "".join(f"{phases[at].growth_mib:>24.1f}" for _, phases in results)
        lines.append(f"{label:<{width}}{row}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.transfer_memory", description=__doc__)
    parser.add_argument("--events", type=int, default=60, help="progress events in the lane")
    parser.add_argument("--event-kib", type=int, default=500, help="KiB per event")
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds the export is left unread"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each phase runs; the last is printed (the first ones warm the process)",
    )
    parser.add_argument(
        "--baseline-root",
        type=Path,
        help="also measure the service of this checkout first (e.g. a git archive of main)",
    )
    add_database_url(parser)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    roots = (
        [(f"{args.baseline_root.name} (baseline)", args.baseline_root)]
        if args.baseline_root
        else []
    )
    roots.append(("this checkout", REPO_ROOT))
    results: list[tuple[str, list[Phase]]] = []
    lane_id: str | None = None
    file_bytes = 0
    async with provision_database(args.database_url) as db:
        for name, root in roots:
            lane_id, phases, file_bytes = await measure(db.url, root, lane_id, args)
            results.append((name, phases))
    print(report(results, file_bytes))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
