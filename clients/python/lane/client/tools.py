"""Tools for the driver SDK: declaration, results, and what a running tool can do.

A tool is a name, a JSON Schema for its arguments (checked with ``jsonschema``), a replay
policy and an async ``execute(args, ctx)``::

    async def greet(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        await ctx.progress("thinking about it")
        return f"hello, {args['name']}"

    GREET = Tool(
        name="greet",
        parameters={"type": "object", "properties": {"name": {"type": "string"}},
                    "required": ["name"]},
        execute=greet,
        replay="safe",            # "never" (default): never executed twice, even after a crash
    )

``execute`` returns a :data:`ToolResultLike`: a plain string (one text block), a
:class:`ToolResult` (content, details, usage, added tool names, terminate, is_error) or a
``lane.v1.ToolResult`` message. A tool that raises produces an error result whose text is the
exception's message (docs/contract.md, Tool calls). A plain ``def`` works too: it runs in a
worker thread (so a blocking tool does not stall the driver) and cannot report progress.

:class:`ToolContext` is the running call's view of the world: its ids, ``progress(result)``
and ``checkpoint(result)`` (each one ``UpdateToolCall``; a checkpoint is also the call's
durable recovery point), and ``abort_signal``, an :class:`asyncio.Event` set once the run's
abort has been seen. Tools stop cooperatively when it is set and return what they have
(usually an error result saying so).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import jsonschema
from lane.v1 import messages_pb2

__all__ = [
    "ReplayPolicyName",
    "Tool",
    "ToolContext",
    "ToolResult",
    "ToolResultLike",
    "content_text",
    "to_result_proto",
]

ReplayPolicyName = Literal["never", "safe"]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's result or progress snapshot (the harness's ``AgentToolResult``).

    ``content``
        A string (one text block) or a sequence of strings and ``lane.v1.ContentBlock``s.
    ``details``
        Any JSON value for applications; ``None`` means absent (a JSON ``null`` cannot be
        expressed here: pass a ``lane.v1.ToolResult`` with ``details_json="null"`` for that).
    ``usage``
        Token and cost accounting of the tool (e.g. a sub-agent), or None.
    ``added_tool_names``
        Tools this result makes active for the lane once placed.
    ``terminate``
        Ask the run to stop after this batch (it does when every call of the batch asks).
    ``is_error``
        The result reports a failure. Only meaningful for a final result.
    """

    content: str | Sequence[str | messages_pb2.ContentBlock] = ()
    details: Any = None
    usage: messages_pb2.Usage | None = None
    added_tool_names: Sequence[str] = ()
    terminate: bool = False
    is_error: bool = False

    @classmethod
    def error(cls, text: str, **fields: Any) -> ToolResult:
        """An error result with one text block."""
        return cls(content=text, is_error=True, **fields)


#: What ``execute`` may return, and what ``progress``/``checkpoint`` accept.
ToolResultLike = ToolResult | str | messages_pb2.ToolResult


def _block(item: str | messages_pb2.ContentBlock) -> messages_pb2.ContentBlock:
    if isinstance(item, str):
        return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=item))
    if isinstance(item, messages_pb2.ContentBlock):
        return item
    raise TypeError(f"tool result content must be str or ContentBlock, not {type(item).__name__}")


def to_result_proto(value: ToolResultLike) -> tuple[messages_pb2.ToolResult, bool]:
    """``value`` as a ``lane.v1.ToolResult`` and its is_error flag.

    Normalized like the service: absent details and usage stay absent, no empty
    added_tool_names, terminate only when true.
    """
    if isinstance(value, messages_pb2.ToolResult):
        copy = messages_pb2.ToolResult()
        copy.CopyFrom(value)
        return copy, False
    if isinstance(value, str):
        value = ToolResult(content=value)
    if not isinstance(value, ToolResult):
        raise TypeError(
            f"a tool must return str, ToolResult or lane.v1.ToolResult, not {type(value).__name__}"
        )
    content = [value.content] if isinstance(value.content, str) else list(value.content)
    result = messages_pb2.ToolResult(
        content=[_block(item) for item in content],
        added_tool_names=list(value.added_tool_names),
        terminate=bool(value.terminate),
    )
    if value.details is not None:
        result.details_json = json.dumps(value.details)
    if value.usage is not None:
        result.usage.CopyFrom(value.usage)
    return result, bool(value.is_error)


def content_text(blocks: Sequence[messages_pb2.ContentBlock]) -> str:
    """The text of ``blocks``: text blocks joined by newlines, images as ``[image]``."""
    parts: list[str] = []
    for block in blocks:
        kind = block.WhichOneof("block")
        if kind == "text":
            parts.append(block.text.text)
        elif kind == "image":
            parts.append(f"[image {block.image.mime_type}]")
        elif kind == "thinking":
            parts.append(block.thinking.thinking)
    return "\n".join(parts)


