"""The web console in a real browser (headless Chromium driven by Playwright, the service with
auth on; the toolkit and the one shared service and browser are in web_browser.py):

- the lane list: status, last result, tokens and running tools per row; filters by id prefix,
  status and last result; pages of 50 turned from the keyboard; a row changing live as its lane
  starts a run; keyboard-only navigation from the filter to a lane's page and its tabs;
- the failed lane, from the browser alone: its failed tool call in red, its 20 KB output cut,
  then whole in place; the timeline and the usage chart; the lane as it was before the failure
  (the history), equal to the service's snapshot at that revision; a message for the next run;
- act: send a steer, abort, export and delete refused while the run is open (said in words),
  then export (a download), delete after a confirmation naming the lane (the page then waits
  for the id), import of the download, and importing it again refused in words;
- the waiting page for a lane created afterwards;
- 390 px wide: nothing scrolls sideways on the list, a lane page with a long result expanded,
  its timeline and history; and dark mode following the system setting.

Screenshots of each state go where web_browser.py says (the test output directory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from lane.client.testing import LaneScript
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from tests.integration.lanes import new_lane_id
from tests.integration.web_browser import (
    RED,
    TOKEN_A,
    Browser,
    Rpc,
    RpcStub,
    Service,
    finish,
    new_run,
    open_run,
    stage,
    start_call,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: The rows of the lane list as drawn.
ROWS_JS = """[...document.querySelectorAll("tr.lane")].map((r) => ({
  id: r.dataset.laneId, status: r.dataset.status,
  cells: Object.fromEntries([...r.querySelectorAll("[data-label]")].map(
    (c) => [c.dataset.label, c.textContent.trim()])) }))"""

#: How far the page scrolls sideways (its width beyond the window's), and the elements that
#: reach past the window's right edge, for the message when it does.
OVERFLOW_JS = """(() => {
  const root = document.documentElement;
  const past = [...document.querySelectorAll("body *")]
    .filter((e) => e.getBoundingClientRect().right > root.clientWidth + 0.5)
    .slice(0, 5).map((e) => `${e.tagName.toLowerCase()}#${e.id}.${e.className}`);
  return { overflow: root.scrollWidth - root.clientWidth, past };
})()"""


async def sideways(page: Browser) -> dict[str, Any]:
    """How far the page scrolls sideways (0: not at all), and what reaches past its edge."""
    found: dict[str, Any] = await page.call("eval", expr=OVERFLOW_JS)
    return found


#: Why the failed runs failed.
FAILURE = snapshot_pb2.OperationError(code="tool_failed", message="read_file failed")


async def sign_in(page: Browser, service: Service) -> None:
    await page.call("goto", url=f"{service.origin}/")
    await page.call("eval", expr=f"sessionStorage.setItem('lane-token', '{TOKEN_A}')")


async def open_list(page: Browser, service: Service, query: str) -> None:
    """The lane list at ``#/?query``, once the stream listed the lanes."""
    await sign_in(page, service)
    await page.call("goto", url=f"{service.origin}/#/?{query}")
    await page.wait("document.querySelector('#lanes')?.dataset.loaded === 'true'")


async def rows_when(page: Browser, condition: str) -> list[dict[str, Any]]:
    """The list's rows once ``condition`` (JavaScript over ``rows``) holds."""
    rows: list[dict[str, Any]] = await page.wait(
        f"(() => {{ const rows = {ROWS_JS}; return ({condition}) ? rows : null; }})()"
    )
    return rows


async def snapshot_of(rpc: Rpc, lane_id: str) -> snapshot_pb2.LaneSnapshot:
    answer = await rpc("GetLaneSnapshot", pb.GetLaneSnapshotRequest(lane_id=lane_id))
    snapshot: snapshot_pb2.LaneSnapshot = answer.snapshot
    return snapshot


