"""The web view in a real browser: headless Chromium (Debian's ``chromium``), driven by Playwright
(``playwright-core``, through clients/typescript/web/e2e/browser.ts), against the real service
with auth on, while the test drives lanes over gRPC one command at a time and reads what the
page shows after each.

- a parallel batch live: the last call settled and "waiting for placement" while the first still
  runs (with its progress and elapsed time); every row leaves exactly when its own entry is
  placed, in every state the page drew (recorded in the page as it draws), errors in red;
- Abort from the page's button reaches the service (AbortOperation), and the run ends aborted;
- an assistant message streaming in (AppendAssistantStream): a failed attempt and its scheduled
  retry with the time left, then the retried attempt growing partial by partial — thinking
  dimmed, the text ending in a cursor, a tool call drawn as its arguments are written — and the
  settled message taking the partial's place in the very redraw that settles it;
- a service restart: the page says it is reconnecting, then resumes after its revision (no new
  snapshot) and shows what was committed after the restart;
- token entry, and a lane of another namespace: absent from the list; its page waits for a lane
  of that id in the token's own lanes (it cannot tell "not yet" from "not yours").

Screenshots of these moments are saved under the pytest base temp directory, in
``web-view-screenshots`` (or in ``$LANE_SCREENSHOTS_DIR``). Needs ``chromium`` (``./dev test``
installs it) and clients/typescript's node_modules (its scripts/test.sh); without either this
test fails, it never skips.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest
from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from tests.integration.lanes import assistant, new_lane_id, text, tool_call
from tests.integration.web_browser import (
    DIM,
    RECORD_STREAM_JS,
    RED,
    TOKEN_A,
    TOKEN_B,
    Browser,
    Rpc,
    RpcStub,
    Service,
    finish,
    new_run,
    open_run,
    progress,
    stage,
    start_call,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

# --- reading the page ---------------------------------------------------------------------------


def where(state: dict[str, Any], calls: list[str]) -> dict[str, str]:
    """Each call's place on the page: "running" or "settled" (a row), "placed" (a transcript
    result) or "planned" (neither). Fails when a call is in two places."""
    rows = {r["id"]: r["state"] for r in state["rows"]}
    placed = {r["id"] for r in state["results"]}
    both = sorted(set(rows) & placed)
    assert not both, f"rows still shown for placed calls {both} at revision {state['revision']}"
    return {c: "placed" if c in placed else rows.get(c, "planned") for c in calls}


def row(state: dict[str, Any], call: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in state["rows"] if r["id"] == call)
    return found


ORDER = ("planned", "running", "settled", "placed")


# --- the tests ----------------------------------------------------------------------------------


async def test_a_parallel_batch_live(web_service: Service, web_page: Browser) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-batch")
    batch = ["a0", "a1", "a2"]
    run = await open_run(rpc, lane_id, batch)
    await web_page.open_lane(web_service.origin, lane_id)

    for call in batch:
        revision = await start_call(run, call)
    revision = await progress(run, "a0", "a0 half way")
    state = await web_page.at_revision(revision)
    assert where(state, batch) == dict.fromkeys(batch, "running")
    assert state["operation"]["id"] == run.operation_id and state["abortEnabled"]
    assert "a0 half way" in row(state, "a0")["text"]  # the latest progress
    assert re.search(r"running \d+\.\ds", row(state, "a0")["text"])  # the elapsed time

    # The last call settles first: settled, waiting for placement, while a0 and a1 run.
    staged = await stage(run, "a2", "a2 done")
    assert list(staged.placed_tool_call_ids) == []
    state = await web_page.at_revision(staged.revision)
    assert where(state, batch) == {"a0": "running", "a1": "running", "a2": "settled"}
    assert "waiting for placement" in row(state, "a2")["text"]
    assert "a2 done" in row(state, "a2")["text"]
    await web_page.screenshot("batch-1-a2-waiting-while-a0-runs")

    # a0 is placed (its row leaves, its entry appears); a2 still waits behind a1.
    staged = await stage(run, "a0", "a0 done")
    assert list(staged.placed_tool_call_ids) == ["a0"]
    state = await web_page.at_revision(staged.revision)
    assert where(state, batch) == {"a0": "placed", "a1": "running", "a2": "settled"}
    await web_page.screenshot("batch-2-a0-placed-a2-still-waiting")

    # a1 fails: a1 and a2 are placed together, in source order; the error is red.
    staged = await stage(run, "a1", "a1 broke", error=True)
    assert list(staged.placed_tool_call_ids) == ["a1", "a2"]
    state = await web_page.at_revision(staged.revision)
    assert where(state, batch) == dict.fromkeys(batch, "placed")
    assert [r["id"] for r in state["results"]] == batch
    colors = {r["id"]: (r["error"], r["color"]) for r in state["results"]}
    assert colors["a1"] == (True, RED)
    assert colors["a0"][0] is False and colors["a0"][1] != RED

    revision = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    state = await web_page.at_revision(revision)
    assert state["operation"] is None and state["lastResult"] == "completed"
    await web_page.screenshot("batch-3-completed")

    # Every state the page drew: no call in two places, none lost once started, none going
    # back; so each row left exactly when its own entry was placed.
    drawn = await web_page.recorded()
    assert [s["revision"] for s in drawn] == sorted({s["revision"] for s in drawn})
    places = [where(s, batch) for s in drawn]
    for call in batch:
        ranks = [ORDER.index(p[call]) for p in places]
        assert ranks == sorted(ranks), f"{call} went back: {[p[call] for p in places]}"


async def test_abort_from_the_button(web_service: Service, web_page: Browser) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-abort")
    run = await open_run(rpc, lane_id, ["b0", "b1"])
    await start_call(run, "b0")
    revision = await progress(run, "b0", "b0 working")
    await web_page.open_lane(web_service.origin, lane_id)
    state = await web_page.at_revision(revision)
    assert (
        state["operation"] == {"id": run.operation_id, "status": "open"} and state["abortEnabled"]
    )

    await web_page.call("click", selector="button#abort")
    state = await web_page.state_when("s.operation && s.operation.status === 'aborting'")
    assert not state["abortEnabled"]
    # The page shows what the service committed: the operation is aborting there.
    snapshot = (await rpc("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id))).snapshot
    assert snapshot.operation.status == snapshot_pb2.OPERATION_STATUS_ABORTING
    assert snapshot.revision == state["revision"]
    await web_page.screenshot("abort-1-requested-from-the-button")

    # The tool sees the abort and stops; the never-started b1 gets its cancelled result.
    staged = await stage(run, "b0", "b0 stopped")
    assert staged.cancel_requested
    revision = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    state = await web_page.at_revision(revision)
    assert state["operation"] is None
    assert (state["lastResult"], state["lastResultColor"]) == ("aborted", RED)
    results = {r["id"]: r for r in state["results"]}
    assert "b0 stopped" in results["b0"]["text"]
    assert (results["b1"]["error"], results["b1"]["color"]) == (True, RED)
    await web_page.screenshot("abort-2-ended-aborted")


def thinking(value: str) -> messages_pb2.ContentBlock:
    return messages_pb2.ContentBlock(thinking=messages_pb2.ThinkingContent(thinking=value))


def partial(*blocks: messages_pb2.ContentBlock) -> pb.StreamedPartial:
    """One streamed partial: the message so far."""
    return pb.StreamedPartial(message=assistant(*blocks, stop=messages_pb2.STOP_REASON_PENDING))


async def test_an_assistant_message_streaming_in(web_service: Service, web_page: Browser) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-stream")
    run = await new_run(rpc, lane_id, "read it")
    turn = replace(run.aim, turn_id=await run.start_turn())
    await web_page.open_lane(web_service.origin, lane_id)
    await web_page.call("eval", expr=RECORD_STREAM_JS)

    async def stream(*blocks: messages_pb2.ContentBlock) -> dict[str, Any]:
        """Commit ``blocks`` as the latest partial; what the page drew for it."""
        appended = await rpc(
            "AppendAssistantStream",
            turn.request(pb.AppendAssistantStreamRequest, partials=[partial(*blocks)]),
        )
        return await web_page.stream_at(appended.revision)

    # A first attempt fails mid-stream: the failed message is placed (red), the partial is gone,
    # and the retry line names the attempt scheduled and the time left until it.
    state = await stream(text("Let me"))
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("text", "assistant Let me▍", True)
    ]
    failed = assistant(text("Let me"), stop=messages_pb2.STOP_REASON_ERROR)
    failed.error_message = "529 overloaded"
    scheduled = await rpc(
        "ScheduleRetry",
        turn.request(
            pb.ScheduleRetryRequest,
            failed_message=failed,
            max_attempts=3,
            delay_ms=60_000,
            error_message="529 overloaded",
        ),
    )
    state = await web_page.stream_at(scheduled.revision)
    assert state["streaming"] is None
    assert state["transcript"][-1] == {
        "kind": "error",
        "text": "assistant error: 529 overloaded",
        "color": RED,
        "fontStyle": "normal",
    }
    retry = state["retry"]
    at = scheduled.next_attempt_time
    assert (retry["attempt"], retry["maxAttempts"]) == (2, 3)
    # protobuf-es's timestampMs rounds the nanoseconds to the nearest millisecond.
    assert retry["nextAttemptMs"] == at.seconds * 1000 + (at.nanos + 500_000) // 1_000_000
    left = re.fullmatch(
        r"model call failed: 529 overloaded · attempt 2 of 3 in (\d+\.\d)s", retry["text"]
    )
    assert left is not None, retry["text"]
    assert 0 < float(left[1]) <= 60.0
    await web_page.screenshot("stream-1-retry-scheduled")
    started = await rpc("StartRetry", turn.request(pb.StartRetryRequest))
    state = await web_page.stream_at(started.revision)
    assert state["retry"] is None and state["streaming"] is None

    # The retried attempt streams: thinking first, dimmed and set apart from the text.
    state = await stream(thinking("The user wants"))
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("thinking", "thinking The user wants", False)
    ]
    assert (state["streaming"][0]["color"], state["streaming"][0]["fontStyle"]) == (DIM, "italic")
    first_revision = state["revision"]

    # The text grows, ending in the cursor while it is the last block.
    think = thinking("The user wants the README.")
    state = await stream(think, text("I will"))
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("thinking", "thinking The user wants the README.", False),
        ("text", "assistant I will▍", True),
    ]
    dimmed, plain = state["streaming"]
    assert (plain["color"], plain["fontStyle"]) != (DIM, "italic")
    assert (dimmed["color"], dimmed["fontStyle"]) == (DIM, "italic")

    # A tool call being written: its arguments so far, cut JSON as it is; the text is no longer
    # last, so it has no cursor.
    state = await stream(
        think, text("I will read it."), tool_call("r1", "read_file", '{"path": "REA')
    )
    assert [(b["kind"], b["text"], b["cursor"]) for b in state["streaming"]] == [
        ("thinking", "thinking The user wants the README.", False),
        ("text", "assistant I will read it.", False),
        ("call", '→ read_file {"path": "REA …', False),
    ]
    await web_page.screenshot("stream-2-thinking-text-and-a-call-being-written")

    # Settled: the partial is gone and the message is in the transcript, thinking still dimmed,
    # the call with its whole arguments.
    read = tool_call("r1", "read_file", {"path": "README.md"})
    settled = (
        await run.settle(turn.turn_id, message=assistant(think, text("I will read it."), read))
    ).settled
    state = await web_page.stream_at(settled.revision)
    assert state["streaming"] is None and state["retry"] is None
    message = [(e["kind"], e["text"]) for e in state["transcript"][-3:]]
    assert message == [
        ("thinking", "thinking The user wants the README."),
        ("assistant", "assistant I will read it."),
        ("call", '→ read_file {"path":"README.md"}'),
    ]
    assert (state["transcript"][-3]["color"], state["transcript"][-3]["fontStyle"]) == (
        DIM,
        "italic",
    )
    await web_page.screenshot("stream-3-settled")

    # Every state the page drew of the retried attempt: the partial only grew, and gave way to
    # the settled message in one redraw — never both on the page, never neither.
    recorded: list[dict[str, Any]] = await web_page.call("eval", expr="window.__streams")
    drawn = [s for s in recorded if s["revision"] >= first_revision]
    assert [s["revision"] for s in drawn] == sorted({s["revision"] for s in drawn})
    assert drawn[-1]["revision"] == settled.revision
    lengths = []
    for s in drawn:
        placed = ("assistant", "assistant I will read it.") in [
            (e["kind"], e["text"]) for e in s["transcript"]
        ]
        assert (s["streaming"] is None) == placed, s
        assert placed == (s["revision"] >= settled.revision), s
        if s["streaming"] is not None:
            lengths.append(sum(len(b["text"]) for b in s["streaming"]))
    assert lengths == sorted(lengths) and len(lengths) == 3

    await start_call(run, "r1")
    await stage(run, "r1", "# lane")
    revision = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    state = await web_page.at_revision(revision)
    assert state["lastResult"] == "completed"


async def test_queued_messages_show_until_a_run_takes_them(
    web_service: Service, web_page: Browser
) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    stub: Any = RpcStub(rpc)
    script = await LaneScript.create(stub, new_lane_id("web-queue"))
    await script.enqueue("Also list the files.", snapshot_pb2.QUEUE_KIND_STEER)
    queued = await script.enqueue("Then tidy up.", snapshot_pb2.QUEUE_KIND_NEXT_RUN)
    await web_page.open_lane(web_service.origin, script.lane_id)
    state = await web_page.at_revision(queued.revision)
    assert state["queued"] == ["queued steer Also list the files.", "queued next run Then tidy up."]
    await web_page.screenshot("queue-1-before-the-run")
    run = await script.start_run("go")
    state = await web_page.at_revision(run.started.revision)
    assert state["queued"] == []  # the run took them into its transcript


async def test_resume_after_a_service_restart(web_service: Service, web_page: Browser) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-restart")
    run = await open_run(rpc, lane_id, ["c0"])
    revision = await start_call(run, "c0")
    await web_page.open_lane(web_service.origin, lane_id)
    before = await web_page.at_revision(revision)
    assert where(before, ["c0"]) == {"c0": "running"} and before["snapshots"] == 1

    stopped = asyncio.create_task(web_service.restart())
    try:
        state = await web_page.state_when("s.connection === 'reconnecting'")
        assert re.match(r"reconnecting · attempt \d+ · ", state["connectionText"])
        # Still the lane as last seen, while the service is away.
        assert state["revision"] == before["revision"] and where(state, ["c0"])["c0"] == "running"
        await web_page.screenshot("restart-1-reconnecting")
    finally:
        await stopped

    # Committed after the restart, seen live: the page resumed after its revision (no second
    # snapshot) and shows the result placed.
    staged = await stage(run, "c0", "c0 done after the restart")
    state = await web_page.at_revision(staged.revision)
    assert where(state, ["c0"]) == {"c0": "placed"}
    assert state["snapshots"] == 1, "the page re-snapshotted instead of resuming"
    assert state["connectionText"] == "live"
    await web_page.screenshot("restart-2-resumed")
    await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)


async def test_token_entry_and_another_namespace(web_service: Service, web_page: Browser) -> None:
    ours, theirs = new_lane_id("web-team-a"), new_lane_id("web-team-b")
    await Rpc(web_service, TOKEN_A)("CreateLane", pb.CreateLaneRequest(lane_id=ours))
    await Rpc(web_service, TOKEN_B)("CreateLane", pb.CreateLaneRequest(lane_id=theirs))

    # Without a token, the service refuses and the page asks for one.
    await web_page.call("goto", url=f"{web_service.origin}/")
    await web_page.call("eval", expr="sessionStorage.clear()")
    await web_page.call("goto", url=f"{web_service.origin}/index.html#/")  # a new page load
    message = await web_page.wait(
        "document.body.dataset.page === 'token'"
        " && document.querySelector('#token-form').textContent"
    )
    assert "UNAUTHENTICATED TOKEN_MISSING" in message
    assert "This service asks for a token before it shows anything." in message
    assert "LANE_AUTH_TOKENS" in message  # where tokens come from
    await web_page.screenshot("token-1-asked")

    # A token the service does not know: said so, in words, with what to do.
    await web_page.call("fill", selector="#token", value="not-a-token-of-this-service")
    await web_page.call("click", selector="#token-form button[type=submit]")
    wrong = await web_page.wait(
        "(() => { const f = document.querySelector('#token-form');"
        " return f && f.querySelector('h1').textContent === 'That token is not accepted'"
        " && f.querySelector('#token-problem').textContent; })()"
    )
    assert wrong.startswith("The service does not accept this token. Check it for a typo")
    assert wrong.endswith("UNAUTHENTICATED TOKEN_UNKNOWN")
    await web_page.screenshot("token-2-not-accepted")

    await web_page.call("fill", selector="#token", value=TOKEN_A)
    await web_page.call("click", selector="#token-form button[type=submit]")
    lanes = await web_page.wait(
        f"""(() => {{
          const ids = [...document.querySelectorAll("tr.lane")].map((r) => r.dataset.laneId);
          return ids.includes("{ours}") ? ids : null;
        }})()"""
    )
    assert theirs not in lanes  # team-b's lane is not listed for team-a's token
    await web_page.screenshot("token-3-lanes-of-team-a")

    # Asked for by name, it does not exist for this token: the page waits for a lane of that
    # id to be created in team-a's lanes, as `lane watch` does, and says so.
    await web_page.call("goto", url=f"{web_service.origin}/#/lanes/{theirs}")
    waiting = await web_page.wait(
        "document.querySelector('#connection')?.dataset.state === 'waiting'"
        " && !document.querySelector('#waiting').hidden"
        " && document.querySelector('#waiting').textContent"
    )
    assert f"Lane {theirs} does not exist yet" in waiting
    assert "another token's lanes" in waiting
    status = await web_page.call("eval", expr="document.querySelector('#lane-status').textContent")
    assert status == "not created yet"
    await web_page.screenshot("token-4-other-namespace-waits")


async def test_a_malformed_lane_address_is_said_so(web_service: Service, web_page: Browser) -> None:
    lane_id = new_lane_id("web-address")
    await Rpc(web_service, TOKEN_A)("CreateLane", pb.CreateLaneRequest(lane_id=lane_id))
    await web_page.open_lane(web_service.origin, lane_id)  # live
    # An address whose escape is malformed: decoding it throws URIError. The page says the
    # address names no lane, and nothing of the lane's page stays up calling itself live.
    await web_page.call("eval", expr="location.hash = '#/lanes/%E0%A4%A'")
    message = await web_page.wait(
        "document.body.dataset.page === 'invalid'"
        " && document.querySelector('#bad-address').textContent"
    )
    assert message.startswith("not a valid lane address: #/lanes/%E0%A4%A")
    assert await web_page.call("eval", expr="document.querySelector('#connection')") is None
    assert await web_page.call("eval", expr="document.querySelector('#lane')") is None
    await web_page.screenshot("address-1-malformed")
    # Its link leads back to the lanes.
    await web_page.call("click", selector="#bad-address a")
    await web_page.wait("document.body.dataset.page === 'lanes'")
