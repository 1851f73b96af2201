"""Checking the TLS files at start-up, so a bad one stops the service naming its variable.

gRPC reads the certificate chain and the key only when the port is bound, and then reports a
non-PEM file or a key that is not the certificate's as "Failed to bind to address". Loading the
files here the way a TLS server does turns each of those into a configuration error.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsFileError(ValueError):
    """A TLS file the service cannot use: the variable naming it, and why."""

    def __init__(self, variable: str, path: Path, problem: str) -> None:
        super().__init__(f"{variable}={str(path)!r}: {problem}")
        self.variable = variable
        self.path = path
        self.problem = problem


def _no_password() -> bytes:
    # gRPC has no way to take a key's password: an encrypted key fails here, not in a prompt.
    return b""


def _certificates(variable: str, path: Path) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=str(path))
    except ssl.SSLError:
        raise TlsFileError(variable, path, "not a PEM certificate file") from None
    except OSError as err:
        raise TlsFileError(variable, path, f"cannot read it: {err.strerror}") from None


def check_tls_files(cert: Path, key: Path, client_ca: Path | None) -> None:
    """Raise :class:`TlsFileError` unless ``cert`` holds PEM certificates, ``key`` an
    unencrypted PEM private key of the first of them, and ``client_ca`` (if any) PEM
    certificates."""
    _certificates("LANE_TLS_CERT_FILE", cert)
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key), password=_no_password)
    except ssl.SSLError as err:
        problem = (
            "the key does not match the certificate in LANE_TLS_CERT_FILE"
            if err.reason == "KEY_VALUES_MISMATCH"
            else "not an unencrypted PEM private key"
        )
        raise TlsFileError("LANE_TLS_KEY_FILE", key, problem) from None
    except OSError as err:
        raise TlsFileError("LANE_TLS_KEY_FILE", key, f"cannot read it: {err.strerror}") from None
    if client_ca is not None:
        _certificates("LANE_TLS_CLIENT_CA_FILE", client_ca)
