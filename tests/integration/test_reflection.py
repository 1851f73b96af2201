"""Server reflection v1 beside v1alpha, with the google.rpc error-detail types in every file
answer, and the ``buf curl`` examples of docs/cli.md run against the real service."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from lane.server.app.reflection import REFLECTION_V1, REFLECTION_V1ALPHA

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def reflect(channel: grpc.aio.Channel, service: str, request) -> object:
    method = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    call = method(iter([request]))
    answer = await call.read()
    call.cancel()
    return answer


@pytest.mark.parametrize("service", [REFLECTION_V1, REFLECTION_V1ALPHA])
async def test_both_reflection_versions_list_and_carry_error_details(
    lane_channel: grpc.aio.Channel, service: str
) -> None:
    listed = await reflect(
        lane_channel, service, reflection_pb2.ServerReflectionRequest(list_services="")
    )
    names = {s.name for s in listed.list_services_response.service}  # type: ignore[attr-defined]
    assert {"lane.v1.LaneService", REFLECTION_V1, REFLECTION_V1ALPHA} <= names
    for symbol in ("lane.v1.LaneService", "google.rpc.ErrorInfo", REFLECTION_V1):
        answer = await reflect(
            lane_channel,
            service,
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol),
        )
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw).name
            for raw in answer.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
        ]
        assert "google/rpc/error_details.proto" in files, (symbol, files)


def doc_examples() -> list[str]:
    """The ``buf curl`` command lines of docs/cli.md's "Generic gRPC tools"."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    section = doc.split("## Generic gRPC tools", 1)[1]
    return [line.strip() for line in section.splitlines() if line.strip().startswith("buf curl ")]


async def test_the_documented_buf_curl_examples_work(lane_server) -> None:
    buf = shutil.which("buf") or str(Path(sys.executable).parent / "buf")
    examples = doc_examples()
    assert len(examples) >= 3
    outputs = []
    for example in examples:
        args = example.replace("127.0.0.1:50051", f"127.0.0.1:{lane_server.port}").split()
        args = [arg.strip("'") for arg in args]
        process = await asyncio.create_subprocess_exec(
            buf, *args[1:], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=dict(os.environ),
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        outputs.append((process.returncode, out.decode(), err.decode()))
    listed = outputs[0]
    assert listed[0] == 0 and "lane.v1.LaneService/GetLaneSnapshot" in listed[1]
    assert "grpc.reflection.v1.ServerReflection/ServerReflectionInfo" in listed[1]
    assert outputs[1][0] == 0, outputs[1]
    assert isinstance(json.loads(outputs[1][1]), dict)
    refused = outputs[2]
    assert refused[0] != 0
    error = json.loads(refused[2])
    assert error["code"] == "not_found" and error["details"][0]["type"] == "google.rpc.ErrorInfo"
