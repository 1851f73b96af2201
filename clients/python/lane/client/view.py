"""Drawing a lane snapshot as terminal lines (pure: no I/O), for ``lane watch`` and
``lane snapshot``.

Layout, top to bottom: a header (lane, revision, message count); the content, which is the
transcript (user and assistant text, the assistant's thinking dimmed, each tool call the
assistant asked for, each placed tool result) followed by the open operation: the assistant
message streaming in (its thinking dimmed, its text ending in a ``▍`` cursor, the tool calls
being written), a scheduled retry, and the presentation-active tools — running ones with a
spinner, the elapsed seconds and their latest progress line, settled ones with their final
result marked ``waiting for placement`` — or, with no operation open, the last run's result;
then the inbox (messages queued with ``lane send``, until a run takes them); then a status
line. A scheduled retry says why the model call failed and the time left until the attempt.
A streaming block shows its last lines (the ones that change). A tool row names its status
before its arguments, so a narrow screen, which cuts lines at its right edge, keeps the
status.

With a ``height``, the content is a window of the rows that fit between the header and the
footer: its tail (follow mode), or the rows from ``top`` on (scrolled). :func:`render_frame`
also says where that window stands, for scrolling.

Styles (SGR escape sequences; all reset with ``ESC[0m`` at the end of the line):

=================  ==========  ============================================================
style              sequence    used for
=================  ==========  ============================================================
:data:`ERROR`      ``ESC[31m`` error results (``is_error``): placed, and settled rows
:data:`RUNNING`    ``ESC[36m`` running tool rows
:data:`WAITING`    ``ESC[33m`` settled rows without error, waiting for placement
:data:`DIM`        ``ESC[2m``  thinking, tool calls the assistant asked for, the status line
:data:`BOLD`       ``ESC[1m``  the header
=================  ==========  ============================================================

``ESC[31m`` (SGR 31, red foreground) is what the terminal tests look for in tmux's
``capture-pane -e`` output: tmux re-emits exactly that sequence for a red cell.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from lane.client.tools import content_text
from lane.v1 import entries_pb2, events_pb2, messages_pb2, snapshot_pb2

__all__ = [
    "BOLD",
    "CURSOR",
    "DIM",
    "ERROR",
    "RESET",
    "RUNNING",
    "SPINNER",
    "WAITING",
    "Frame",
    "Line",
    "ToolClock",
    "render",
    "render_frame",
]

ERROR = "\x1b[31m"
RUNNING = "\x1b[36m"
WAITING = "\x1b[33m"
DIM = "\x1b[2m"
BOLD = "\x1b[1m"
RESET = "\x1b[0m"

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
WAITING_MARK = "waiting for placement"
#: Ends the text of an assistant message still streaming.
CURSOR = "▍"

#: Lines of a result shown in the transcript (more are elided in the middle).
_RESULT_LINES = 4
_STATUS_NAMES = {
    snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED: "completed",
    snapshot_pb2.OPERATION_RESULT_STATUS_DECLINED: "declined",
    snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED: "aborted",
    snapshot_pb2.OPERATION_RESULT_STATUS_FAILED: "failed",
}
_KIND_NAMES = {
    snapshot_pb2.OPERATION_KIND_RUN: "run",
    snapshot_pb2.OPERATION_KIND_COMPACTION: "compaction",
    snapshot_pb2.OPERATION_KIND_NAVIGATION: "navigation",
}


@dataclass(frozen=True, slots=True)
class Line:
    """One screen line: plain text and the style it is drawn in."""

    text: str
    style: str = ""


class ToolClock:
    """When each presentation-active tool started, for the elapsed time of running rows.

    A ``tool_start`` event gives its commit time; a row first seen in a snapshot (the watcher
    joined while it ran) counts from when it was first seen.
    """

    def __init__(self) -> None:
        self.started: dict[str, float] = {}

    def observe(
        self,
        snapshot: snapshot_pb2.LaneSnapshot,
        events: Iterable[events_pb2.HarnessEvent] = (),
        now: float | None = None,
    ) -> None:
        """Note tool starts in ``events``; forget rows no longer in ``snapshot``."""
        now = time.time() if now is None else now
        for event in events:
            if event.WhichOneof("kind") == "tool_start":
                commit = event.commit_time
                at = commit.seconds + commit.nanos / 1e9 if event.HasField("commit_time") else now
                self.started[event.tool_start.tool_call_id] = min(at, now)
        active = {_row_id(row) for row in snapshot.operation.running_tools}
        for call_id in active:
            self.started.setdefault(call_id, now)
        for call_id in list(self.started):
            if call_id not in active:
                del self.started[call_id]

    def elapsed(self, tool_call_id: str, now: float) -> float:
        return max(0.0, now - self.started.get(tool_call_id, now))


def _row_id(row: snapshot_pb2.SnapshotTool) -> str:
    state = row.WhichOneof("state")
    if state == "settled":
        return row.settled.tool_call_id
    return row.running.tool_call_id


def _compact_json(text: str, limit: int = 80) -> str:
    try:
        shown = json.dumps(json.loads(text), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        shown = text
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _lines_of(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()] or [""]
    if len(lines) <= _RESULT_LINES:
        return lines
    return [lines[0], f"… ({len(lines) - 3} more lines)", *lines[-2:]]


def _tail_of(text: str) -> list[str]:
    """The last lines of a growing ``text`` (earlier ones counted)."""
    lines = [line.rstrip() for line in text.splitlines()] or [""]
    if text.endswith("\n"):
        lines.append("")
    if len(lines) <= _RESULT_LINES:
        return lines
    return [f"… ({len(lines) - _RESULT_LINES + 1} earlier lines)", *lines[-_RESULT_LINES + 1 :]]


def _labelled(label: str, lines: list[str], style: str = "") -> list[Line]:
    pad = " " * len(label)
    return [
        Line(f"{label}{line}" if i == 0 else f"{pad}{line}", style) for i, line in enumerate(lines)
    ]


def _thinking_lines(block: messages_pb2.ThinkingContent, streaming: bool) -> list[Line]:
    if block.redacted:
        return [Line("thinking: (redacted)", DIM)]
    lines = _tail_of(block.thinking) if streaming else _lines_of(block.thinking)
    return _labelled("thinking: ", lines, DIM)


def _streaming_lines(message: messages_pb2.AssistantMessage) -> list[Line]:
    """An assistant message still streaming: each block as it is so far, in order."""
    out: list[Line] = []
    for index, block in enumerate(message.content):
        kind = block.WhichOneof("block")
        last = index == len(message.content) - 1
        if kind == "thinking":
            out.extend(_thinking_lines(block.thinking, True))
        elif kind == "text":
            lines = _tail_of(block.text.text)
            if last:
                lines[-1] += CURSOR
            out.extend(_labelled("assistant: ", lines))
        elif kind == "tool_call":
            call = block.tool_call
            more = " …" if last else ""
            out.append(Line(f"  → {call.name} {_compact_json(call.arguments_json)}{more}", DIM))
    return out or [Line(f"assistant: {CURSOR}")]


def _message_lines(message: messages_pb2.AgentMessage) -> list[Line]:
    kind = message.WhichOneof("message")
    if kind == "user":
        text = content_text(message.user.content)
        return [
            Line(f"you: {line}" if i == 0 else f"     {line}")
            for i, line in enumerate(_lines_of(text))
        ]
    if kind == "assistant":
        out: list[Line] = []
        for block in message.assistant.content:
            if block.WhichOneof("block") == "thinking":
                out.extend(_thinking_lines(block.thinking, False))
        text = content_text(
            [b for b in message.assistant.content if b.WhichOneof("block") == "text"]
        )
        if text:
            out.extend(
                Line(f"assistant: {line}" if i == 0 else f"           {line}")
                for i, line in enumerate(_lines_of(text))
            )
        for block in message.assistant.content:
            if block.WhichOneof("block") == "tool_call":
                call = block.tool_call
                out.append(Line(f"  → {call.name} {_compact_json(call.arguments_json)}", DIM))
        if message.assistant.stop_reason == messages_pb2.STOP_REASON_ERROR:
            out.append(Line(f"assistant error: {message.assistant.error_message}", ERROR))
        return out or [Line("assistant: (no text)")]
    if kind == "tool_result":
        result = message.tool_result
        return _result_lines(
            result.tool_name, content_text(result.content), result.is_error, "  ", ""
        )
    if kind == "custom":
        return [Line(f"[{message.custom.role}]", DIM)]
    return []


def _result_lines(name: str, text: str, is_error: bool, indent: str, suffix: str) -> list[Line]:
    mark = "✗" if is_error else "✓"
    style = ERROR if is_error else ""
    lines = _lines_of(text)
    out = [Line(f"{indent}{mark} {name}: {lines[0]}{suffix}", style)]
    out.extend(Line(f"{indent}    {line}", style) for line in lines[1:])
    return out


def _entry_lines(entry: entries_pb2.Entry) -> list[Line]:
    payload = entry.WhichOneof("payload")
    if payload == "message":
        return _message_lines(entry.message.message)
    if payload == "compaction":
        summary = entry.compaction.summary.splitlines()
        return [Line(f"[compaction] {summary[0] if summary else ''}", DIM)]
    if payload == "branch_summary":
        return [Line("[branch summary]", DIM)]
    if payload == "custom":
        return [Line(f"[{entry.custom.custom_type}]", DIM)]
    return []


def _tool_rows(
    operation: snapshot_pb2.SnapshotOperation, clock: ToolClock, now: float, frame: int
) -> list[Line]:
    out: list[Line] = []
    spinner = SPINNER[frame % len(SPINNER)]
    for row in operation.running_tools:
        if row.WhichOneof("state") == "settled":
            settled = row.settled
            style = ERROR if settled.is_error else WAITING
            mark = "✗" if settled.is_error else "✓"
            outcome = "error" if settled.is_error else "done"
            out.append(
                Line(
                    f"  {mark} {settled.tool_name} · {outcome} · {WAITING_MARK} · "
                    f"{_compact_json(settled.arguments_json, 50)}",
                    style,
                )
            )
            out.extend(
                Line(f"      │ {line}", style)
                for line in _lines_of(content_text(settled.result.content))
            )
        else:
            running = row.running
            elapsed = clock.elapsed(running.tool_call_id, now)
            out.append(
                Line(
                    f"  {spinner} {running.tool_name} · running {elapsed:.1f}s · "
                    f"{_compact_json(running.arguments_json, 50)}",
                    RUNNING,
                )
            )
            if running.HasField("result"):
                progress = content_text(running.result.content).rstrip().splitlines()
                if progress:
                    out.append(Line(f"      │ {progress[-1]}", RUNNING))
    return out


@dataclass(frozen=True, slots=True)
class Frame:
    """A drawn screen, and where its window onto the content stands."""

    #: The screen lines, each at most ``width`` cells wide plus its escape sequences.
    lines: list[str]
    #: Index of the first content row shown.
    top: int
    #: Content rows the screen has room for.
    room: int
    #: Content rows in all (transcript and operation section).
    total: int

    @property
    def bottom(self) -> int:
        """The ``top`` of the window showing the content's tail."""
        return max(0, self.total - self.room)


