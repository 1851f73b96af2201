"""``lane serve``: the service's settings as command-line flags.

Every setting of ``service/lane/server/app/config.py`` (its ``SETTINGS`` table) is a flag named
after its variable (``LANE_DB_POOL_SIZE`` is ``--db-pool-size``), except secrets, which only the
environment may hold. A flag beats the variable, which beats the default: a given flag is put
into the process's environment before the settings are read, so worker processes, which read
the same environment, see it too.

The server is another distribution (``lane-service``) than this client (``lane-client``).
Without it, ``lane serve`` says how to install it and exits 1 instead of failing on an import.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lane.server.app.config import Setting

__all__ = ["SERVER_DISTRIBUTION", "SERVER_NOT_INSTALLED", "SERVER_PACKAGE", "add_serve"]

#: The server's distribution and its import package (imported only by ``lane serve``, below).
SERVER_DISTRIBUTION = "lane-service"
SERVER_PACKAGE = "lane.server"

SERVER_NOT_INSTALLED = (
    f"lane serve needs the server, which is not installed here (lane-client is the client "
    f"alone). Install the {SERVER_DISTRIBUTION} distribution beside it: pip install "
    f"{SERVER_DISTRIBUTION}, or from the service's repository pip install ./clients/python . "
    f"(./dev serve does it in .venv)."
)

_DESCRIPTION = (
    "Run the lane gRPC service until SIGTERM or Ctrl-C. Each setting is a flag or an "
    "environment variable (the flag wins; an empty value counts as unset). Exit status: 0 after "
    "a graceful shutdown, 1 if start-up failed, 2 for a bad configuration value."
)


def _server_settings() -> tuple[Setting, ...] | None:
    """The server's settings table; None when the server package (``lane.server``, a portion of
    the ``lane`` namespace from another distribution) is not installed. A module missing inside
    an installed server (a broken install) still raises."""
    try:
        from lane.server.app.config import SETTINGS
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if missing == SERVER_PACKAGE or missing.startswith(SERVER_PACKAGE + "."):
            return None
        raise
    return SETTINGS


def add_serve(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], *, flags: bool = True
) -> None:
    """Add the ``serve`` subcommand, with one flag per setting of the service unless
    ``flags`` is false (reading the settings table imports the whole service, about half a
    second that other subcommands need not pay)."""
    command = commands.add_parser(
        "serve",
        help="run the lane service until SIGTERM or Ctrl-C",
        description=_DESCRIPTION,
    )
    command.set_defaults(handler=_serve)
    if not flags:
        return
    settings = _server_settings()
    if settings is None:
        command.description = f"{_DESCRIPTION} {SERVER_NOT_INSTALLED}"
        return

    group = command.add_argument_group("settings (flag, variable, default)")
    secrets: list[str] = []
    for setting in settings:
        if setting.secret:
            secrets.append(f"{setting.variable} ({setting.meaning}; default: {setting.default})")
            continue
        group.add_argument(
            setting.flag,
            dest=setting.variable,
            metavar="VALUE",
            help=f"{setting.meaning} [${setting.variable}; default: {setting.default}]",
        )
    if secrets:
        command.epilog = "Environment only (secrets stay out of process listings): " + "; ".join(
            secrets
        )


def _serve(args: argparse.Namespace) -> int:
    settings = _server_settings()
    if settings is None:
        print(SERVER_NOT_INSTALLED, file=sys.stderr)
        return 1

    given_as: dict[str, str] = {}
    for setting in settings:
        value = getattr(args, setting.variable, None)
        if value is not None:
            os.environ[setting.variable] = value
            given_as[setting.variable] = setting.flag
    # As in service/lane/server/app/__main__.py: no gRPC fork handlers for the pg_ctl the server
    # may run.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    # Imported here: the server pulls in grpc servers, psycopg pools and pgserver, which
    # client-only subcommands should not pay for.
    from lane.server.app.main import main as serve_main

    return serve_main(given_as=given_as)
