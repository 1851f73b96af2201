"""``lane serve``: the service's settings as command-line flags.

Every setting of ``service/app/config.py`` (its ``SETTINGS`` table) is a flag named after its
variable (``LANE_DB_POOL_SIZE`` is ``--db-pool-size``), except secrets, which only the
environment may hold. A flag beats the variable, which beats the default: a given flag is put
into the process's environment before the settings are read, so worker processes, which read
the same environment, see it too.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["add_serve"]

_DESCRIPTION = (
    "Run the lane gRPC service until SIGTERM or Ctrl-C. Each setting is a flag or an "
    "environment variable (the flag wins; an empty value counts as unset). Exit status: 0 after "
    "a graceful shutdown, 1 if start-up failed, 2 for a bad configuration value."
)


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
    from service.app.config import SETTINGS

    group = command.add_argument_group("settings (flag, variable, default)")
    secrets: list[str] = []
    for setting in SETTINGS:
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
    from service.app.config import SETTINGS

    given_as: dict[str, str] = {}
    for setting in SETTINGS:
        value = getattr(args, setting.variable, None)
        if value is not None:
            os.environ[setting.variable] = value
            given_as[setting.variable] = setting.flag
    # As in service/app/__main__.py: no gRPC fork handlers for the pg_ctl the server may run.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    # Imported here: the server pulls in grpc servers, psycopg pools and pgserver, which
    # client-only subcommands should not pay for.
    from service.app.main import main as serve_main

    return serve_main(given_as=given_as)