class _Reporter(Protocol):
    async def __call__(self, result: messages_pb2.ToolResult, checkpoint: bool) -> None: ...


class ToolContext:
    """What a running tool call sees: its ids, progress reporting, and the abort signal."""

    def __init__(
        self,
        *,
        lane_id: str,
        operation_id: str,
        turn_id: str,
        tool_call_id: str,
        tool_name: str,
        result_entry_id: str,
        replaying: bool,
        abort_signal: asyncio.Event,
        report: _Reporter,
    ) -> None:
        self.lane_id = lane_id
        self.operation_id = operation_id
        self.turn_id = turn_id
        self.tool_call_id = tool_call_id
        self.tool_name = tool_name
        #: The id the call's result entry will get (the invocation id).
        self.result_entry_id = result_entry_id
        #: True when this execution is a safe replay after a takeover.
        self.replaying = replaying
        #: Set once the run's abort has been seen: stop and return what you have.
        self.abort_signal = abort_signal
        self._report = report
        self._closed = False

    @property
    def cancelled(self) -> bool:
        """Whether the run's abort has been seen (``abort_signal.is_set()``)."""
        return self.abort_signal.is_set()

    async def progress(self, result: ToolResultLike) -> None:
        """Report the complete latest progress (one ``UpdateToolCall``; watchers see it)."""
        await self._send(result, checkpoint=False)

    async def checkpoint(self, result: ToolResultLike) -> None:
        """Report progress and keep it as the call's durable recovery point: if the driver dies,
        an interrupted call's result starts with this content."""
        await self._send(result, checkpoint=True)

    async def _send(self, result: ToolResultLike, *, checkpoint: bool) -> None:
        if self._closed:
            raise RuntimeError(
                f"tool call {self.tool_call_id} already finished; it cannot report progress"
            )
        proto, _ = to_result_proto(result)
        await self._report(proto, checkpoint)

    def close(self) -> None:
        """Refuse further progress (the driver calls this when ``execute`` returned)."""
        self._closed = True


Execute = Callable[[dict[str, Any], ToolContext], Awaitable[ToolResultLike]]
#: A plain function as a tool's ``execute``: run in a worker thread (it cannot report progress).
PlainExecute = Callable[[dict[str, Any], ToolContext], ToolResultLike]


def _is_async(execute: Callable[..., Any]) -> bool:
    """Whether calling ``execute`` gives an awaitable by its declaration (an ``async def``, a
    partial of one, an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(execute) or inspect.iscoroutinefunction(
        getattr(execute, "__call__", None)  # noqa: B004
    )


def _in_a_thread(execute: PlainExecute) -> Execute:
    """``execute`` (a plain function) as an async one: it runs in a worker thread, so a slow
    or blocking tool does not stall the driver; an awaitable it returns is awaited."""

    @functools.wraps(execute)
    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResultLike:
        result: Any = await asyncio.to_thread(execute, args, ctx)
        if inspect.isawaitable(result):
            result = await result
        return cast(ToolResultLike, result)

    return run


@dataclass(frozen=True)
class Tool:
    """A tool the driver can run.

    ``parameters`` is a JSON Schema (any draft ``jsonschema`` knows; its ``$schema`` picks it,
    else the latest); it is checked when the tool is declared. ``replay="safe"`` declares that
    the whole effect may be repeated after a crash (reads, queries): a driver taking the run
    over executes such a call again; ``"never"`` calls get an interruption result instead.

    ``execute`` is an ``async def`` (it may report progress through its
    :class:`ToolContext`), or a plain function, which runs in a worker thread
    (``asyncio.to_thread``) so that it does not stall the driver.
    """

    name: str
    parameters: Mapping[str, Any]
    execute: Execute | PlainExecute
    replay: ReplayPolicyName = "never"
    description: str = ""
    _validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tool needs a name")
        if self.replay not in ("never", "safe"):
            raise ValueError(f"tool {self.name}: replay must be 'never' or 'safe'")
        if not callable(self.execute):
            raise TypeError(f"tool {self.name}: execute must be a function")
        if not _is_async(self.execute):
            object.__setattr__(self, "execute", _in_a_thread(cast(PlainExecute, self.execute)))
        validator_class = jsonschema.validators.validator_for(self.parameters)
        validator_class.check_schema(dict(self.parameters))
        object.__setattr__(self, "_validator", validator_class(self.parameters))

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> Awaitable[ToolResultLike]:
        """``execute(args, ctx)``, awaitable whichever kind of function it was given as."""
        return cast(Execute, self.execute)(args, ctx)

    def validate(self, args: Any) -> str | None:
        """None when ``args`` match the schema, else the validation message."""
        if not isinstance(args, dict):
            return f"arguments of tool {self.name} must be a JSON object"
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(args))
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        at = f" at /{where}" if where else ""
        return f"invalid arguments for tool {self.name}{at}: {error.message}"
