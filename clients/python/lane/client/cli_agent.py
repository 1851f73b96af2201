"""``lane agent``: its command-line arguments (the agent itself is :mod:`lane.client.agent`)."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

from lane.client.cli_connection import Connection, add_connection_options, run_client, seconds

# The defaults, without importing the driver or a provider SDK for ``lane --help``.
CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 60.0
MAX_RETRY_AFTER_SECONDS = 60.0

__all__ = ["add_agent"]

_DESCRIPTION = (
    "Run a small coding agent on a real model: it works in the current directory with the "
    "tools shell, read_file and write_file, and its answers stream into the lane as they are "
    "written (lane watch LANE draws them live). MODEL is PROVIDER:NAME, the provider one of "
    "openai (Chat Completions; with --base-url any OpenAI-compatible server), "
    "openai-responses (Responses) or anthropic (Messages). Keys come from OPENAI_API_KEY or "
    "ANTHROPIC_API_KEY. A provider that goes silent, drops the connection or sends a broken "
    "chunk is asked again (up to 4 retries, recorded in the lane); one that asks to wait "
    "longer than --max-retry-after fails the run. Ctrl-C aborts the run (twice quits). "
    "Exit status: 0 completed, "
    "3 aborted, 1 failed or unreachable, 2 bad arguments or a missing key or SDK."
)


def add_agent(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``agent`` subcommand."""
    command = commands.add_parser(
        "agent",
        help="run a coding agent on a real model (shell, read_file, write_file)",
        description=_DESCRIPTION,
    )
    command.add_argument("prompt", metavar="PROMPT", help="the task; - reads it from stdin")
    command.add_argument(
        "--model", required=True, metavar="PROVIDER:NAME", help="e.g. openai:gpt-5-mini"
    )
    command.add_argument("--lane", help="the lane to use (default: a new agent-... lane)")
    command.add_argument(
        "--base-url", metavar="URL", help="the provider's API address (compatible servers)"
    )
    command.add_argument("--system", help="the system prompt (default: a coding agent's)")
    command.add_argument("--max-tokens", type=int, help="the limit of each answer")
    command.add_argument(
        "--max-turns", type=int, default=50, help="turns before the run fails (default: 50)"
    )
    command.add_argument(
        "--thinking-budget",
        type=int,
        metavar="TOKENS",
        help="anthropic: extended thinking with this budget",
    )
    command.add_argument(
        "--reasoning-effort",
        metavar="EFFORT",
        help="openai-responses: the reasoning effort (low, medium, high); summaries stream",
    )
    command.add_argument(
        "--lease-seconds", type=int, default=30, help="the driver's lease (default: 30)"
    )
    provider = command.add_argument_group("the model's provider")
    provider.add_argument(
        "--model-connect-timeout",
        type=seconds,
        default=CONNECT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="give an attempt up when no connection to the provider is made within this long "
        f"(default: {CONNECT_TIMEOUT_SECONDS:g}; retried)",
    )
    provider.add_argument(
        "--model-read-timeout",
        type=seconds,
        default=READ_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="give an attempt up when the provider sends nothing for this long, before or within "
        f"its answer (default: {READ_TIMEOUT_SECONDS:g}; retried)",
    )
    provider.add_argument(
        "--max-retry-after",
        type=seconds,
        default=MAX_RETRY_AFTER_SECONDS,
        metavar="SECONDS",
        help="fail the run when the provider asks to retry after longer than this "
        f"(default: {MAX_RETRY_AFTER_SECONDS:g})",
    )
    add_connection_options(command)
    command.set_defaults(handler=_agent)


def _agent(args: argparse.Namespace) -> int:
    from lane.client.agent import make_model, run_agent, system_prompt
    from lane.client.demo import configure_demo_logging

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    options: dict[str, object] = {
        "connect_timeout": args.model_connect_timeout,
        "read_timeout": args.model_read_timeout,
    }
    if args.thinking_budget is not None:
        options["thinking_budget"] = args.thinking_budget
    if args.reasoning_effort is not None:
        options["reasoning_effort"] = args.reasoning_effort
    try:
        model = make_model(
            args.model,
            base_url=args.base_url,
            system=args.system or system_prompt(),
            max_tokens=args.max_tokens,
            options=options,
        )
    except (ValueError, ImportError, TypeError) as err:
        print(f"lane agent: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # the SDK refused its settings (say, no key it can find)
        print(f"lane agent: cannot make the model: {err}", file=sys.stderr)
        return 2
    lane_id = args.lane or f"agent-{uuid.uuid4().hex[:8]}"
    configure_demo_logging()

    async def work(stub: Any, connection: Connection) -> int:
        return await run_agent(
            stub,
            lane_id,
            prompt,
            model,
            lease_seconds=args.lease_seconds,
            max_turns=args.max_turns,
            max_retry_after=args.max_retry_after,
            target=connection.target,
        )

    return run_client(args, work)
