/**
 * A lane's page. Live: folds `WatchLane` with the client's watcher (the reducer the
 * conformance vectors test) and redraws after every update, so an assistant message streaming
 * in grows with each committed partial and gives way to the settled message in the redraw of
 * the group that settles it. The watcher resumes on its own after a dropped stream or a
 * service restart; meanwhile the page says `reconnecting · attempt n · cause`, and `live` again
 * at the next update or heartbeat. A lane that does not exist (yet, or any more) is waited for,
 * as `lane watch` waits: one WatchLanes stream naming it says when it is created.
 *
 * Four tabs: the transcript (with the open run, its tools, the inbox, and a box to send a
 * message), the timeline of a run, the tokens per turn, and the history — the event log, and
 * the lane as it was at any revision of it (history.ts). The log is read (ReadLaneEvents) when
 * a tab needs it, then kept current from the live watch. Actions: send (EnqueueMessage, as
 * `lane send`), abort (AbortOperation), export (ExportLane, a download), delete (DeleteLane,
 * after a confirmation naming the lane); a refusal is said in words (refusals.ts).
 */
import { create, toJsonString } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import {
  AgentMessageSchema,
  HarnessEventSchema,
  LaneSnapshotSchema,
  OperationKind,
  OperationStatus,
  QueueKind,
  laneErrorFrom,
  watchLane,
  watchLanes,
  type HarnessEvent,
  type LaneError,
  type LaneSnapshot,
} from "@lane/client";
import { ToolClock } from "./clock.js";
import { button, copyButton, h, openDialog } from "./dom.js";
import { absolute, byteSize, refreshTimes, timeElement, msOf } from "./format.js";
import { LaneLog, origin, stateAt, type LogGroup } from "./history.js";
import { QUEUE_NAMES } from "./names.js";
import { codeLine, explain } from "./refusals.js";
import { countdown, prettyJson, renderOperation, renderQueue, renderTranscript, seconds, type Look } from "./render.js";
import { laneHref, TABS, type Tab } from "./route.js";
import { runsOf, type RunSpan } from "./runs.js";
import { client } from "./session.js";
import { renderTimeline } from "./timeline.js";
import { download, exportFile } from "./transfer.js";
import { renderUsage } from "./usage.js";

/** Elapsed times and a retry's countdown are redrawn this often, between updates. */
const TICK_MS = 200;
/** The history list shows this many commits around the one chosen. */
const HISTORY_WINDOW = 150;

const TAB_LABELS: Readonly<Record<Tab, string>> = {
  transcript: "Transcript",
  timeline: "Timeline",
  usage: "Usage",
  history: "History",
};

export interface LanePageHooks {
  /** The service wants a (different) bearer token. */
  unauthenticated(error: LaneError): void;
}

/** What the page shows of the lane now, as the list names statuses. */
function statusOf(snapshot: LaneSnapshot): string {
  const operation = snapshot.operation;
  if (operation === undefined) {
    return snapshot.faulted ? "faulted" : "idle";
  }
  if (operation.status === OperationStatus.ABORTING) return "aborting";
  if (operation.kind === OperationKind.COMPACTION) return "compacting";
  if (operation.deferred !== undefined) return "suspended";
  if (operation.retry !== undefined) return "retry waiting";
  return "running";
}