async def test_the_list_filters_pages_and_live_rows(
    web_service: Service, web_page: Browser
) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    base = new_lane_id("wl")
    failed, live = f"{base}-failed", f"{base}-live"
    for i in range(51):  # with the two below: two pages of 50
        await rpc("CreateLane", pb.CreateLaneRequest(lane_id=f"{base}-idle-{i:02}"))
    run = await new_run(rpc, failed)
    await run.turn("trying", usage=messages_pb2.Usage(input=1500, output=40))
    await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_FAILED, FAILURE)
    script = await LaneScript.create(RpcStub(rpc), live)  # type: ignore[arg-type]

    await open_list(web_page, web_service, f"prefix={base}")
    rows = await rows_when(web_page, "rows.length === 50")
    # By last activity: the live lane (created last) first, then the failed one.
    assert [r["id"] for r in rows[:2]] == [live, failed]
    assert rows[1]["cells"]["Last run"] == "failed" and rows[1]["status"] == "idle"
    assert rows[1]["cells"]["Tokens"] == "1.50k in · 40 out"
    summary = await web_page.call(
        "eval", expr="document.querySelector('#list-summary').textContent"
    )
    assert summary == "1\u201350 of 53 lanes"
    await web_page.screenshot("list-1-page-one")

    # The second page, from the keyboard.
    await web_page.call("eval", expr="document.activeElement.blur()")
    await web_page.call("press", key="]")
    rows = await rows_when(web_page, "rows.length === 3")
    assert [r["id"] for r in rows] == [f"{base}-idle-{i:02}" for i in (2, 1, 0)]
    assert "page=2" in await web_page.call("eval", expr="location.hash")

    # The last run's filter: the failed lane alone.
    await web_page.call("select", selector="#filter-result", value="failed")
    rows = await rows_when(web_page, "rows.length === 1")
    assert rows[0]["id"] == failed
    await web_page.call("select", selector="#filter-result", value="")

    # Live: the lane starting a run and a tool call changes its row, without a reload.
    await web_page.call("click", selector='#filter-status [data-status="running"]')
    await rows_when(web_page, "rows.length === 0")
    live_run = await script.start_run("go")
    await live_run.turn("calling", tool_calls=[("t0", "shell", {"n": 0})])
    await start_call(live_run, "t0")
    rows = await rows_when(web_page, "rows.length === 1 && rows[0].cells.Tools === '1 running'")
    assert rows[0]["id"] == live and rows[0]["status"] == "running"
    assert rows[0]["cells"]["Open run"].startswith("run · started")
    count = await web_page.call(
        "eval", expr="document.querySelector('[data-status=\"running\"] .count').textContent"
    )
    assert count == "1"
    await web_page.screenshot("list-2-running-filter-live-row")
    await stage(live_run, "t0", "done")
    await finish(live_run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)
    await rows_when(web_page, "rows.length === 0")  # no longer running: it leaves the filter

    # Keyboard only: `/` to the filter, type, arrow down to the rows, Enter opens the lane.
    await web_page.call("click", selector='#filter-status [data-status="running"]')
    await web_page.call("eval", expr="document.activeElement.blur()")
    await web_page.call("press", key="/")
    assert await web_page.call("eval", expr="document.activeElement.id") == "filter-prefix"
    await web_page.call("press", key="Control+a")
    for key in f"{base}-f":
        await web_page.call("press", key=key)
    rows = await rows_when(web_page, "rows.length === 1")
    assert rows[0]["id"] == failed
    await web_page.call("press", key="ArrowDown")
    focused = await web_page.call(
        "eval", expr="document.activeElement.closest('tr')?.dataset.laneId ?? null"
    )
    assert focused == failed
    await web_page.call("press", key="Enter")
    await web_page.wait(
        f"document.querySelector('#lane')?.dataset.laneId === {json.dumps(failed)}"
        " && Number(document.querySelector('#lane').dataset.revision) > 0"
    )
    # On the lane's page, Tab reaches the tabs in one stop; the arrows move between them.
    for _ in range(12):
        await web_page.call("press", key="Tab")
        if await web_page.call("eval", expr="document.activeElement.id") == "tab-transcript":
            break
    await web_page.call("press", key="ArrowRight")
    await web_page.wait(
        "document.body.dataset.tab === 'timeline'"
        " && document.activeElement.id === 'tab-timeline'"
        " && !!document.querySelector('#timeline')"
    )
    await web_page.call("press", key="End")
    await web_page.wait(
        "document.body.dataset.tab === 'history' && document.activeElement.id === 'tab-history'"
    )