def render(
    snapshot: snapshot_pb2.LaneSnapshot,
    *,
    clock: ToolClock | None = None,
    now: float | None = None,
    width: int = 120,
    height: int | None = None,
    frame: int = 0,
    status: str = "",
    color: bool = True,
) -> list[str]:
    """The screen for ``snapshot``: at most ``height`` lines (None: all), each at most
    ``width`` cells wide plus its escape sequences; the content's tail when it does not fit."""
    return render_frame(
        snapshot,
        clock=clock,
        now=now,
        width=width,
        height=height,
        frame=frame,
        status=status,
        color=color,
    ).lines


def render_frame(
    snapshot: snapshot_pb2.LaneSnapshot,
    *,
    clock: ToolClock | None = None,
    now: float | None = None,
    width: int = 120,
    height: int | None = None,
    frame: int = 0,
    status: str = "",
    color: bool = True,
    top: int | None = None,
) -> Frame:
    """Like :func:`render`, showing the content from row ``top`` on (None: its tail; clamped
    so the window stays full), and saying where the window stands. Scrolled away from the
    tail, the status line ends with the rows shown."""
    now = time.time() if now is None else now
    clock = clock or ToolClock()
    header = Line(
        f"lane {snapshot.lane_id} · revision {snapshot.revision} · "
        f"{snapshot.stats.message_count} messages",
        BOLD,
    )
    content: list[Line] = []
    for entry in snapshot.transcript:
        content.extend(_entry_lines(entry))
    content.extend(_operation_lines(snapshot, clock, now, frame))
    content.extend(_queue_lines(snapshot))
    footer_count = (1 if status or height is not None else 0) + (1 if snapshot.faulted else 0)
    total = len(content)
    room = total if height is None else max(0, height - 1 - footer_count)
    bottom = max(0, total - room)
    first = bottom if top is None else min(max(0, top), bottom)
    shown = content[first : first + room]
    if first < bottom:
        where = f"rows {first + 1}-{first + len(shown)} of {total} · End: follow"
        status = f"{status} · {where}" if status else where
    footer = [Line(status, DIM)] if status or height is not None else []
    if snapshot.faulted:
        footer.insert(0, Line("the lane is faulted", ERROR))
    lines = [header, *shown, *footer]
    if height is not None:
        lines = lines[-height:] if height > 0 else []
    drawn = [_draw(line, width, color) for line in lines]
    return Frame(lines=drawn, top=first, room=room, total=total)


