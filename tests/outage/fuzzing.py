"""Random and mutated requests for every LaneService RPC, checked against the documented errors.

Shared by ``tests/outage/test_fuzz.py`` (CI: a few thousand requests) and
``python -m tests.outage.soak`` (as many as asked). See docs/contract.md. The parts:
:mod:`~tests.outage.fuzz_world` (lanes and ids), :mod:`~tests.outage.fuzz_values` (field values,
random messages), :mod:`~tests.outage.fuzz_templates` (plausible requests),
:mod:`~tests.outage.fuzz_encoding` (raw wire tricks); this module draws cases, sends them and
checks the answers and the lanes.

**The world.** :func:`populate` builds lanes in every state a command can meet (created,
queued inbox, idle run, leased run, open turn, streaming partial, scheduled retry, suspended,
may finish, a tool batch with calls planned / effect_pending / outcome_ready / completed,
aborting, ended, open compaction, faulted, navigated) and records their ids: operations, turns,
tool calls, entries, lease tokens, drivers. Every OK answer adds the ids it names, so later
requests reach the states earlier ones created; new lanes in random states join as the run goes.

**The generator** (:func:`draw_case`, driven by hypothesis in :func:`drive`) draws, per request,
an RPC and a lane (often one whose state suits the RPC, see SUITABLE_STATES), then one of:

* ``template``: a plausible request for the lane (its ids, valid JSON), often with a few fields
  overwritten by random values of their type (unknown ids, other lanes' ids, int64 extremes,
  unknown enum numbers, NUL and control characters, empty and huge strings, invalid or
  exotic JSON, out-of-range timestamps, ...): out-of-order commands on real lanes;
* ``generic``: every field drawn from the request's descriptor, recursively;
* ``bad_utf8``: a template with raw invalid UTF-8 in one of its string fields (for ``*_json``
  fields inside the JSON text): the bytes no longer decode (MALFORMED_REQUEST);
* ``wrong_wire_type``: a field of the request sent with another wire type;
* ``unknown_field``: an unknown field number appended (must be ignored);
* ``mutated_bytes``: bit flips, truncations, insertions, deletions, overwrites;
* ``random_bytes``: bytes from nowhere;
* ``size_limit``: padded to exactly the 4 MiB receive limit (accepted by gRPC) or one byte over
  (RESOURCE_EXHAUSTED from gRPC itself, before the service sees it).

ImportLane's cases are export files (:mod:`~tests.outage.fuzz_transfer`): the files the run's
ExportLane calls received, as they are (they must import), edited as JSON, as lines or as bytes,
or generated from random messages, sent in pieces. ExportLane calls are read to their end.
DeleteLane mostly deletes lanes imports created, so the world's lanes stay for the checks.

**The checks** (:class:`Fuzzer`): every answer is OK or one of the documented codes, and a
refusal carries one ErrorInfo of domain ``lane.v1`` whose reason docs/errors.md lists under that
code — the one exception being gRPC's own RESOURCE_EXHAUSTED for a message over the limit.
Undecodable bytes must be INVALID_ARGUMENT ``MALFORMED_REQUEST``; an OK answer must decode.
An import refused leaves no lane behind; a lane an import created, or DeleteLane deleted,
starts its checks afresh.
After every batch, each lane a request named is captured again (GetLaneSnapshot must not
fault), its new events are read (WatchLane ``after_revision``) and folded into its previous
capture: the fold must equal the capture (unless the events ask for a rebase: navigation), a
capture at an unchanged revision must be unchanged, and no stored ``*_json`` text may be
invalid JSON.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from lane.client.reducer import fold
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from tests.outage.fuzz_encoding import (
    mutated,
    padded_to,
    with_bad_utf8,
    with_unknown_field,
    with_wrong_wire_type,
)
from tests.outage.fuzz_templates import template
from tests.outage.fuzz_transfer import import_case
from tests.outage.fuzz_values import (
    MAX_MESSAGE,
    METHODS,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    SERVICE,
    Ctx,
    Draw,
    any_index,
    choose,
    fill,
    one_in,
    overwrite,
)
from tests.outage.fuzz_world import LANE_STATES, LaneRef, Stub, World, build_lane, populate
from tests.support.lanes import events_between

__all__ = [
    "METHODS",
    "Fuzzer",
    "Stats",
    "World",
    "documented_reasons",
    "drive",
    "fuzz",
    "populate",
]

Code = grpc.StatusCode
REPO_ROOT = Path(__file__).resolve().parents[2]
ERROR_DOMAIN = "lane.v1"
#: Codes a request may be answered with (docs/errors.md). UNAVAILABLE is
#: documented too, but only for an unreachable database or a stopping server: not here.
ALLOWED_CODES = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.ALREADY_EXISTS,
        Code.FAILED_PRECONDITION,
        Code.ABORTED,
        Code.OUT_OF_RANGE,
        Code.RESOURCE_EXHAUSTED,
    }
)
UNARY_DEADLINE = 30.0
#: The server streams a client follows, and their messages.
WATCHES: dict[str, type[Message]] = {
    "WatchLane": pb.WatchLaneResponse,
    "WatchLanes": pb.WatchLanesResponse,
}
#: A WatchLane call is answered when its first message or its error arrives; a resume at the
#: head sends nothing until the next heartbeat, so silence this long counts as "streaming".
WATCH_FIRST_MESSAGE_SECONDS = 0.3
MAX_ID_BYTES = 128
#: Export files kept for import cases (the newest), and the largest kept.
MAX_KEPT_EXPORTS, MAX_KEPT_EXPORT_BYTES = 16, 256 << 10


def documented_reasons(path: Path = REPO_ROOT / "docs" / "errors.md") -> dict[str, frozenset[str]]:
    """The ErrorInfo reasons docs/errors.md lists, by gRPC code name."""
    table: dict[str, set[str]] = {}
    code = ""
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] == "code" or (set(cells[0]) <= set("-: ") and cells[0]):
            continue
        code = cells[0] or code
        table.setdefault(code, set()).update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1]))
    return {name: frozenset(reasons) for name, reasons in table.items()}


def valid_id(value: str) -> bool:
    """Whether ``value`` passes the service's identifier rule (docs/errors.md INVALID_ID)."""
    return (
        bool(value)
        and len(value.encode()) <= MAX_ID_BYTES
        and value.isprintable()
        and value.strip() == value
    )