#: 20 KB of a tool's output, many lines, ending in the line that says what went wrong.
BIG_OUTPUT = "".join(f"line {i:04}: {'x' * 60}\n" for i in range(320)) + "ENOENT: no such file"


async def test_the_failed_lane_from_the_browser_alone(
    web_service: Service, web_page: Browser
) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-failed")
    run = await new_run(rpc, lane_id, "read the config")
    await run.turn(
        "reading both",
        tool_calls=[("bad1", "read_file", {"path": "cfg"}), ("ok1", "shell", {"cmd": "ls"})],
        usage=messages_pb2.Usage(input=900, output=30),
    )
    await start_call(run, "bad1")
    before = await start_call(run, "ok1")
    at_before = await snapshot_of(rpc, lane_id)
    assert at_before.revision == before
    waiting = await stage(run, "ok1", "a.txt b.txt")
    placed = await stage(run, "bad1", BIG_OUTPUT, error=True)
    assert list(placed.placed_tool_call_ids) == ["bad1", "ok1"]
    await run.turn("it failed", usage=messages_pb2.Usage(input=2400, output=60))
    ended = await run.end(snapshot_pb2.OPERATION_RESULT_STATUS_FAILED, FAILURE)

    # Found among the lanes: the failed ones of the last hour.
    await open_list(web_page, web_service, f"result=failed&since=1h&prefix={lane_id}")
    rows = await rows_when(web_page, "rows.length === 1")
    assert rows[0]["id"] == lane_id and rows[0]["cells"]["Last run"] == "failed"
    await web_page.call("click", selector="tr.lane a.lane-link")

    # Which call failed, in red, its output cut; then whole, in place.
    result = "li.tool-result.error[data-call-id='bad1']"
    cut: dict[str, Any] = await web_page.wait(
        f"""(() => {{ const r = document.querySelector("{result}");
          const lane = document.querySelector("#lane");
          if (!r || Number(lane.dataset.revision) < {ended.revision}) return null;
          const box = r.querySelector(".block-text");
          return {{ color: getComputedStyle(r).color, expanded: box.dataset.expanded,
                    shown: box.querySelector("pre").textContent,
                    button: box.querySelector("button.expand").textContent }}; }})()"""
    )
    assert cut["color"] == RED and cut["expanded"] == "false"
    assert len(cut["shown"]) < len(BIG_OUTPUT) and "ENOENT" not in cut["shown"]
    assert cut["button"].startswith("Show all · ") and cut["button"].endswith(" more")
    last = await web_page.call("eval", expr="document.querySelector('#last-result').textContent")
    assert "read_file failed" in last
    await web_page.screenshot("failed-1-result-cut")
    await web_page.call("click", selector=f"{result} button.expand")
    shown = await web_page.wait(
        f"""(() => {{ const box = document.querySelector("{result} .block-text");
          return box.dataset.expanded === "true" && box.querySelector("pre").textContent; }})()"""
    )
    assert shown == BIG_OUTPUT
    await web_page.screenshot("failed-2-result-expanded")
    # Its link to the lane as it was before it: the history, travelling, no result placed yet.
    await web_page.call("click", selector=f"{result} a.before")
    await web_page.wait(
        """(() => { const h = document.querySelector("#history");
          return h?.dataset.travelling === "true"
            && document.querySelectorAll("#travel li.tool-result").length === 0
            && document.querySelector("#travel .tool.settled.error")?.dataset.callId === "bad1";
        })()"""
    )

    # The timeline: both calls as bars, the failed one red; ok1 waited for bad1's placement.
    await web_page.call("click", selector="#tab-timeline")
    calls = await web_page.wait(
        """(() => { const rows = [...document.querySelectorAll("#timeline li.row.call")];
          return rows.length === 2 && rows.map((r) => ({ id: r.dataset.callId,
            state: r.dataset.state, error: r.classList.contains("error"),
            heldBy: r.dataset.heldBy ?? null, holder: r.classList.contains("holder"),
            bars: [...r.querySelectorAll(".bar")].map((b) => b.className) })); })()"""
    )
    by_id = {c["id"]: c for c in calls}
    assert by_id["bad1"]["error"] and "bar run fail" in by_id["bad1"]["bars"]
    assert not by_id["ok1"]["error"] and by_id["ok1"]["heldBy"] == "bad1"
    assert by_id["bad1"]["holder"]
    assert {c["state"] for c in calls} == {"placed"}
    await web_page.screenshot("failed-3-timeline")

    # Usage: a bar in and a bar out per turn, heights as the tokens.
    await web_page.call("click", selector="#tab-usage")
    bars = await web_page.wait(
        """(() => { const r = [...document.querySelectorAll("#usage svg.chart rect")];
          return r.length === 4 && r.map((b) => [b.getAttribute("class"),
            Number(b.getAttribute("height"))]); })()"""
    )
    heights = {(kind, i): h for i, (kind, h) in enumerate(bars)}
    ins = [h for (kind, _), h in heights.items() if kind == "in"]
    assert len(ins) == 2 and ins[1] > ins[0]  # 2,400 in after 900
    totals = await web_page.call("eval", expr="document.querySelector('#usage').textContent")
    assert "3.30k" in totals  # 900 + 2,400 tokens in
    await web_page.screenshot("failed-4-usage")

    # The history: the lane as it was before the failed result, as the service's snapshot had
    # it at that revision (the browser folds the log with the reducer).
    await web_page.call("eval", expr=f"location.hash = '#/lanes/{lane_id}/history?rev={before}'")
    travel = await web_page.wait(
        f"""(() => {{ const h = document.querySelector("#history");
          return h && h.dataset.revision === "{before}" && h.dataset.travelling === "true"
            && window.__laneTravel?.revision === "{before}" && window.__laneTravel; }})()"""
    )
    folded = json.loads(travel["snapshot"])
    assert folded == json_format.MessageToDict(at_before)
    drawn = await web_page.call(
        "eval",
        expr="""[...document.querySelectorAll("#travel .travel-state li.tool-result")].length""",
    )
    assert drawn == 0  # no result placed yet at that revision
    tools = await web_page.call(
        "eval", expr="[...document.querySelectorAll('#travel li.tool')].map((t) => t.textContent)"
    )
    # Both calls running then; no elapsed time (it would be now's, not that revision's).
    assert [t.split(" · ")[:2] for t in tools] == [[" read_file", "running"], [" shell", "running"]]
    bar = await web_page.call("eval", expr="document.querySelector('#travel-bar').textContent")
    assert bar.startswith(f"Viewing revision {before} of {ended.revision}")
    # Its events, each as JSON on demand.
    await web_page.call("click", selector="#group-events details summary")
    event = await web_page.wait(
        "document.querySelector('#group-events details[open] pre.json')?.textContent"
    )
    assert json.loads(event)["revision"] == str(before)
    await web_page.screenshot("failed-5-history-before-the-failure")

    # The next commit: ok1 settled, waiting for bad1 (nothing placed); then, at the revision
    # its staging answered, both placed.
    await web_page.call("click", selector="#revision-next")
    await web_page.wait(
        f"""(() => {{ const h = document.querySelector("#history");
          return h?.dataset.revision === "{waiting.revision}"
            && document.querySelectorAll("#travel li.tool-result").length === 0
            && document.querySelector("#travel .tool.settled")?.dataset.callId === "ok1"; }})()"""
    )
    await web_page.call(
        "eval", expr=f"location.hash = '#/lanes/{lane_id}/history?rev={placed.revision}'"
    )
    await web_page.wait(
        f"""(() => {{ const h = document.querySelector("#history");
          const ids = [...document.querySelectorAll("#travel li.tool-result")]
            .map((r) => r.dataset.callId).join(",");
          return h?.dataset.revision === "{placed.revision}" && ids === "bad1,ok1"; }})()"""
    )
    # Back to live, then start it again with a message for the next run.
    await web_page.call("click", selector="#back-to-live")
    await web_page.wait("document.body.dataset.tab === 'transcript'")
    await web_page.call("fill", selector="#send-text", value="Try again with cfg.toml")
    await web_page.call(
        "select", selector="#send-kind", value=str(snapshot_pb2.QUEUE_KIND_NEXT_RUN)
    )
    await web_page.call("click", selector="#send")
    status = await web_page.wait(
        "(() => { const s = document.querySelector('#send-status').textContent;"
        " return s.startsWith('queued at revision') && s; })()"
    )
    queued_at = int(status.rsplit(" ", 1)[1])
    state = await snapshot_of(rpc, lane_id)
    assert state.revision == queued_at
    assert [(q.kind, q.message.user.content[0].text.text) for q in state.queues] == [
        (snapshot_pb2.QUEUE_KIND_NEXT_RUN, "Try again with cfg.toml")
    ]
    queue = await web_page.wait(
        "[...document.querySelectorAll('#queue li.queued')].map((q) => q.textContent)"
        ".filter((t) => t.includes('cfg.toml')).length === 1"
    )
    assert queue
    await web_page.screenshot("failed-6-message-for-the-next-run")
    rerun = await LaneScript(RpcStub(rpc), lane_id).start_run()  # type: ignore[arg-type]
    taken = await snapshot_of(rpc, lane_id)
    assert len(taken.queues) == 0 and taken.operation.id == rerun.operation_id
    await finish(rerun, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)