export class LanePage {
  private tab: Tab;
  private revision: bigint | undefined;
  private snapshot: LaneSnapshot | undefined;
  private log: LaneLog | undefined;
  private logReading: Promise<void> | undefined;
  private timelineRun = "";
  private readonly clock = new ToolClock();
  private readonly look: Look;
  private readonly page: HTMLElement;
  private readonly connection = h("span", { id: "connection", "data-state": "connecting" }, "connecting");
  private readonly status = h("span", { id: "lane-status", class: "badge" }, "…");
  private readonly revisionText = h("span", { id: "revision" }, "…");
  private readonly notice = h("p", { id: "notice", role: "status" });
  private readonly waiting = h("div", { id: "waiting", hidden: "" });
  private readonly tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "Views of the lane" });
  private readonly panels: Record<Tab, HTMLElement> = {
    transcript: h("div", { id: "panel-transcript", role: "tabpanel" }),
    timeline: h("div", { id: "panel-timeline", role: "tabpanel" }),
    usage: h("div", { id: "panel-usage", role: "tabpanel" }),
    history: h("div", { id: "panel-history", role: "tabpanel" }),
  };
  private readonly body = h("div", { id: "lane-body" });
  private readonly ticker: ReturnType<typeof setInterval>;

  constructor(
    root: HTMLElement,
    readonly laneId: string,
    tab: Tab,
    revision: bigint | undefined,
    private readonly hooks: LanePageHooks,
    private readonly signal: AbortSignal,
  ) {
    this.tab = tab;
    this.revision = revision;
    this.look = { expanded: new Set(), historyHref: (rev) => laneHref(laneId, "history", rev) };
    this.page = h(
      "main",
      { id: "lane", "data-lane-id": laneId },
      h(
        "header",
        { class: "lane-head" },
        h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "#/" }, "Lanes"), " / "),
        h("h1", {}, laneId),
        h("div", { class: "lane-state" }, this.status, " ", this.revisionText, " · ", this.connection),
        h(
          "div",
          { class: "actions" },
          button({ id: "export" }, "Export", () => this.exportLane()),
          button({ id: "delete", class: "danger" }, "Delete…", () => this.deleteLane()),
        ),
      ),
      this.notice,
      this.waiting,
      this.tabs,
      ...TABS.map((name) => this.panels[name]),
    );
    this.panels.transcript.append(this.body, this.composer());
    root.replaceChildren(this.page);
    this.tabs.addEventListener("keydown", (event) => this.onTabKey(event));
    this.ticker = setInterval(() => this.tick(), TICK_MS);
    signal.addEventListener("abort", () => clearInterval(this.ticker));
    this.show(tab, revision);
    this.follow().catch((thrown: unknown) => this.fatal(laneErrorFrom(thrown)));
  }

  /** Show `tab` (and for the history, `revision`), keeping the live watch. */
  show(tab: Tab, revision: bigint | undefined): void {
    this.tab = tab;
    this.revision = revision;
    document.body.dataset.tab = tab;
    const focused = this.tabs.contains(document.activeElement);
    this.tabs.replaceChildren(
      ...TABS.map((name) =>
        h(
          "a",
          {
            href: laneHref(this.laneId, name),
            role: "tab",
            id: `tab-${name}`,
            "aria-selected": String(name === tab),
            "aria-controls": `panel-${name}`,
            // One stop for Tab; the arrows move between the tabs (onTabKey).
            tabindex: name === tab ? "0" : "-1",
          },
          TAB_LABELS[name],
        ),
      ),
    );
    if (focused) {
      this.tabs.querySelector<HTMLElement>(`#tab-${tab}`)?.focus();
    }
    for (const name of TABS) {
      this.panels[name].hidden = name !== tab;
    }
    this.drawTab();
  }

  /** The tab list's keys (the ARIA tabs pattern): the arrows, Home and End pick a tab. */
  private onTabKey(event: KeyboardEvent): void {
    const at = TABS.indexOf(this.tab);
    const next: Readonly<Record<string, number>> = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: TABS.length - 1 };
    const index = next[event.key];
    if (index === undefined || event.altKey || event.ctrlKey || event.metaKey) {
      return;
    }
    event.preventDefault();
    const tab = TABS[(index + TABS.length) % TABS.length]!;
    location.hash = laneHref(this.laneId, tab); // show() keeps the focus on the tabs
  }

  // -- the live watch --------------------------------------------------------------------

  private setConnection(state: string, text: string): void {
    this.connection.dataset.state = state;
    this.connection.textContent = text;
  }

  private async follow(): Promise<void> {
    while (!this.signal.aborted) {
      try {
        for await (const update of watchLane(client, this.laneId, {
          signal: this.signal,
          heartbeats: true,
          connectTimeoutMs: 0, // a page rides outages out, saying "reconnecting" meanwhile
          onRetry: (info) => {
            const cause = info.error ? `${info.error.codeName}: ${info.error.message}` : "stream ended";
            this.setConnection(
              "reconnecting",
              info.mode === "resnapshot" ? `re-snapshotting · ${cause}` : `reconnecting · attempt ${info.attempt} · ${cause}`,
            );
          },
        })) {
          this.setConnection("live", "live");
          this.waiting.hidden = true;
          if (update.kind === "snapshot") {
            // How many snapshots the page has folded from: 1 unless it re-snapshotted (a
            // resume after a restart continues from its revision, without one).
            this.page.dataset.snapshots = String(Number(this.page.dataset.snapshots ?? 0) + 1);
          }
          if (update.kind !== "heartbeat") {
            this.take(update.snapshot, update.events, update.kind === "snapshot");
          }
        }
        return;
      } catch (thrown) {
        if (this.signal.aborted) {
          return;
        }
        const error = laneErrorFrom(thrown);
        if (error.code === Code.Unauthenticated) {
          this.setConnection("failed", "stopped");
          this.hooks.unauthenticated(error);
          return;
        }
        if (error.code !== Code.NotFound) {
          this.fatal(error);
          return;
        }
        await this.waitForLane(error.reason === "LANE_DELETED");
      }
    }
  }

  /** Until the lane exists: say so, and follow it by id on a WatchLanes stream. */
  private async waitForLane(deleted: boolean): Promise<void> {
    this.setConnection("waiting", "waiting for the lane");
    this.snapshot = undefined;
    this.log = undefined;
    this.page.dataset.revision = "0";
    this.status.textContent = deleted ? "deleted" : "not created yet";
    this.status.className = "badge s-faulted";
    this.revisionText.textContent = "";
    this.waiting.hidden = false;
    this.waiting.dataset.reason = deleted ? "deleted" : "missing";
    this.waiting.replaceChildren(
      h("span", { class: "spinner", "aria-hidden": "true" }),
      " ",
      deleted
        ? `Lane ${this.laneId} was deleted. This page waits for a lane of this id to be created again, and shows it as soon as it is.`
        : `Lane ${this.laneId} does not exist yet. This page waits for it, as lane watch does, and shows it as soon as it is created.`,
      h("br", {}),
      h("small", {}, "(Or it belongs to another token's lanes: then it never shows here.)"),
    );
    this.body.replaceChildren();
    for await (const update of watchLanes(client, {
      laneIds: [this.laneId],
      signal: this.signal,
      onRetry: (info) =>
        this.setConnection("reconnecting", `waiting · reconnecting · attempt ${info.attempt}${info.error ? ` · ${info.error.codeName}` : ""}`),
    })) {
      this.setConnection("waiting", "waiting for the lane");
      if (update.lanes.has(this.laneId)) {
        return;
      }
    }
  }

  private fatal(error: LaneError): void {
    if (this.signal.aborted) {
      return;
    }
    this.setConnection("failed", "stopped");
    this.body.replaceChildren(
      h("p", { id: "fatal", class: "error" }, `${error.codeName} ${error.reason}: ${error.message}`, h("br", {}), h("small", {}, explain(error, this.laneId))),
    );
  }

  /** A new state of the lane: fold it into the page and the log. */
  private take(snapshot: LaneSnapshot, events: readonly HarnessEvent[], fresh: boolean): void {
    const before = this.snapshot;
    this.snapshot = snapshot;
    this.clock.observe(snapshot, events);
    if (this.log !== undefined) {
      if (before !== undefined && before.incarnation !== snapshot.incarnation) {
        this.log = undefined; // another lane of this id: its log starts over
      } else if (events.length > 0 && !this.log.add(events)) {
        this.readLog(); // a gap (the page resumed past events): read what is missing
      } else if (fresh && this.log.last < snapshot.revision) {
        this.readLog();
      }
    }
    this.draw();
  }

  private draw(): void {
    const snapshot = this.snapshot;
    if (snapshot === undefined) {
      return;
    }
    const status = statusOf(snapshot);
    this.status.textContent = status;
    this.status.className = `badge s-${status.replace(" ", "-")}`;
    this.revisionText.textContent = `revision ${snapshot.revision}`;
    const queue = renderQueue(snapshot);
    this.body.replaceChildren(
      renderTranscript(snapshot, this.look),
      renderOperation(snapshot, this.clock, this.look, (operationId) => this.abort(operationId)),
      ...(queue === null ? [] : [queue]),
    );
    if (this.tab !== "transcript") {
      this.drawTab();
    }
    // Last: whoever waits for a revision finds the page drawn for it.
    this.page.dataset.revision = snapshot.revision.toString();
  }

  private tick(): void {
    for (const span of this.page.querySelectorAll<HTMLElement>(".elapsed")) {
      span.textContent = seconds(this.clock.elapsed(span.dataset.callId ?? ""));
    }
    for (const span of this.page.querySelectorAll<HTMLElement>(".countdown")) {
      span.textContent = countdown(Number(span.dataset.at));
    }
    refreshTimes(this.page);
  }

  // -- the tabs that read the log -----------------------------------------------------------

  /** Read the log up to the live revision (once at a time), then redraw the tab. */
  private readLog(): void {
    const snapshot = this.snapshot;
    if (snapshot === undefined || this.logReading !== undefined) {
      return;
    }
    const reading = async (): Promise<void> => {
      if (this.log === undefined || this.log.incarnation !== snapshot.incarnation) {
        this.log = await LaneLog.read(client, this.laneId, snapshot.incarnation, snapshot.revision, this.signal);
      } else {
        await this.log.readUpTo(client, this.laneId, snapshot.revision, this.signal);
      }
    };
    this.logReading = reading()
      .catch((thrown: unknown) => {
        if (!this.signal.aborted) {
          const error = laneErrorFrom(thrown);
          this.say(`The lane's history could not be read: ${explain(error, this.laneId)}`, error);
        }
      })
      .finally(() => {
        this.logReading = undefined;
        this.drawTab();
      });
  }

  private drawTab(): void {
    if (this.tab === "transcript") {
      return;
    }
    const panel = this.panels[this.tab];
    const snapshot = this.snapshot;
    const log = this.log;
    if (snapshot === undefined) {
      panel.replaceChildren(h("p", { class: "dim" }, "Waiting for the lane…"));
      return;
    }
    if (log === undefined || log.last < snapshot.revision) {
      if (panel.childElementCount === 0 || log === undefined) {
        panel.replaceChildren(h("p", { class: "dim loading" }, "Reading the lane's history…"));
      }
      this.readLog();
      if (log === undefined) {
        return;
      }
    }
    switch (this.tab) {
      case "timeline":
        panel.replaceChildren(this.timeline(runsOf(log.groups)));
        break;
      case "usage":
        panel.replaceChildren(renderUsage(runsOf(log.groups), snapshot));
        break;
      case "history":
        panel.replaceChildren(this.history(log, snapshot));
        break;
      default:
        break;
    }
  }

  private timeline(runs: RunSpan[]): HTMLElement {
    if (runs.length === 0) {
      return h("p", { class: "dim" }, "No run yet.");
    }
    const chosen = runs.find((run) => run.id === this.timelineRun) ?? runs.at(-1)!;
    const select = h(
      "select",
      { id: "timeline-run", "aria-label": "Run" },
      ...[...runs].reverse().map((run, i) =>
        h("option", { value: run.id }, `${runs.length - i}. ${run.id} · ${absolute(run.start)}${run.end === undefined ? " · open" : ""}`),
      ),
    );
    select.value = chosen.id;
    select.addEventListener("change", () => {
      this.timelineRun = select.value;
      this.drawTab();
      this.panels.timeline.querySelector<HTMLElement>("#timeline-run")?.focus();
    });
    return h("div", {}, h("label", { class: "inline" }, h("span", { class: "label" }, "Run"), select), renderTimeline(chosen));
  }

  /** The history: the commits (a window of them around the one chosen), a slider over them,
   *  the lane as it was after the chosen one, and its events as JSON. */
  private history(log: LaneLog, live: LaneSnapshot): HTMLElement {
    const groups = log.groups;
    if (groups.length === 0) {
      return h("p", { class: "dim" }, "The log holds no event.");
    }
    const wanted = this.revision ?? live.revision;
    const index = log.groupAt(wanted);
    const group = groups[index]!;
    const travelling = this.revision !== undefined && group.last < live.revision;
    const start = origin(live, log);
    const state = start === undefined ? undefined : group.last >= live.revision ? live : stateAt(log, start, group.last);
    if (state !== undefined) {
      (window as unknown as { __laneTravel: unknown }).__laneTravel = {
        revision: group.last.toString(),
        snapshot: toJsonString(LaneSnapshotSchema, state),
      };
    }
    const slider = h("input", {
      id: "revision-slider",
      type: "range",
      min: "0",
      max: String(groups.length - 1),
      step: "1",
      value: String(index),
      "aria-label": "Revision",
      "aria-valuetext": `revision ${group.last}`,
    });
    let sliding: ReturnType<typeof setTimeout> | undefined;
    slider.addEventListener("input", () => {
      clearTimeout(sliding);
      sliding = setTimeout(() => this.choose(groups[Number(slider.value)]!.last, true), 120);
    });
    const from = Math.max(0, index - Math.floor(HISTORY_WINDOW / 2));
    const to = Math.min(groups.length, from + HISTORY_WINDOW);
    const items = groups.slice(from, to).map((g) => this.groupItem(g, g === group));
    const state_ =
      state === undefined
        ? h(
            "p",
            { class: "dim", id: "travel-unavailable" },
            `This lane's log starts after revision ${log.floor}: the older events were removed by retention (docs/deploying.md), so the lane's earlier states cannot be rebuilt. Its events are still here.`,
          )
        : h(
            "div",
            { class: "travel-state" },
            renderTranscript(state, { expanded: this.look.expanded }),
            renderOperation(state, undefined, { expanded: this.look.expanded }),
            renderQueue(state),
          );
    const time = msOf(group.events[0]?.commitTime);
    return h(
      "section",
      { id: "history", "data-revision": group.last.toString(), "data-travelling": String(travelling) },
      h(
        "div",
        { id: "travel-bar", class: travelling ? "travelling" : "" },
        ...(travelling
          ? [`Viewing revision ${group.last} of ${live.revision}`, " · committed ", timeElement(time), " "]
          : [`Live: revision ${live.revision}`, " "]),
        travelling ? button({ id: "back-to-live", class: "primary" }, "Back to live", () => (location.hash = laneHref(this.laneId))) : null,
      ),
      h(
        "div",
        { class: "slider" },
        button({ id: "revision-prev", "aria-label": "Previous commit", disabled: index === 0 ? "" : undefined }, "◀", () =>
          this.choose(groups[index - 1]!.last, false),
        ),
        slider,
        button({ id: "revision-next", "aria-label": "Next commit", disabled: index === groups.length - 1 ? "" : undefined }, "▶", () =>
          this.choose(groups[index + 1]!.last, false),
        ),
      ),
      h(
        "div",
        { class: "history-cols" },
        h(
          "div",
          { class: "commits" },
          h("h2", {}, "Commits"),
          from > 0 ? h("p", { class: "dim" }, `${from} older`) : null,
          h("ol", { id: "groups" }, ...items),
          to < groups.length ? h("p", { class: "dim" }, `${groups.length - to} newer`) : null,
          log.floor > 0n ? h("p", { class: "dim" }, `events up to revision ${log.floor} were removed by retention`) : null,
        ),
        h(
          "div",
          { id: "travel", "data-revision": group.last.toString() },
          h("h2", {}, `The lane at revision ${group.last}`),
          state_,
          h("h2", {}, `Events of this commit (${group.first === group.last ? `revision ${group.first}` : `revisions ${group.first}–${group.last}`})`),
          h("ol", { id: "group-events" }, ...group.events.map((event) => eventItem(event))),
        ),
      ),
    );
  }

  private groupItem(group: LogGroup, chosen: boolean): HTMLElement {
    const kinds = group.events.map((event) => event.kind.case ?? "unknown");
    const shown = [...new Set(kinds)].slice(0, 4).join(", ") + (new Set(kinds).size > 4 ? ", …" : "");
    const time = msOf(group.events[0]?.commitTime);
    return h(
      "li",
      { class: chosen ? "chosen" : undefined, "data-revision": group.last.toString() },
      h(
        "a",
        { href: laneHref(this.laneId, "history", group.last), "aria-current": chosen ? "true" : undefined },
        h("span", { class: "rev" }, group.first === group.last ? `${group.last}` : `${group.first}–${group.last}`),
        " ",
        h("span", { class: "kinds" }, shown),
        " ",
        time === undefined ? "" : h("span", { class: "dim" }, new Date(time).toLocaleTimeString()),
      ),
    );
  }

  /** Show the lane at `revision` (in the address too). */
  private choose(revision: bigint, sliding: boolean): void {
    const href = laneHref(this.laneId, "history", revision);
    if (sliding) {
      history.replaceState(null, "", href);
      this.show("history", revision);
      this.panels.history.querySelector<HTMLElement>("#revision-slider")?.focus();
    } else {
      location.hash = href;
    }
  }

  // -- actions ------------------------------------------------------------------------------

  private say(text: string, error?: LaneError): void {
    this.notice.className = error === undefined ? "ok" : "error";
    this.notice.replaceChildren(text, error === undefined ? "" : h("small", { class: "code" }, ` ${codeLine(error)}`));
  }

  private abort(operationId: string): void {
    this.say("");
    client.abortOperation({ laneId: this.laneId, operationId, requestId: crypto.randomUUID() }).catch((thrown: unknown) => {
      const error = laneErrorFrom(thrown);
      this.say(`Abort failed: ${explain(error, this.laneId)}`, error);
    });
  }

  /** The box that sends a message to the lane (EnqueueMessage, as `lane send`). */
  private composer(): HTMLElement {
    const text = h("textarea", { id: "send-text", rows: "3", placeholder: "A message for the lane…", "aria-label": "Message" });
    const kind = h(
      "select",
      { id: "send-kind", "aria-label": "Deliver as" },
      h("option", { value: String(QueueKind.STEER) }, `${QUEUE_NAMES[QueueKind.STEER]} (at the open run's next turn)`),
      h("option", { value: String(QueueKind.FOLLOW_UP) }, `${QUEUE_NAMES[QueueKind.FOLLOW_UP]} (when the run would finish)`),
      h("option", { value: String(QueueKind.NEXT_RUN) }, `${QUEUE_NAMES[QueueKind.NEXT_RUN]} (taken by the next run)`),
    );
    const status = h("span", { id: "send-status", role: "status" });
    const submit = h("button", { type: "submit", id: "send", class: "primary" }, "Send");
    const form = h(
      "form",
      { id: "send-form", "aria-label": "Send a message" },
      h("h2", {}, "Send a message"),
      text,
      h("div", { class: "send-row" }, kind, submit, status),
      h("p", { class: "hint" }, "Queued in the lane's inbox, as lane send does; a run takes it (without an open run, the next run takes every kind). Ctrl+Enter sends."),
    );
    const send = (): void => {
      const value = text.value.trim();
      if (value === "") {
        status.textContent = "Write a message first.";
        return;
      }
      submit.disabled = true;
      status.className = "";
      status.textContent = "sending…";
      const message = create(AgentMessageSchema, {
        message: { case: "user", value: { content: [{ block: { case: "text", value: { text: value } } }], timestamp: timestampNow() } },
      });
      client
        .enqueueMessage({
          laneId: this.laneId,
          kind: Number(kind.value) as QueueKind,
          item: { case: "message", value: message },
          requestId: crypto.randomUUID(),
        })
        .then(
          (answer) => {
            text.value = "";
            status.textContent = `queued at revision ${answer.revision}`;
          },
          (thrown: unknown) => {
            const error = laneErrorFrom(thrown);
            status.className = "error";
            status.replaceChildren(explain(error, this.laneId), " ", h("small", { class: "code" }, codeLine(error)));
          },
        )
        .finally(() => (submit.disabled = false));
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });
    text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        send();
      }
    });
    return form;
  }

  private exportLane(): void {
    this.say("exporting…");
    exportFile(client, this.laneId, this.signal).then(
      (blob) => {
        download(blob, `${this.laneId}.jsonl`);
        this.say(`Exported lane ${this.laneId} (${byteSize(blob.size)}): the file is in your downloads.`);
      },
      (thrown: unknown) => {
        const error = laneErrorFrom(thrown);
        this.say(`Export failed: ${explain(error, this.laneId)}`, error);
      },
    );
  }

  private deleteLane(): void {
    const open = this.snapshot?.operation !== undefined;
    const force = h("input", { id: "delete-force", type: "checkbox" });
    const status = h("p", { id: "delete-status", role: "status" });
    openDialog(
      "delete-dialog",
      `Delete lane ${this.laneId}?`,
      [
        h("p", {}, `This removes lane ${this.laneId} for good: its transcript, event log, usage, inbox and runs. Export it first to keep a copy.`),
        open ? h("label", { class: "check" }, force, " Also delete its open run (the driver's next command is refused)") : null,
        status,
      ],
      `Delete ${this.laneId}`,
      (dialog) => {
        status.className = "";
        status.textContent = "deleting…";
        client.deleteLane({ laneId: this.laneId, force: force.checked, requestId: crypto.randomUUID() }).then(
          (answer) => {
            dialog.close();
            this.say(`Deleted lane ${this.laneId} at revision ${answer.revision}.`);
          },
          (thrown: unknown) => {
            const error = laneErrorFrom(thrown);
            status.className = "error";
            status.replaceChildren(explain(error, this.laneId), " ", h("small", { class: "code" }, codeLine(error)));
          },
        );
      },
      { danger: true },
    );
  }
}

/** One event of a commit: its revision and kind, and the whole event as JSON on demand. */
function eventItem(event: HarnessEvent): HTMLElement {
  const json = (): string => prettyJson(toJsonString(HarnessEventSchema, event));
  const body = h("pre", { class: "json" });
  const details = h(
    "details",
    { "data-revision": event.revision.toString(), "data-kind": event.kind.case ?? "unknown" },
    h("summary", {}, h("span", { class: "rev" }, event.revision.toString()), " ", event.kind.case ?? "unknown", event.recovery ? " (recovery)" : ""),
    body,
    copyButton(json, "event JSON"),
  );
  // Rendered when opened: a commit may hold megabytes of results.
  details.addEventListener("toggle", () => {
    if (details.open && body.textContent === "") {
      body.textContent = json();
    }
  });
  return h("li", {}, details);
}
