"""A watcher process for the slow-watcher test: it reads the snapshot, says so, and is then
frozen by the test (SIGSTOP) — a client that really stops reading, down to its TCP socket.
Once thawed it drains the stream and prints how it ended as one JSON line. With ``export`` as
its third argument it does the same with an ExportLane stream (its first piece, then
frozen). Tests start it with :func:`frozen_client`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc


async def main(target: str, lane_id: str, stream: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        call: Any = (
            stub.ExportLane(pb.ExportLaneRequest(lane_id=lane_id))
            if stream == "export"
            else stub.WatchLane(pb.WatchLaneRequest(lane_id=lane_id))
        )
        await call.read()
        print("ready", flush=True)
        received = 0
        outcome: dict[str, object] = {}
        try:
            while await call.read() is not grpc.aio.EOF:
                received += 1
            outcome = {"code": "OK"}
        except grpc.aio.AioRpcError as error:
            info = error_details_pb2.ErrorInfo()
            status = rpc_status.from_call(error)
            for detail in status.details if status else ():
                detail.Unpack(info)
            outcome = {"code": error.code().name, "reason": info.reason, **info.metadata}
        print(json.dumps({**outcome, "received": received}), flush=True)


@contextlib.asynccontextmanager
async def frozen_client(
    port: int, lane_id: str, stream: str = "watch"
) -> AsyncIterator[asyncio.subprocess.Process]:
    """This module as a process reading ``lane_id``'s ``stream`` (``watch`` or ``export``)
    from the server on ``port``, frozen once it has its first message: a client that stopped
    reading. Send it SIGCONT to thaw it, then read its outcome line from its stdout; it is
    thawed and killed on exit."""
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.stalled_watcher",
        f"127.0.0.1:{port}", lane_id, stream,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        assert await asyncio.wait_for(client.stdout.readline(), 30) == b"ready\n"
        client.send_signal(signal.SIGSTOP)
        yield client
    finally:
        if client.returncode is None:
            client.send_signal(signal.SIGCONT)
            client.kill()
        await client.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "watch"))
