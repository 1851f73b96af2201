"""``lane agent``: a small coding agent on a real model, driving real tools through the lane.

Three tools, working in the current directory: the demo's ``shell`` and ``read_file``
(:mod:`lane.client.demo`), and ``write_file``:

``write_file`` (replay safe: writing the same text twice leaves the same file)
    Writes ``content`` to ``path`` (creating its parent directories) and says how many bytes.

The model is ``PROVIDER:MODEL`` (:func:`lane.client.models.model_from_spec`), streamed: the
lane holds its answer as it grows, so ``lane watch`` draws it live. Keys come from the
providers' usual variables (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``); a ``--base-url``
without ``OPENAI_API_KEY`` sends a placeholder key, as local OpenAI-compatible servers take
any. Ctrl-C aborts the run (twice: quits at once).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from lane.client.demo import READ_FILE, SHELL, drive_interruptibly
from lane.client.driver import MAX_RETRY_AFTER_SECONDS, Driver
from lane.client.model import Model, ModelRequest
from lane.client.tools import Tool, ToolContext, ToolResult, ToolResultLike, content_text
from lane.v1 import messages_pb2

__all__ = ["AGENT_TOOLS", "SYSTEM_PROMPT", "WRITE_FILE", "make_model", "run_agent"]

SYSTEM_PROMPT = (
    "You are a coding agent working in the directory {cwd}. Use the tools: shell runs a "
    "command there (output and exit status come back), read_file reads a file, write_file "
    "writes one. Look before you change anything, make the smallest change that does the job, "
    "check it by running it, and finish with a short summary of what you did."
)


async def _write_file(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
    path = Path(args["path"])
    data = args["content"].encode()

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    await asyncio.to_thread(write)
    return ToolResult(
        content=f"wrote {len(data)} bytes to {path}",
        details={"path": str(path), "bytes": len(data)},
    )


WRITE_FILE = Tool(
    name="write_file",
    description="Write a text file (replacing it); parent directories are created.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "content": {"type": "string"},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    execute=_write_file,
    replay="safe",
)

AGENT_TOOLS: tuple[Tool, ...] = (SHELL, READ_FILE, WRITE_FILE)


def make_model(
    spec: str,
    *,
    base_url: str | None = None,
    system: str | None = None,
    max_tokens: int | None = None,
    options: dict[str, Any] | None = None,
) -> Model:
    """The agent's model of ``spec`` (see the module doc for keys); ValueError or ImportError
    when it cannot be made, with a message for the user."""
    from lane.client.models import model_from_spec, parse_spec

    provider, _ = parse_spec(spec)
    extra: dict[str, Any] = dict(options or {})
    if base_url:
        extra["base_url"] = base_url
        if provider.startswith("openai") and not os.environ.get("OPENAI_API_KEY"):
            extra["api_key"] = "unused"
    if system:
        extra["system"] = system
    if max_tokens is not None:
        extra["max_tokens"] = max_tokens
    key = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
    if "api_key" not in extra and not os.environ.get(key):
        raise ValueError(f"set {key} (the {provider} API key), or pass --base-url")
    return model_from_spec(spec, **extra)


class _LastAnswer:
    """The model, remembering its last answer (printed when the run ends)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.last: messages_pb2.AssistantMessage | None = None

    async def __call__(self, request: ModelRequest) -> messages_pb2.AssistantMessage:
        self.last = await self.model(request)
        return self.last


async def run_agent(
    stub: Any,
    lane_id: str,
    prompt: str,
    model: Model,
    *,
    lease_seconds: int = 30,
    max_turns: int = 50,
    max_retry_after: float = MAX_RETRY_AFTER_SECONDS,
    target: str = "",
    out: Any = None,
) -> int:
    """Drive one run of the coding agent on ``lane_id``; print the final answer; return 0
    completed, 3 aborted, 1 otherwise (Ctrl-C aborts)."""
    out = out or sys.stdout
    driver = Driver(
        stub,
        lane_id,
        AGENT_TOOLS,
        lease_seconds=lease_seconds,
        max_turns=max_turns,
        abort_grace_seconds=10.0,
        max_retry_after=max_retry_after,
    )
    where = f" --target {target}" if target else ""
    print(f"lane agent: lane {lane_id}", file=out, flush=True)
    print(f"  watch it live:  lane watch {lane_id}{where}", file=out, flush=True)
    answers = _LastAnswer(model)
    status = await drive_interruptibly(
        driver, prompt, answers, name="lane agent", target=target, out=out
    )
    if status == 0 and answers.last is not None:
        text = content_text(
            [b for b in answers.last.content if b.WhichOneof("block") == "text"]
        ).strip()
        if text:
            print(text, file=out, flush=True)
    return status


def system_prompt() -> str:
    """The default system prompt, naming the working directory."""
    return SYSTEM_PROMPT.format(cwd=os.getcwd())
