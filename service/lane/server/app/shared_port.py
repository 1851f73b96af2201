"""The port ``lane serve --workers N`` shares: checked free, resolved (port 0), and held by the
supervisor with sockets bound with ``SO_REUSEPORT`` that never listen, so the workers may bind
it beside them and no other server can (see supervisor.py)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence

from lane.server.app.server import StartupError

_log = logging.getLogger(__name__)


def reserve_port(listen: str) -> tuple[list[socket.socket], str]:
    """Check that nothing listens on ``listen`` (``host:port``), pick a free port for port 0,
    and bind a socket with ``SO_REUSEPORT`` to each of its addresses; return the sockets (keep
    them open) and ``host:port`` with the port resolved.

    Raises :class:`StartupError` when the port is taken.
    """
    host, _, port_text = listen.rpartition(":")
    name = host.removeprefix("[").removesuffix("]")
    try:
        infos = socket.getaddrinfo(
            name, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as err:
        raise StartupError(f"cannot listen on {listen}: {err}") from None
    addresses = list(dict.fromkeys((info[0], str(info[4][0])) for info in infos))
    requested = int(port_text)
    error: OSError | None = None
    # Port 0: the free port found may be taken before it is reserved; then try another.
    for _ in range(10 if requested == 0 else 1):
        try:
            port = _probe(addresses, requested)
        except OSError as err:
            error = err
            continue
        try:
            return _bind_reserved(addresses, port), f"{host}:{port}"
        except OSError as err:
            if requested != 0:
                # Nothing listens (the probe said so), but an earlier server's connections in
                # TIME_WAIT still hold the port without SO_REUSEPORT: go ahead unreserved.
                _log.info("port %d not reserved (%s); the workers bind it anyway", port, err)
                return [], f"{host}:{port}"
            error = err
    raise StartupError(f"cannot listen on {listen}: {error}")


def _probe(addresses: Sequence[tuple[socket.AddressFamily, str]], port: int) -> int:
    """Bind each address as a listening server would (``SO_REUSEADDR``, which TIME_WAIT
    connections allow but any listening socket refuses); return the port bound."""
    for family, address in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
            port = probe.getsockname()[1]
    return port


def _bind_reserved(
    addresses: Sequence[tuple[socket.AddressFamily, str]], port: int
) -> list[socket.socket]:
    """Sockets bound with ``SO_REUSEPORT`` alone: workers (also ``SO_REUSEPORT``) may bind the
    port beside them, no other server can (gRPC's ``SO_REUSEADDR`` is no pass while a socket
    without it holds the port)."""
    held: list[socket.socket] = []
    try:
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((address, port))
    except OSError:
        for sock in held:
            sock.close()
        raise
    return held