# -- cases ------------------------------------------------------------------------------------


@dataclass
class Case:
    """One request to send: its RPC, how it was made, and its bytes (ImportLane: its first
    message's, all of them in ``messages``)."""

    method: str
    mode: str
    body: bytes
    messages: list[bytes] = field(default_factory=list)
    #: ImportLane: the lane id was minted for this call (no lane has it before).
    fresh_lane: bool = False


MODES = (
    "template",
    "template",
    "template",
    "template",
    "template",
    "template",
    "generic",
    "generic",
    "generic",
    "bad_utf8",
    "bad_utf8",
    "wrong_wire_type",
    "unknown_field",
    "mutated_bytes",
    "mutated_bytes",
    "random_bytes",
)


_ANY_RUN = ("idle", "leased_idle", "turn_open", "may_finish", "planned", "effect_pending")
#: The built states in which a command has something to act on (it may still be refused: the
#: lanes move on). Requests often go to such lanes, so that accepted commands reach every state.
SUITABLE_STATES: dict[str, tuple[str, ...]] = {
    "StartRun": ("lane", "queued", "ended", "faulted", "navigated"),
    "AbortOperation": (*_ANY_RUN, "streaming", "suspended", "compaction"),
    "EndRun": ("may_finish", "aborting", "aborting_tools", "idle", "leased_tools"),
    "StartTurn": ("idle", "leased_idle", "may_finish"),
    "SettleAssistantMessage": ("turn_open", "streaming", "retry_scheduled"),
    "StartToolCall": ("planned", "completed_call", "leased_tools"),
    "UpdateToolCall": ("effect_pending", "outcome_ready_blocked", "aborting_tools", "leased_tools"),
    "StageToolOutcome": (
        "planned",
        "effect_pending",
        "outcome_ready_blocked",
        "completed_call",
        "aborting_tools",
        "leased_tools",
    ),
    "AcquireOperation": ("leased_idle", "leased_tools", "idle", "planned"),
    "RenewLease": ("leased_idle", "leased_tools"),
    "ReleaseLease": ("leased_idle", "leased_tools"),
    "ReplayToolCall": ("leased_tools", "effect_pending"),
    "GetOperation": (*_ANY_RUN, "leased_tools", "suspended", "retry_scheduled"),
    "AppendAssistantStream": ("turn_open", "streaming"),
    "ScheduleRetry": ("turn_open", "streaming", "retry_scheduled"),
    "StartRetry": ("retry_scheduled",),
    "SuspendRun": ("turn_open", "streaming"),
    "ResumeRun": ("suspended",),
    "StartCompaction": ("lane", "ended", "faulted", "queued", "navigated"),
    "EndCompaction": ("compaction",),
    "CompactRun": ("idle", "may_finish", "leased_idle"),
    "NavigateLane": ("ended", "navigated", "faulted", "compaction"),
    "ExportLane": ("lane", "queued", "ended", "faulted", "navigated"),
}