async def test_send_abort_export_delete_import(
    web_service: Service, web_page: Browser, tmp_path: Path
) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-act")
    run = await open_run(rpc, lane_id, ["s0"])
    revision = await start_call(run, "s0")
    await sign_in(web_page, web_service)
    await web_page.open_lane(web_service.origin, lane_id)
    await web_page.at_revision(revision)

    # Send a steer to the open run: queued in the lane's inbox, shown on the page.
    await web_page.call("fill", selector="#send-text", value="Use the staging database.")
    await web_page.call("click", selector="#send")  # steer is the default kind
    await web_page.wait("document.querySelector('#send-status').textContent.startsWith('queued')")
    queued = await web_page.wait(
        "(() => { const q = [...document.querySelectorAll('#queue li.queued')]"
        ".map((e) => e.textContent); return q.length === 1 && q; })()"
    )
    assert queued == ["queued steer Use the staging database."]
    snapshot = await snapshot_of(rpc, lane_id)
    assert [q.kind for q in snapshot.queues] == [snapshot_pb2.QUEUE_KIND_STEER]

    # Abort from the page; the run ends aborted.
    await web_page.call("click", selector="button#abort")
    await web_page.state_when("s.operation && s.operation.status === 'aborting'")
    assert (await snapshot_of(rpc, lane_id)).operation.status == (
        snapshot_pb2.OPERATION_STATUS_ABORTING
    )
    # Export and delete refuse a lane with an open run: said in words. The delete dialog offers
    # to delete the run too; left unticked, the service refuses and nothing changes.
    await web_page.call("click", selector="#export")
    busy = await web_page.wait(
        "(() => { const n = document.querySelector('#notice');"
        " return n.classList.contains('error') && n.textContent; })()"
    )
    assert busy == (
        f"Export failed: Lane {lane_id} has a run open: abort it first, or wait for it to end."
        " FAILED_PRECONDITION LANE_BUSY"
    )
    await web_page.call("click", selector="#delete")
    await web_page.wait("document.querySelector('dialog#delete-dialog[open] #delete-force')")
    await web_page.call("click", selector="#delete-dialog-confirm")
    refused = await web_page.wait(
        "(() => { const s = document.querySelector('#delete-status');"
        " return s?.classList.contains('error') && s.textContent; })()"
    )
    assert refused.startswith(f"Lane {lane_id} has a run open") and "LANE_BUSY" in refused
    await web_page.call("click", selector="#delete-dialog-cancel")
    assert (await snapshot_of(rpc, lane_id)).operation.id == run.operation_id

    await stage(run, "s0", "stopped")
    ended = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_ABORTED)
    await web_page.at_revision(ended)
    original = await snapshot_of(rpc, lane_id)

    # Export: the file downloads; its header names the lane.
    exported = tmp_path / "export.jsonl"
    name = await web_page.call("download", selector="#export", path=str(exported))
    assert name == f"{lane_id}.jsonl"
    lines = exported.read_text().splitlines()
    assert json.loads(lines[0])["laneId"] == lane_id and len(lines) > 5
    await web_page.wait("document.querySelector('#notice').textContent.startsWith('Exported')")

    # Delete: the confirmation names the lane; confirmed, the lane is gone and the page waits
    # for a lane of its id.
    await web_page.call("click", selector="#delete")
    asked = await web_page.wait("document.querySelector('dialog#delete-dialog[open]')?.innerText")
    assert f"Delete lane {lane_id}?" in asked
    await web_page.screenshot("act-1-delete-confirmation")
    await web_page.call("click", selector="#delete-dialog-confirm")
    waiting = await web_page.wait(
        "document.querySelector('#connection').dataset.state === 'waiting'"
        " && document.querySelector('#waiting').dataset.reason === 'deleted'"
        " && document.querySelector('#waiting').textContent"
    )
    assert f"Lane {lane_id} was deleted." in waiting
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await snapshot_of(rpc, lane_id)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND

    # Import the download under the same id, from the list's dialog: the lane's page shows it.
    await web_page.call("goto", url=f"{web_service.origin}/#/")
    await web_page.call("click", selector="#import-open")
    await web_page.call("upload", selector="#import-file", path=str(exported))
    await web_page.wait(f"document.querySelector('#import-lane-id').value === '{lane_id}-copy'")
    await web_page.call("fill", selector="#import-lane-id", value=lane_id)
    await web_page.call("click", selector="#import-dialog-confirm")
    await web_page.wait(
        f"document.querySelector('#lane')?.dataset.laneId === '{lane_id}'"
        " && document.querySelector('#connection').dataset.state === 'live'"
    )
    imported = await snapshot_of(rpc, lane_id)
    assert [e.id for e in imported.transcript] == [e.id for e in original.transcript]
    assert [e.seq for e in imported.transcript] == [e.seq for e in original.transcript]
    await web_page.screenshot("act-2-imported")

    # Again under the same id: refused, and said so in words.
    await web_page.call("goto", url=f"{web_service.origin}/#/")
    await web_page.call("click", selector="#import-open")
    await web_page.call("upload", selector="#import-file", path=str(exported))
    await web_page.call("fill", selector="#import-lane-id", value=lane_id)
    await web_page.call("click", selector="#import-dialog-confirm")
    refusal = await web_page.wait(
        "(() => { const s = document.querySelector('#import-status');"
        " return s.classList.contains('error') && s.textContent; })()"
    )
    assert refusal == (
        f"A lane named {lane_id} exists already: choose another id. ALREADY_EXISTS LANE_EXISTS"
    )
    await web_page.screenshot("act-3-import-refused-in-words")
    await web_page.call("click", selector="#import-dialog-cancel")