def _operation_lines(
    snapshot: snapshot_pb2.LaneSnapshot, clock: ToolClock, now: float, frame: int
) -> list[Line]:
    """The open operation and its tools, or the last operation's result."""
    if snapshot.HasField("operation"):
        op = snapshot.operation
        aborting = op.status == snapshot_pb2.OPERATION_STATUS_ABORTING
        started = op.started_time.seconds + op.started_time.nanos / 1e9
        age = f" · {max(0.0, now - started):.1f}s" if op.HasField("started_time") else ""
        return [
            Line(
                f"── {_KIND_NAMES.get(op.kind, 'operation')} {op.id} · "
                f"{'aborting' if aborting else 'open'}{age}",
                ERROR if aborting else BOLD,
            ),
            *(_streaming_lines(op.streaming_message) if op.HasField("streaming_message") else []),
            *(_retry_lines(op.retry, now) if op.HasField("retry") else []),
            *_tool_rows(op, clock, now, frame),
        ]
    if snapshot.HasField("last_result"):
        last = snapshot.last_result
        return [
            Line(
                f"── no open operation · last {_KIND_NAMES.get(last.kind, 'operation')} "
                f"{last.operation_id} {_STATUS_NAMES.get(last.status, 'ended')}"
                + (f": {last.error.message}" if last.HasField("error") else ""),
                ERROR if last.status == snapshot_pb2.OPERATION_RESULT_STATUS_FAILED else BOLD,
            )
        ]
    return [Line("── no operation yet", DIM)]