def draw_case(draw: Draw, world: World) -> Case:
    """One request for a random RPC (see the module docstring)."""
    # Spread over the RPCs; the rotation moves hypothesis's favourite (index 0) off CreateLane.
    # (A multiplier here would have to stay coprime with the number of RPCs: with 37 of them,
    # "* 37" sent every request to one RPC.)
    method = METHODS[(any_index(draw, 1024) + 11) % len(METHODS)]
    # Most requests go to lanes where something is going on: a lane with an open operation, or
    # one of the lanes built most recently in a chosen state; the rest to any lane.
    pool = draw(st.integers(0, 9))
    states = SUITABLE_STATES.get(method, ())
    suitable = [ref for ref in world.built[-120:] if ref.state in states]
    recent = world.built[-30:] or world.lanes
    if pool < 4 and suitable:
        candidates = suitable
    elif pool < 6 and world.active:
        candidates = world.active
    elif pool < 8:
        candidates = recent
    else:
        candidates = world.lanes
    lane = choose(draw, candidates)
    ctx = Ctx(world, lane)
    if method == "ImportLane":
        call = import_case(draw, ctx)
        messages = call.messages
        return Case(method, call.mode, messages[0] if messages else b"", messages, call.fresh)
    if one_in(draw, 250):
        over = draw(st.booleans())
        base = template(draw, ctx, method).SerializeToString()
        return Case(method, "size_limit", padded_to(base, MAX_MESSAGE + (1 if over else 0)))
    mode = choose(draw, MODES)
    if mode == "generic":
        message = REQUEST_TYPES[method]()
        fill(draw, ctx, message, 0)
        return Case(method, mode, message.SerializeToString())
    message = template(draw, ctx, method)
    if mode == "template":
        for _ in range(draw(st.sampled_from((0, 0, 1, 1, 2)))):
            overwrite(draw, ctx, method, message)
        return Case(method, mode, message.SerializeToString())
    if mode == "bad_utf8":
        return Case(method, mode, with_bad_utf8(draw, message))
    if mode == "wrong_wire_type":
        return Case(method, mode, with_wrong_wire_type(draw, message))
    if mode == "unknown_field":
        return Case(method, mode, with_unknown_field(draw, message))
    if mode == "mutated_bytes":
        return Case(method, mode, mutated(draw, message.SerializeToString()))
    return Case(method, mode, draw(st.binary(max_size=64)))


# -- sending and checking ---------------------------------------------------------------------


@dataclass
class Answer:
    code: grpc.StatusCode
    reason: str = ""
    domain: str = ""
    has_info: bool = False
    details: str = ""
    body: bytes | None = None
    #: An ExportLane's file.
    file: bytes | None = None


