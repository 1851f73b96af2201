"""Helpers of the model adapter tests: a watcher that keeps every view, and comparisons of
streamed partials with the settled message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from lane.client.retry import RetryPolicy
from lane.client.watch import LaneView, watch_lane
from lane.v1 import events_pb2, messages_pb2, snapshot_pb2
from lane.v1 import lane_service_pb2 as pb

from tests.models.fake_provider import Gate

#: Retries in tests: quick when the provider names no delay.
QUICK_RETRY = RetryPolicy(initial_backoff=0.05, max_backoff=0.1, max_attempts=2)


class Watcher:
    """Follows a lane from its first snapshot, keeping every view."""

    def __init__(self, stub: Any, lane_id: str) -> None:
        self.stub = stub
        self.lane_id = lane_id
        self.views: list[LaneView] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Watcher:
        await self.stub.CreateLane(pb.CreateLaneRequest(lane_id=self.lane_id))
        self._task = asyncio.create_task(self._follow())
        await self.until(lambda: bool(self.views), "the first snapshot")
        return self

    async def _follow(self) -> None:
        async for view in watch_lane(self.stub, self.lane_id):
            self.views.append(view)
            self._changed.set()

    async def until(self, check: Callable[[], object], what: str) -> None:
        """Wait until ``check()`` holds for what the watcher saw."""

        async def wait() -> None:
            while not check():
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(wait(), 30)
        except TimeoutError:
            raise AssertionError(f"the watcher never saw {what}") from None

    async def streamed_at(
        self,
        gate: Gate,
        check: Callable[[messages_pb2.AssistantMessage], bool],
        what: str,
    ) -> None:
        """Wait until the provider holds at ``gate``, then until the message streaming in the
        lane passes ``check``: what the lane shows while the provider waits mid-answer."""
        await gate.reached.wait()
        await self.until(lambda: (m := self.streaming()) is not None and check(m), what)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def finish(self) -> None:
        """Catch up with the lane (checking fold == capture), then stop watching."""
        await self.caught_up()
        await self.stop()

    @property
    def snapshot(self) -> snapshot_pb2.LaneSnapshot:
        return self.views[-1].snapshot

    def events(self) -> list[events_pb2.HarnessEvent]:
        return [e for v in self.views for e in v.events]

    def partials(self) -> list[messages_pb2.AssistantMessage]:
        """Every streamed partial the watcher saw, in revision order."""
        out: list[messages_pb2.AssistantMessage] = []
        for event in self.events():
            kind = event.WhichOneof("kind")
            if kind == "message_start" and event.message_start.message.HasField("assistant"):
                message = event.message_start.message.assistant
                if message.stop_reason == messages_pb2.STOP_REASON_PENDING:
                    out.append(message)
            elif kind == "message_update":
                out.append(event.message_update.message)
        return out

    def streams(self) -> list[list[messages_pb2.AssistantMessage]]:
        """The streamed partials grouped per streamed message (each group opened by its
        message_start), in revision order."""
        out: list[list[messages_pb2.AssistantMessage]] = []
        for event in self.events():
            kind = event.WhichOneof("kind")
            if kind == "message_start" and event.message_start.message.HasField("assistant"):
                message = event.message_start.message.assistant
                if message.stop_reason == messages_pb2.STOP_REASON_PENDING:
                    out.append([message])
            elif kind == "message_update":
                out[-1].append(event.message_update.message)
        return out

    def streaming(self) -> messages_pb2.AssistantMessage | None:
        """The message streaming now, as the watcher's snapshot shows it."""
        operation = self.snapshot.operation
        return operation.streaming_message if operation.HasField("streaming_message") else None

    async def caught_up(self) -> None:
        """Wait until the watcher's revision is the lane's; check fold == capture."""
        answer = await self.stub.GetLaneSnapshot(pb.GetLaneSnapshotRequest(lane_id=self.lane_id))
        fresh = answer.snapshot
        await self.until(
            lambda: self.snapshot.revision >= fresh.revision, f"revision {fresh.revision}"
        )
        assert self.snapshot == fresh, "the watcher's fold differs from a capture"


def blocks(message: messages_pb2.AssistantMessage) -> list[tuple[str, str]]:
    """(kind, text so far) per block: text, thinking, or a tool call's name(arguments)."""
    out: list[tuple[str, str]] = []
    for block in message.content:
        kind = block.WhichOneof("block") or ""
        if kind == "text":
            out.append((kind, block.text.text))
        elif kind == "thinking":
            out.append((kind, block.thinking.thinking))
        elif kind == "tool_call":
            call = block.tool_call
            out.append((kind, f"{call.id} {call.name}({call.arguments_json}"))
    return out


def grows_into(
    earlier: messages_pb2.AssistantMessage, later: messages_pb2.AssistantMessage
) -> bool:
    """Whether ``later`` is ``earlier`` grown: the same blocks so far, each a prefix."""
    before, after = blocks(earlier), blocks(later)
    if len(before) > len(after):
        return False
    return all(
        kind == kind2 and text2.startswith(text)
        for (kind, text), (kind2, text2) in zip(before, after, strict=False)
    )


def check_partials(
    partials: list[messages_pb2.AssistantMessage], final: messages_pb2.AssistantMessage
) -> None:
    """Every partial is PENDING and grows into the next, the last into ``final``."""
    assert partials, "no partial was streamed"
    for partial in partials:
        assert partial.stop_reason == messages_pb2.STOP_REASON_PENDING
    for earlier, later in zip([*partials], [*partials[1:], final], strict=True):
        assert grows_into(earlier, later), f"{blocks(earlier)} does not grow into {blocks(later)}"


def without_time(message: messages_pb2.AssistantMessage) -> messages_pb2.AssistantMessage:
    copy = messages_pb2.AssistantMessage()
    copy.CopyFrom(message)
    copy.ClearField("timestamp")
    return copy


def assistant_messages(snap: snapshot_pb2.LaneSnapshot) -> list[messages_pb2.AssistantMessage]:
    return [
        e.message.message.assistant
        for e in snap.transcript
        if e.WhichOneof("payload") == "message"
        and e.message.message.WhichOneof("message") == "assistant"
    ]


def text_block(text: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(text=messages_pb2.TextContent(text=text))


def call_block(call_id: str, name: str, arguments: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(
        tool_call=messages_pb2.ToolCallContent(id=call_id, name=name, arguments_json=arguments)
    )


def thinking_block(text: str, signature: str | None = None) -> messages_pb2.ContentBlock:
    thinking = messages_pb2.ThinkingContent(thinking=text)
    if signature is not None:
        thinking.thinking_signature = signature
    return messages_pb2.ContentBlock(thinking=thinking)