def _retry_lines(retry: snapshot_pb2.RetryState, now: float) -> list[Line]:
    """Why the model call failed, the attempt scheduled, and the time left until it."""
    cause = f": {retry.error_message.splitlines()[0]}" if retry.error_message else ""
    when = "scheduled"
    if retry.HasField("next_attempt_time"):
        at = retry.next_attempt_time.seconds + retry.next_attempt_time.nanos / 1e9
        when = f"in {at - now:.1f}s" if at > now else "due"
    text = f"  model call failed{cause} · attempt {retry.attempt} of {retry.max_attempts} {when}"
    return [Line(text, WAITING)]


_QUEUE_NAMES = {
    snapshot_pb2.QUEUE_KIND_STEER: "steer",
    snapshot_pb2.QUEUE_KIND_FOLLOW_UP: "follow-up",
    snapshot_pb2.QUEUE_KIND_NEXT_RUN: "next run",
    snapshot_pb2.QUEUE_KIND_WRITE: "entry",
}


def _queue_lines(snapshot: snapshot_pb2.LaneSnapshot) -> list[Line]:
    """The lane's inbox: each queued item (``lane send``), until a run takes it."""
    if not snapshot.queues:
        return []
    lines = [Line(f"── queued ({len(snapshot.queues)})", BOLD)]
    for item in snapshot.queues:
        kind = _QUEUE_NAMES.get(item.kind, "item")
        if item.WhichOneof("item") == "custom":
            body = [f"custom {item.custom.custom_type}"]
        else:
            message = item.message
            which = message.WhichOneof("message")
            blocks = getattr(message, which).content if which else []
            body = _lines_of(content_text(blocks)) or [""]
        lines.extend(_labelled(f"  {kind}: ", body, DIM))
    return lines


def _draw(line: Line, width: int, color: bool) -> str:
    text = line.text.replace("\t", "    ")
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    text = fit_width(text, width)
    if color and line.style and text:
        return f"{line.style}{text}{RESET}"
    return text


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes: wide (East Asian) characters take two,
    combining marks none."""
    return sum(_cell(ch) for ch in text)


def _cell(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def fit_width(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells, ending in ``…`` when cut."""
    if cells(text) <= width:
        return text
    kept: list[str] = []
    used = 0
    for ch in text:
        size = _cell(ch)
        if used + size > width - 1:
            break
        kept.append(ch)
        used += size
    return "".join(kept) + ("…" if width > 0 else "")
