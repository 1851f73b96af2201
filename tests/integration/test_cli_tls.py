"""The ``lane`` CLI and the SDK's :func:`lane.client.connect.connect` against the service's own
TLS and mutual-TLS modes: the right options connect, the wrong ones fail within the connect
timeout with the cause and the fix."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from lane.client.connect import connect, tls_credentials
from lane.client.reach import Unreachable
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from tests.integration.test_tls import Certificates, certificates, tls_service

__all__ = ["certificates"]  # the fixture, used by the tests below

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def lane(*args: str, **env: str) -> tuple[int, str]:
    """Run ``lane ARGS`` with a LANE_-free environment plus ``env``; its status and stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LANE_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lane.client", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean | env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode() + err.decode()


@pytest.fixture(scope="module")
def client_files(certificates: Certificates, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("client")
    cert, key = folder / "client.pem", folder / "client.key"
    cert.write_bytes(certificates.client_cert)
    key.write_bytes(certificates.client_key)
    return cert, key


@pytest_asyncio.fixture(loop_scope="session")
async def tls_target(session_database_url: str, certificates: Certificates) -> AsyncIterator[str]:
    async with tls_service(session_database_url, certificates, mutual=False) as target:
        yield target


@pytest_asyncio.fixture(loop_scope="session")
async def mtls_target(session_database_url: str, certificates: Certificates) -> AsyncIterator[str]:
    async with tls_service(session_database_url, certificates, mutual=True) as target:
        yield target


async def test_cli_reaches_a_tls_service(tls_target: str, certificates: Certificates) -> None:
    ca = str(certificates.ca_file)
    status, output = await lane("lanes", "--target", tls_target, "--ca-file", ca)
    assert status == 0 and output.startswith("LANE"), output
    status, output = await lane("lanes", LANE_TARGET=tls_target, LANE_CA_FILE=ca)
    assert status == 0, output
    # Plaintext to a TLS service: the cause and the fix, not a 30 s wait and "Socket closed".
    status, output = await lane("lanes", "--target", tls_target)
    assert status == 1
    assert f"cannot reach the lane service at {tls_target}" in output
    assert "may require TLS: add --tls" in output
    # TLS without trusting the service's CA.
    status, output = await lane("lanes", "--target", tls_target, "--tls")
    assert status == 1 and "certificate is not trusted" in output and "--ca-file" in output


async def test_cli_with_tls_against_a_plaintext_service(lane_server, certificates) -> None:
    target = f"127.0.0.1:{lane_server.port}"
    status, output = await lane("lanes", "--target", target, "--ca-file", str(certificates.ca_file))
    assert status == 1 and "does not speak TLS" in output and "Drop --tls" in output
    # The message alone: no raw gRPC core log line before it.
    assert output.startswith("lane: cannot reach"), output
    assert "Handshake failed" not in output and "ssl_transport_security" not in output


async def test_cli_reaches_a_mutual_tls_service(
    mtls_target: str, certificates: Certificates, client_files: tuple[Path, Path]
) -> None:
    ca = str(certificates.ca_file)
    cert, key = (str(path) for path in client_files)
    args = ("lanes", "--target", mtls_target, "--ca-file", ca)
    status, output = await lane(*args, "--cert-file", cert, "--key-file", key)
    assert status == 0, output
    status, output = await lane(*args, LANE_CLIENT_CERT_FILE=cert, LANE_CLIENT_KEY_FILE=key)
    assert status == 0, output
    status, output = await lane(*args)
    assert status == 1
    assert f"cannot reach the lane service at {mtls_target}" in output
    assert "--cert-file" in output and "--key-file" in output
    status, output = await lane(*args, "--cert-file", cert)
    assert status == 2 and "--cert-file and --key-file go together" in output


async def test_sdk_connect_with_tls_credentials(
    mtls_target: str, certificates: Certificates, client_files: tuple[Path, Path]
) -> None:
    cert, key = client_files
    credentials = tls_credentials(ca_file=certificates.ca_file, cert_file=cert, key_file=key)
    channel = await connect(mtls_target, credentials=credentials)
    async with channel:
        stub = lane_service_pb2_grpc.LaneServiceStub(channel)
        answer = await stub.ListLanes(pb.ListLanesRequest(page_size=1), timeout=5)
        assert len(answer.lanes) <= 1
    with pytest.raises(Unreachable, match="client certificate"):
        await connect(mtls_target, credentials=tls_credentials(ca_file=certificates.ca_file))
