"""TLS on the gRPC port, with certificates made in the test: server-only and mutual TLS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import lane_service_pb2_grpc

from lane.server.app.config import ConfigError, Settings
from lane.server.app.server import start_server
from tests.integration.test_app import _service_process

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def issue(
    subject: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None, *, ca: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for ``subject`` signed by ``issuer`` (self-signed when None)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    signer_cert, signer_key = issuer if issuer else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(signer_cert.subject if signer_cert else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(signer_key, hashes.SHA256()), key


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Certificates:
    ca_file: Path
    server_cert_file: Path
    server_key_file: Path
    ca: bytes
    client_cert: bytes
    client_key: bytes


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    folder = tmp_path_factory.mktemp("tls")
    ca = issue("lane test CA", None, ca=True)
    server = issue("localhost", ca, ca=False)
    client = issue("driver-1", ca, ca=False)
    (folder / "ca.pem").write_bytes(pem(ca[0]))
    (folder / "server.pem").write_bytes(pem(server[0]))
    (folder / "server.key").write_bytes(pem_key(server[1]))
    return Certificates(
        ca_file=folder / "ca.pem",
        server_cert_file=folder / "server.pem",
        server_key_file=folder / "server.key",
        ca=pem(ca[0]),
        client_cert=pem(client[0]),
        client_key=pem_key(client[1]),
    )


async def _lanes(channel: grpc.aio.Channel) -> int:
    stub = lane_service_pb2_grpc.LaneServiceStub(channel)
    answer = await stub.ListLanes(pb.ListLanesRequest(page_size=1), timeout=5)
    return len(answer.lanes)


@contextlib.asynccontextmanager
async def tls_service(
    database_url: str, certificates: Certificates, *, mutual: bool
) -> AsyncIterator[str]:
    """The service with TLS on its gRPC port (``mutual``: clients need a certificate the test
    CA signed); yields its target, ``localhost:PORT`` (the name the certificate is for)."""
    settings = Settings(
        database_url=database_url,
        tls_cert_file=certificates.server_cert_file,
        tls_key_file=certificates.server_key_file,
        tls_client_ca_file=certificates.ca_file if mutual else None,
    )
    running = await start_server(settings, listen="127.0.0.1:0")
    try:
        yield f"localhost:{running.port}"
    finally:
        await running.stop(0.5)


async def test_tls_serves_only_tls_clients(
    session_database_url: str, certificates: Certificates
) -> None:
    async with tls_service(session_database_url, certificates, mutual=False) as target:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificates.ca)
        async with grpc.aio.secure_channel(target, credentials) as channel:
            assert await _lanes(channel) >= 0
        async with grpc.aio.insecure_channel(target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _lanes(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate(
    session_database_url: str, certificates: Certificates
) -> None:
    async with tls_service(session_database_url, certificates, mutual=True) as target:
        with_client = grpc.ssl_channel_credentials(
            root_certificates=certificates.ca,
            private_key=certificates.client_key,
            certificate_chain=certificates.client_cert,
        )
        async with grpc.aio.secure_channel(target, with_client) as channel:
            assert await _lanes(channel) >= 0
        without_client = grpc.ssl_channel_credentials(root_certificates=certificates.ca)
        async with grpc.aio.secure_channel(target, without_client) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _lanes(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_settings_come_in_pairs(certificates: Certificates) -> None:
    with pytest.raises(ConfigError, match="LANE_TLS_KEY_FILE"):
        Settings.from_env({"LANE_TLS_CERT_FILE": str(certificates.server_cert_file)})
    with pytest.raises(ConfigError, match="LANE_TLS_CERT_FILE"):
        Settings.from_env({"LANE_TLS_CERT_FILE": "/nonexistent.pem", "LANE_TLS_KEY_FILE": "x"})


@pytest.mark.parametrize(
    ("variable", "case"),
    [
        ("LANE_TLS_CERT_FILE", "cert not PEM"),
        ("LANE_TLS_KEY_FILE", "key not PEM"),
        ("LANE_TLS_KEY_FILE", "key of another certificate"),
        ("LANE_TLS_CLIENT_CA_FILE", "client CA not PEM"),
    ],
)
async def test_a_bad_tls_file_stops_start_up_with_exit_2_naming_it(
    certificates: Certificates, tmp_path: Path, variable: str, case: str
) -> None:
    der = tmp_path / "server.der"
    der.write_bytes(
        x509.load_pem_x509_certificate(certificates.server_cert_file.read_bytes()).public_bytes(
            serialization.Encoding.DER
        )
    )
    other_key = tmp_path / "other.key"
    other_key.write_bytes(pem_key(ec.generate_private_key(ec.SECP256R1())))
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    env = {
        "LANE_DATA_DIR": str(tmp_path / "data"),
        "LANE_LISTEN": "127.0.0.1:0",
        "LANE_TLS_CERT_FILE": str(certificates.server_cert_file),
        "LANE_TLS_KEY_FILE": str(certificates.server_key_file),
    }
    bad = {
        "cert not PEM": der,
        "key not PEM": not_pem,
        "key of another certificate": other_key,
        "client CA not PEM": not_pem,
    }[case]
    env[variable] = str(bad)
    log = tmp_path / "service.log"
    async with _service_process(env, log, tmp_path) as process:
        status = await asyncio.wait_for(process.wait(), timeout=30)
    output = log.read_text()
    assert status == 2, output
    assert f"configuration error: {variable}='{bad}'" in output
    assert not (tmp_path / "data").exists()  # stopped before anything started