@dataclass
class Stats:
    sent: int = 0
    by_code: Counter[str] = field(default_factory=Counter)
    by_method: dict[str, Counter[str]] = field(default_factory=dict)
    by_mode: dict[str, Counter[str]] = field(default_factory=dict)
    by_reason: Counter[str] = field(default_factory=Counter)
    by_method_reason: dict[str, Counter[str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    lanes_checked: int = 0
    lane_checks: int = 0
    rebases: int = 0
    seconds: float = 0.0
    generate_seconds: float = 0.0
    send_seconds: float = 0.0
    check_seconds: float = 0.0

    def record(self, case: Case, answer: Answer) -> None:
        self.sent += 1
        self.by_code[answer.code.name] += 1
        self.by_method.setdefault(case.method, Counter())[answer.code.name] += 1
        self.by_mode.setdefault(case.mode, Counter())[answer.code.name] += 1
        if answer.reason:
            self.by_reason[f"{answer.code.name} {answer.reason}"] += 1
            self.by_method_reason.setdefault(case.method, Counter())[answer.reason] += 1

    def report(self) -> str:
        lines = [
            f"{self.sent} requests in {self.seconds:.1f}s "
            f"({self.sent / max(self.seconds, 1e-9):.0f}/s); "
            f"{self.lane_checks} lane checks of {self.lanes_checked} lanes "
            f"({self.rebases} rebases); time: generating {self.generate_seconds:.1f}s, "
            f"sending {self.send_seconds:.1f}s, checking lanes {self.check_seconds:.1f}s",
            "by code: " + ", ".join(f"{k} {v}" for k, v in self.by_code.most_common()),
            "by mode:",
        ]
        for mode, counts in sorted(self.by_mode.items()):
            lines.append(f"  {mode:16} " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
        lines.append("by RPC:")
        for method in METHODS:
            counts = self.by_method.get(method, Counter())
            reasons = self.by_method_reason.get(method, Counter())
            lines.append(
                f"  {method:24} {sum(counts.values()):6}  "
                + ", ".join(f"{k} {v}" for k, v in counts.most_common())
                + "  | "
                + ", ".join(f"{k} {v}" for k, v in reasons.most_common(4))
            )
        lines.append("by reason: " + ", ".join(f"{k} {v}" for k, v in self.by_reason.most_common()))
        lines.append(f"violations: {len(self.violations)}")
        for count, example in _grouped(self.violations):
            lines.append(f"  {count:6} x {example}")
        return "\n".join(lines)


def _grouped(violations: Sequence[str]) -> list[tuple[int, str]]:
    """Violations grouped by kind (ids, numbers and request bytes ignored): (count, first)."""
    groups: dict[str, list[str]] = {}
    for violation in violations:
        key = re.sub(r"; request .*$", "", violation, flags=re.DOTALL)
        key = re.sub(r"'[^']*'|\d+", "#", key)
        groups.setdefault(key, []).append(violation)
    ranked = sorted(groups.values(), key=len, reverse=True)
    return [(len(items), items[0][:1500]) for items in ranked]


def _answer_of(error: grpc.aio.AioRpcError) -> Answer:
    answer = Answer(error.code(), details=error.details() or "")
    try:
        status = rpc_status.from_call(error)
    except ValueError as exc:
        answer.details += f" (inconsistent rich status: {exc})"
        return answer
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                answer.has_info = True
                answer.reason = info.reason
                answer.domain = info.domain
                break
    return answer


def _decodes(method: str, body: bytes) -> Message | None:
    try:
        return REQUEST_TYPES[method].FromString(body)
    except DecodeError:
        return None


def _brief(body: bytes) -> str:
    if len(body) > 160:
        return f"{body[:120]!r}... ({len(body)} bytes)"
    return repr(body)


class Fuzzer:
    """Sends cases, checks every answer, and checks every lane the requests named."""

    def __init__(self, channel: grpc.aio.Channel, stub: Stub, world: World) -> None:
        self.channel = channel
        self.stub = stub
        self.world = world
        self.stats = Stats()
        self.documented = documented_reasons()
        #: Last checked capture of each lane (None: it did not exist then).
        self.captures: dict[str, snapshot_pb2.LaneSnapshot | None] = {}
        self._checked: set[str] = set()
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {
            m: channel.unary_unary(
                f"/{SERVICE.full_name}/{m}", request_serializer=None, response_deserializer=None
            )
            for m in METHODS
            if m not in (*WATCHES, "ExportLane", "ImportLane")
        }
        self._watches: dict[str, grpc.aio.UnaryStreamMultiCallable[bytes, bytes]] = {
            m: channel.unary_stream(
                f"/{SERVICE.full_name}/{m}", request_serializer=None, response_deserializer=None
            )
            for m in WATCHES
        }
        self._export: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
            f"/{SERVICE.full_name}/ExportLane", request_serializer=None, response_deserializer=None
        )
        self._import: grpc.aio.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(
            f"/{SERVICE.full_name}/ImportLane", request_serializer=None, response_deserializer=None
        )
        #: Lanes that refused imports were to create: none may exist after its batch.
        #: (lane id, how the import was made and refused).
        self._refused_imports: list[tuple[str, str]] = []

    async def baseline(self) -> None:
        """Capture every lane of the world before fuzzing."""
        await asyncio.gather(*(self._check_lane(ref.lane_id) for ref in self.world.lanes))

    async def send_batch(self, cases: Sequence[Case]) -> None:
        started = time.monotonic()
        answers = await asyncio.gather(*(self._send(case) for case in cases))
        self.stats.send_seconds += time.monotonic() - started
        touched: set[str] = set()
        for case, answer in zip(cases, answers, strict=True):
            self.stats.record(case, answer)
            request = self._check(case, answer)
            if request is not None:
                lane_id = getattr(request, "lane_id", "")
                if valid_id(lane_id):
                    touched.add(lane_id)
                if answer.code == Code.OK:
                    self._learn(case.method, request, answer)
        started = time.monotonic()
        await asyncio.gather(*(self._check_lane(lane) for lane in sorted(touched)))
        await self._check_refused_imports()
        self.stats.check_seconds += time.monotonic() - started

    async def _send(self, case: Case) -> Answer:
        try:
            if case.method in WATCHES:
                # Undecodable or oversized: the stream must end with an error; wait for it.
                doomed = len(case.body) > MAX_MESSAGE or _decodes(case.method, case.body) is None
                return await self._send_watch(case.method, case.body, doomed)
            if case.method == "ExportLane":
                return await self._send_export(case.body)
            if case.method == "ImportLane":
                body = await self._import(iter(case.messages), timeout=UNARY_DEADLINE)
                return Answer(Code.OK, body=body)
            body = await self._unary[case.method](case.body, timeout=UNARY_DEADLINE)
            return Answer(Code.OK, body=body)
        except grpc.aio.AioRpcError as error:
            return _answer_of(error)

    async def _send_export(self, body: bytes) -> Answer:
        """The whole file of an ExportLane call, every piece checked to decode."""
        file = bytearray()
        async for data in self._export(body, timeout=UNARY_DEADLINE):
            file += pb.ExportLaneResponse.FromString(data).data
        return Answer(Code.OK, file=bytes(file))

    async def _send_watch(self, method: str, body: bytes, doomed: bool) -> Answer:
        """The first message or the error of a WatchLane or WatchLanes call. A stream that
        stays silent (a resume at the head) counts as OK, unless the request is ``doomed`` (it
        must end with an error): that one is waited for."""
        call = self._watches[method](body, timeout=UNARY_DEADLINE)
        wait = UNARY_DEADLINE if doomed else WATCH_FIRST_MESSAGE_SECONDS
        try:
            first = await asyncio.wait_for(call.read(), wait)
        except TimeoutError:
            return Answer(Code.OK)  # streaming: nothing to say yet
        finally:
            call.cancel()
        if not isinstance(first, bytes):  # grpc.aio.EOF: ended without a message
            code = await call.code()
            return Answer(code, details="the stream ended")
        return Answer(Code.OK, body=first)

    def _violation(self, case: Case, what: str) -> None:
        self.stats.violations.append(
            f"{case.method} [{case.mode}] {what}; request {_brief(case.body)}"
        )

    def _check(self, case: Case, answer: Answer) -> Message | None:
        """Check one answer; return the decoded request (None when it does not decode)."""
        request = _decodes(case.method, case.body)
        code = answer.code
        label = f"{code.name} {answer.reason}".strip()
        oversize = len(case.body) > MAX_MESSAGE
        if code not in ALLOWED_CODES:
            self._violation(case, f"answered {label}: {answer.details[:300]}")
            return request
        if oversize:
            if code != Code.RESOURCE_EXHAUSTED:
                self._violation(case, f"{len(case.body)} bytes, over the limit, answered {label}")
            return None
        if code != Code.OK:
            if not answer.has_info:
                self._violation(
                    case, f"answered {code.name} without an ErrorInfo: {answer.details[:300]}"
                )
            elif answer.domain != ERROR_DOMAIN:
                self._violation(case, f"answered {label} with ErrorInfo domain {answer.domain!r}")
            elif answer.reason not in self.documented.get(code.name, ()):
                self._violation(
                    case,
                    f"answered {label}: reason not documented for {code.name} in docs/errors.md",
                )
        if request is None:
            if (code, answer.reason) != (Code.INVALID_ARGUMENT, "MALFORMED_REQUEST"):
                self._violation(case, f"undecodable bytes answered {label}, not MALFORMED_REQUEST")
            return None
        if case.method == "ImportLane":
            self._check_import(case, answer, request)
        elif answer.reason == "MALFORMED_REQUEST":
            self._violation(case, "bytes that decode as the request answered MALFORMED_REQUEST")
        if code == Code.OK and answer.body is not None:
            response_type = WATCHES.get(case.method) or RESPONSE_TYPES[case.method]
            try:
                response_type.FromString(answer.body)
            except DecodeError as exc:
                self._violation(case, f"OK answer does not decode: {exc}")
        return request

    def _check_import(self, case: Case, answer: Answer, request: Any) -> None:
        """An import's answer: a file exported as it is imports under a new id; a message
        that does not decode is refused; a refusal leaves no new lane (checked after the
        batch, :meth:`_check_refused_imports`)."""
        decoded = all(_decodes(case.method, message) is not None for message in case.messages)
        lane_id: str = request.lane_id
        # Not the id's look: a lane an earlier import created has a minted id too.
        fresh = case.fresh_lane
        if decoded and answer.reason == "MALFORMED_REQUEST":
            self._violation(case, "messages that decode answered MALFORMED_REQUEST")
        if not decoded and answer.code == Code.OK:
            self._violation(case, "a message that does not decode was accepted")
        if case.mode == "exported" and fresh and answer.code != Code.OK:
            self._violation(
                case, f"an exported file was refused: {answer.reason} {answer.details[:300]}"
            )
        if answer.code != Code.OK and fresh:
            refusal = f"{case.mode}: {answer.code.name} {answer.reason}"
            self._refused_imports.append((lane_id, refusal))

    async def _check_refused_imports(self) -> None:
        """The lanes refused imports were to create do not exist."""
        refused, self._refused_imports = self._refused_imports, []
        for lane_id, refusal in refused:
            try:
                await self.stub.GetLaneSnapshot(
                    pb.GetLaneSnapshotRequest(lane_id=lane_id), timeout=UNARY_DEADLINE
                )
            except grpc.aio.AioRpcError as error:
                if error.code() == Code.NOT_FOUND:
                    continue
                raise
            self.stats.violations.append(
                f"a refused import ({refusal}) left lane {lane_id!r} behind"
            )

    def _learn_transfer(self, method: str, lane_id: str, answer: Answer) -> None:
        """Remember an export's file, a lane an import created, a lane deleted."""
        world = self.world
        if method == "ExportLane" and answer.file is not None:
            if len(answer.file) <= MAX_KEPT_EXPORT_BYTES:
                world.exports.append(answer.file)
                del world.exports[:-MAX_KEPT_EXPORTS]
        elif method == "ImportLane" and valid_id(lane_id):
            world.add(LaneRef(lane_id, "imported"))
            world.imported.append(lane_id)
            del world.imported[:-40]
        elif method == "DeleteLane":
            # Gone: its next capture is a baseline (a lane created again under the id is new).
            self.captures[lane_id] = None
            if lane_id in world.imported:
                world.imported.remove(lane_id)
            ref = world.by_id.get(lane_id)
            if ref is not None:
                ref.state = "deleted"
                ref.open_operation = ""
                world.set_active(ref, False)

    def _learn(self, method: str, request: Any, answer: Answer) -> None:
        """Remember the ids an accepted request and its answer name."""
        lane_id = getattr(request, "lane_id", "")
        if method in ("ExportLane", "ImportLane", "DeleteLane"):
            self._learn_transfer(method, lane_id, answer)
            return
        if method == "ListLanes" and answer.body is not None:
            token = pb.ListLanesResponse.FromString(answer.body).next_page_token
            if token and token not in self.world.page_tokens:
                self.world.page_tokens.append(token)
                del self.world.page_tokens[:-20]
            return
        if not valid_id(lane_id) or answer.body is None:
            return
        ref = self.world.by_id.get(lane_id) or self.world.add(LaneRef(lane_id, "fuzzed"))
        response: Any = (
            RESPONSE_TYPES[method].FromString(answer.body) if method not in WATCHES else None
        )
        for name in ("operation_id", "driver_id"):
            value = getattr(request, name, "")
            if value and valid_id(value):
                pool = ref.operation_ids if name == "operation_id" else ref.driver_ids
                ref.learn(pool, value)
        if response is None:
            return
        for name, pool in (
            ("operation_id", ref.operation_ids),
            ("turn_id", ref.turn_ids),
            ("entry_id", ref.entry_ids),
        ):
            value = getattr(response, name, "")
            if value:
                ref.learn(pool, value)
        if response.DESCRIPTOR.fields_by_name.get("lease") is not None and response.HasField(
            "lease"
        ):
            ref.learn(ref.lease_tokens, response.lease.token)
        for planned in getattr(response, "tool_calls", ()):
            ref.learn(ref.call_ids, planned.tool_call_id)
            ref.learn(ref.entry_ids, planned.result_entry_id)
        if method == "GetOperation" or method == "AcquireOperation":
            state = response.state
            ref.learn(ref.turn_ids, state.turn_id)
            for call in state.tool_calls:
                ref.learn(ref.call_ids, call.tool_call_id)

    async def _check_lane(self, lane_id: str) -> None:
        """Capture ``lane_id``; fold its new events into the previous capture; compare."""
        self.stats.lane_checks += 1
        try:
            response = await self.stub.GetLaneSnapshot(
                pb.GetLaneSnapshotRequest(lane_id=lane_id), timeout=UNARY_DEADLINE
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == Code.NOT_FOUND and self.captures.get(lane_id) is None:
                self.captures[lane_id] = None  # no such lane (yet)
                return
            self.stats.violations.append(
                f"capture of lane {lane_id!r} faults: {error.code().name} "
                f"{_answer_of(error).reason} {(error.details() or '')[:300]}"
            )
            return
        fresh: snapshot_pb2.LaneSnapshot = response.snapshot
        if self.captures.get(lane_id) is None:
            # The first capture is the baseline: lane_created leaves the reducer's snapshot
            # unchanged, so a lane's fold starts from a capture, never from nothing.
            self.captures[lane_id] = fresh
            self._note_capture(lane_id, fresh)
            return
        self.stats.lanes_checked += 0 if lane_id in self._checked else 1
        self._checked.add(lane_id)
        before = self.captures[lane_id]
        assert before is not None
        self.captures[lane_id] = fresh
        self._note_capture(lane_id, fresh)
        if fresh.revision == before.revision:
            if fresh != before:
                self.stats.violations.append(
                    f"lane {lane_id!r}: the capture changed at unchanged revision {fresh.revision}"
                )
            return
        if fresh.revision < before.revision:
            self.stats.violations.append(
                f"lane {lane_id!r}: revision went back from {before.revision} to {fresh.revision}"
            )
            return
        try:
            events = await asyncio.wait_for(
                events_between(self.stub, lane_id, before.revision, fresh.revision), 30
            )
        # AssertionError: the resume sent something other than events and heartbeats.
        except (grpc.aio.AioRpcError, TimeoutError, DecodeError, AssertionError) as error:
            self.stats.violations.append(
                f"lane {lane_id!r}: events {before.revision + 1}..{fresh.revision} "
                f"unreadable: {error!r}"[:600]
            )
            return
        revisions = [event.revision for event in events]
        if revisions != list(range(before.revision + 1, fresh.revision + 1)):
            self.stats.violations.append(
                f"lane {lane_id!r}: events after {before.revision} up to {fresh.revision} have "
                f"revisions {revisions[:20]}"
            )
            return
        reduction = fold(before, events)
        if reduction.rebase:
            self.stats.rebases += 1  # navigation: the fold is a best effort by contract
        elif reduction.snapshot != fresh:
            kinds = [event.WhichOneof("kind") for event in events][:30]
            self.stats.violations.append(
                f"lane {lane_id!r}: fold(capture@{before.revision}, events) != "
                f"capture@{fresh.revision} (event kinds {kinds})"
            )

    def _note_capture(self, lane_id: str, snapshot: snapshot_pb2.LaneSnapshot) -> None:
        ref = self.world.by_id.get(lane_id)
        if ref is not None:
            ref.revision = snapshot.revision
            ref.open_operation = snapshot.operation.id if snapshot.HasField("operation") else ""
            if ref.open_operation:
                ref.learn(ref.operation_ids, ref.open_operation)
            self.world.set_active(ref, bool(ref.open_operation))
            for entry in snapshot.transcript[-5:]:
                ref.learn(ref.entry_ids, entry.id)
        for problem in invalid_stored_values(snapshot):
            self.stats.violations.append(f"lane {lane_id!r} stores an invalid value: {problem}")

    async def check_all(self) -> None:
        """Check every lane the run touched or built, once more."""
        await asyncio.gather(*(self._check_lane(lane) for lane in sorted(self.captures)))


def invalid_stored_values(message: Message, path: str = "") -> list[str]:
    """Unknown enum numbers and invalid ``*_json`` texts anywhere in ``message`` (tool-call
    arguments excepted: a response cut for length, or a streaming partial, may cut them)."""
    problems: list[str] = []
    for fd, value in message.ListFields():
        where = f"{path}.{fd.name}" if path else fd.name
        for item in value if fd.is_repeated else [value]:
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                problems.extend(invalid_stored_values(item, where))
            elif fd.type == FieldDescriptor.TYPE_ENUM:
                enum: Any = fd.enum_type
                if enum.values_by_number.get(item) is None:
                    problems.append(f"{where} = {item} (unknown enum value)")
            elif fd.name.endswith("_json") and fd.name != "arguments_json":
                try:
                    json.loads(item, parse_constant=_refuse_constant)
                except (ValueError, RecursionError):
                    problems.append(f"{where} = {item[:80]!r} (not JSON)")
    return problems


def _refuse_constant(name: str) -> object:
    raise ValueError(name)


# -- driving hypothesis -----------------------------------------------------------------------


async def fuzz(
    channel: grpc.aio.Channel,
    stub: Stub,
    *,
    requests: int,
    batch_size: int,
    seed_value: int,
    on_batch: Callable[[Stats], None] | None = None,
) -> Stats:
    """A whole run against the server behind ``channel``: the world's lanes built
    (:func:`populate`) and captured, ``requests`` requests sent (:func:`drive`, from a thread of
    its own), then every lane checked once more."""
    world = World()
    await populate(stub, world)
    fuzzer = Fuzzer(channel, stub, world)
    await fuzzer.baseline()
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(
        drive,
        fuzzer,
        loop,
        requests=requests,
        batch_size=batch_size,
        seed_value=seed_value,
        on_batch=on_batch,
    )
    await fuzzer.check_all()
    return fuzzer.stats


def drive(
    fuzzer: Fuzzer,
    loop: asyncio.AbstractEventLoop,
    *,
    requests: int,
    batch_size: int,
    seed_value: int,
    new_lanes_per_batch: int = 2,
    on_batch: Callable[[Stats], None] | None = None,
) -> None:
    """Generate and send batches until ``requests`` were sent. Runs hypothesis in the calling
    (non-event-loop) thread; the batches run on ``loop``."""
    started = time.monotonic()
    world = fuzzer.world
    round_index = 0

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    while fuzzer.stats.sent < requests:
        remaining_batches = -(-(requests - fuzzer.stats.sent) // batch_size)

        @settings(
            database=None,
            max_examples=remaining_batches,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        )
        @seed(seed_value + round_index)
        @given(st.data())
        def example(data: st.DataObject) -> None:
            if fuzzer.stats.sent >= requests:
                return
            states = [
                data.draw(st.sampled_from(LANE_STATES), label="new lane state")
                for _ in range(new_lanes_per_batch)
            ]
            for state in states:
                ref = run(build_lane(fuzzer.stub, world, state))
                run(fuzzer._check_lane(ref.lane_id))
            size = min(batch_size, requests - fuzzer.stats.sent)
            generating = time.monotonic()
            cases = [data.draw(_case_strategy(world)) for _ in range(size)]
            fuzzer.stats.generate_seconds += time.monotonic() - generating
            run(fuzzer.send_batch(cases))
            fuzzer.stats.seconds = time.monotonic() - started
            if on_batch is not None:
                on_batch(fuzzer.stats)

        example()
        round_index += 1
    fuzzer.stats.seconds = time.monotonic() - started


@st.composite
def _case_strategy(draw: Draw, world: World) -> Case:
    return draw_case(draw, world)