async def test_a_page_waits_for_a_lane_created_afterwards(
    web_service: Service, web_page: Browser
) -> None:
    lane_id = new_lane_id("web-later")
    await sign_in(web_page, web_service)
    await web_page.call("goto", url=f"{web_service.origin}/#/lanes/{lane_id}")
    waiting = await web_page.wait(
        "document.querySelector('#connection')?.dataset.state === 'waiting'"
        " && !document.querySelector('#waiting').hidden"
        " && document.querySelector('#waiting').textContent"
    )
    assert f"Lane {lane_id} does not exist yet. This page waits for it" in waiting
    await web_page.screenshot("waiting-1-for-a-lane-not-created-yet")

    created = await Rpc(web_service, TOKEN_A)("CreateLane", pb.CreateLaneRequest(lane_id=lane_id))
    state = await web_page.at_revision(created.revision)
    assert state["revision"] == created.revision
    assert await web_page.call("eval", expr="document.querySelector('#waiting').hidden")
    await web_page.screenshot("waiting-2-the-lane-created")


async def test_a_phone_wide_screen_and_dark_mode(web_service: Service, web_page: Browser) -> None:
    rpc = Rpc(web_service, TOKEN_A)
    lane_id = new_lane_id("web-narrow-screen-with-a-rather-long-lane-id-to-wrap")
    run = await new_run(rpc, lane_id)
    long_args = {"path": "/" + "very-long-directory-name/" * 30, "flags": ["-" * 300]}
    await run.turn("reading", tool_calls=[("w1", "read_file", long_args)])
    await start_call(run, "w1")
    await stage(run, "w1", "{" + ",".join(f'"k{i}":"{"v" * 80}"' for i in range(60)) + "}")
    await run.turn("done", usage=messages_pb2.Usage(input=10, output=5))
    ended = await finish(run, snapshot_pb2.OPERATION_RESULT_STATUS_COMPLETED)

    await web_page.call("viewport", width=390, height=844)
    try:
        await open_list(web_page, web_service, f"prefix={lane_id}")
        await rows_when(web_page, "rows.length === 1")
        assert (found := await sideways(web_page))["overflow"] <= 0, found
        await web_page.screenshot("narrow-1-list")

        await web_page.call("goto", url=f"{web_service.origin}/#/lanes/{lane_id}")
        await web_page.at_revision(ended)
        # Expand everything cut: the call's arguments, then their box, and the result.
        closed = "button.expand[aria-expanded=false]"
        for _ in range(6):
            if not await web_page.call("eval", expr=f"!!document.querySelector('{closed}')"):
                break
            await web_page.call("click", selector=closed)
        args = await web_page.call(
            "eval",
            expr="document.querySelector('li.entry.call[data-call-id=w1] .block-text pre')"
            ".textContent",
        )
        assert json.loads(args) == long_args
        assert not await web_page.call("eval", expr=f"!!document.querySelector('{closed}')")
        assert (found := await sideways(web_page))["overflow"] <= 0, found
        await web_page.screenshot("narrow-2-lane-expanded")
        for tab in ("timeline", "usage", "history"):
            await web_page.call("click", selector=f"#tab-{tab}")
            await web_page.wait(f"document.querySelector('#panel-{tab}').childElementCount > 0")
            if tab == "history":
                await web_page.call("click", selector="#group-events details summary")
                await web_page.wait("document.querySelector('#group-events details[open] pre')")
            assert (found := await sideways(web_page))["overflow"] <= 0, (tab, found)
            await web_page.screenshot(f"narrow-3-{tab}")

        # Dark mode, as the system says: a dark background, light text.
        await web_page.call("scheme", value="dark")
        colors = await web_page.call(
            "eval",
            expr="[getComputedStyle(document.body).backgroundColor,"
            " getComputedStyle(document.body).color]",
        )
        background, text = (luminance(c) for c in colors)
        assert background < 0.1 and text > 0.6, colors
        await web_page.call("click", selector="#tab-transcript")
        await web_page.screenshot("narrow-4-dark")
    finally:
        await web_page.call("scheme", value="light")
        await web_page.call("viewport", width=1100, height=760)


def luminance(css: str) -> float:
    """The relative luminance (0 black, 1 white) of an ``rgb(r, g, b)`` color."""
    channels = [int(part) / 255 for part in css[css.index("(") + 1 : css.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
