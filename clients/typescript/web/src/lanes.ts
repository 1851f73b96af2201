/**
 * The list of lanes, live: one `WatchLanes` stream (the TypeScript client's `watchLanes`) keeps
 * the summary of every lane whose id starts with the prefix typed, and each change redraws the
 * rows it touches — no stream per row, no polling. Status, last result and activity window
 * filter the rows here (list-model.ts), sorted by last activity (or id), 50 to a page.
 *
 * Each row: the lane (a link), its status, its open run and when it started, its last activity
 * and last run's result (times relative, absolute on hover), tokens used, tool calls running,
 * revision. The keyboard: `/` goes to the filter, the arrow keys (or j/k) move between rows,
 * Enter opens one; `[` and `]` turn the page. The filters live in the address (list-model.ts).
 */
import type { LaneSummary, LaneError } from "@lane/client";
import { Code } from "@connectrpc/connect";
import { laneErrorFrom, watchLanes } from "@lane/client";
import { button, h, openDialog } from "./dom.js";
import { msOf, refreshTimes, timeElement, tokens } from "./format.js";
import { filterOf, PAGE_ROWS, queryOf, viewOf, type ListFilter } from "./list-model.js";
import { badResult, KIND_NAMES, RESULT_NAMES, STATUS_NAMES } from "./names.js";
import { codeLine, explain } from "./refusals.js";
import { laneHref, lanesHref } from "./route.js";
import { client } from "./session.js";
import { exportedLaneId, importFile } from "./transfer.js";

const SINCE_LABELS: Readonly<Record<string, string>> = { "": "any time", "5m": "last 5 min", "1h": "last hour", "24h": "last 24 h" };

/** The list page; `update` takes a new address's filters without a new stream unless the
 *  prefix changed. */
export class LanesPage {
  private filter: ListFilter;
  private lanes: ReadonlyMap<string, LaneSummary> = new Map();
  private stream = new AbortController();
  private drawPending = false;
  private readonly page: HTMLElement;
  private readonly rows = h("tbody", {});
  private readonly notice = h("p", { id: "notice", class: "error", role: "alert" });
  private readonly connection = h("span", { id: "list-connection", "data-state": "connecting" }, "connecting…");
  private readonly summary = h("p", { id: "list-summary", "aria-live": "polite" }, "");
  private readonly chips = h("div", { id: "filter-status", class: "chips", role: "group", "aria-label": "Status" });
  private readonly prefixInput = h("input", {
    id: "filter-prefix",
    type: "search",
    placeholder: "lane id starts with…",
    autocomplete: "off",
    spellcheck: "false",
    "aria-label": "Lane id starts with",
  });
  private readonly pager = h("nav", { id: "pager", "aria-label": "Pages" });
  private readonly ticker: ReturnType<typeof setInterval>;
  private readonly keys = (event: KeyboardEvent): void => this.onKey(event);

  constructor(
    root: HTMLElement,
    query: Readonly<Record<string, string>>,
    private readonly unauthenticated: (error: LaneError) => void,
    private readonly signal: AbortSignal,
  ) {
    this.filter = filterOf(query);
    this.prefixInput.value = this.filter.prefix;
    let typing: ReturnType<typeof setTimeout> | undefined;
    this.prefixInput.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => this.change({ prefix: this.prefixInput.value.trim(), page: 1 }), 250);
    });
    this.page = h(
      "main",
      { id: "lanes" },
      h(
        "header",
        { class: "page-head" },
        h("h1", {}, "Lanes"),
        this.connection,
        button({ id: "import-open" }, "Import…", () => this.openImport()),
      ),
      this.notice,
      h(
        "form",
        { id: "filters", role: "search", "aria-label": "Filter lanes" },
        h("label", { class: "prefix" }, h("span", { class: "label" }, "Lane id"), this.prefixInput),
        this.chips,
        this.select("filter-result", "Last run", { "": "any", ...valuesOf(RESULT_NAMES), none: "none yet" }, this.filter.result, (value) =>
          this.change({ result: value, page: 1 }),
        ),
        this.select("filter-since", "Active", SINCE_LABELS, this.filter.since, (value) => this.change({ since: value, page: 1 })),
        this.select("filter-sort", "Sort", { "": "last activity", id: "lane id" }, this.filter.sort === "id" ? "id" : "", (value) =>
          this.change({ sort: value === "id" ? "id" : "activity", page: 1 }),
        ),
      ),
      this.summary,
      h(
        "table",
        { id: "lane-table" },
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...["Lane", "Status", "Open run", "Last activity", "Last run", "Tokens", "Tools", "Revision"].map((name) =>
              h("th", { scope: "col" }, name),
            ),
          ),
        ),
        this.rows,
      ),
      this.pager,
    );
    root.replaceChildren(this.page);
    document.addEventListener("keydown", this.keys);
    this.ticker = setInterval(() => refreshTimes(this.page), 1000);
    signal.addEventListener("abort", () => {
      this.stream.abort();
      clearInterval(this.ticker);
      document.removeEventListener("keydown", this.keys);
    });
    this.follow();
  }

  /** Take the filters of a new address (the list's own link, the back button). */
  update(query: Readonly<Record<string, string>>): void {
    const next = filterOf(query);
    const restart = next.prefix !== this.filter.prefix;
    this.filter = next;
    this.prefixInput.value = next.prefix;
    for (const [id, value] of [
      ["filter-result", next.result],
      ["filter-since", next.since],
      ["filter-sort", next.sort === "id" ? "id" : ""],
    ] as const) {
      (this.page.querySelector(`#${id}`) as HTMLSelectElement).value = value;
    }
    if (restart) {
      this.follow();
    } else {
      this.draw();
    }
  }

  private change(patch: Partial<ListFilter>): void {
    const next = { ...this.filter, ...patch };
    // The address keeps the filters; replaceState fires no hashchange, so no new page is made.
    history.replaceState(null, "", lanesHref(queryOf(next)));
    this.update(queryOf(next));
  }

  private select(
    id: string,
    label: string,
    options: Readonly<Record<string, string>>,
    value: string,
    changed: (value: string) => void,
  ): HTMLElement {
    const select = h("select", { id }, ...Object.entries(options).map(([key, text]) => h("option", { value: key }, text)));
    select.value = value;
    select.addEventListener("change", () => changed(select.value));
    return h("label", {}, h("span", { class: "label" }, label), select);
  }

  /** (Re)start the stream for the current prefix. */
  private follow(): void {
    this.stream.abort();
    this.stream = new AbortController();
    const signal = this.stream.signal;
    this.lanes = new Map();
    this.page.dataset.loaded = "false";
    this.setConnection("connecting", "connecting…");
    this.draw();
    (async () => {
      for await (const update of watchLanes(client, {
        prefix: this.filter.prefix,
        signal,
        onRetry: (info) => {
          const cause = info.error === undefined ? "stream ended" : explain(info.error);
          this.setConnection("reconnecting", `reconnecting · attempt ${info.attempt} · ${cause}`);
        },
      })) {
        this.lanes = update.lanes;
        if (update.kind === "listing") {
          this.page.dataset.loaded = "true";
        }
        this.setConnection("live", "live");
        this.notice.textContent = "";
        this.scheduleDraw();
      }
    })().catch((thrown: unknown) => {
      if (signal.aborted) {
        return;
      }
      const error = laneErrorFrom(thrown);
      if (error.code === Code.Unauthenticated) {
        this.unauthenticated(error);
        return;
      }
      this.setConnection("failed", "stopped");
      this.notice.replaceChildren(explain(error), " ", h("small", { class: "code" }, codeLine(error)));
    });
  }

  private setConnection(state: string, text: string): void {
    this.connection.dataset.state = state;
    this.connection.textContent = text;
  }

  private scheduleDraw(): void {
    if (this.drawPending) {
      return;
    }
    this.drawPending = true;
    // Changes landing together redraw once (and a hidden tab does not redraw at all).
    requestAnimationFrame(() => {
      this.drawPending = false;
      if (!this.signal.aborted) {
        this.draw();
      }
    });
  }

  private draw(): void {
    const view = viewOf(this.lanes.values(), this.filter);
    const focused = (document.activeElement as HTMLElement | null)?.closest<HTMLElement>("tr.lane")?.dataset.laneId;
    this.rows.replaceChildren(...view.rows.map(row));
    if (focused !== undefined) {
      this.rowLink(focused)?.focus();
    }
    this.drawChips(view.counts);
    const first = view.matching === 0 ? 0 : (view.page - 1) * PAGE_ROWS + 1;
    const last = (view.page - 1) * PAGE_ROWS + view.rows.length;
    const loaded = this.page.dataset.loaded === "true";
    this.summary.textContent = !loaded
      ? "loading the lanes…"
      : view.matching === 0
        ? this.lanes.size === 0
          ? this.filter.prefix === ""
            ? "No lanes yet. Start one (lane demo --lane hello), or import an export file."
            : `No lane id starts with "${this.filter.prefix}".`
          : `None of the ${this.lanes.size} lanes matches these filters.`
        : `${first}–${last} of ${view.matching} lanes${view.matching === this.lanes.size ? "" : ` (${this.lanes.size} in all)`}`;
    this.page.dataset.count = String(view.matching);
    this.page.dataset.page = String(view.page);
    this.pager.replaceChildren(
      button({ id: "page-prev", disabled: view.page <= 1 ? "" : undefined, "aria-keyshortcuts": "[" }, "← Newer", () =>
        this.change({ page: view.page - 1 }),
      ),
      h("span", { id: "page-of" }, `page ${view.page} of ${view.pages}`),
      button({ id: "page-next", disabled: view.page >= view.pages ? "" : undefined, "aria-keyshortcuts": "]" }, "Older →", () =>
        this.change({ page: view.page + 1 }),
      ),
    );
  }

  private drawChips(counts: Readonly<Record<string, number>>): void {
    const chips = Object.values(STATUS_NAMES).map((name) => {
      const on = this.filter.statuses.has(name);
      return button(
        { class: `chip s-${name.replace(" ", "-")}`, "aria-pressed": String(on), "data-status": name },
        [name, " ", h("span", { class: "count" }, String(counts[name] ?? 0))],
        () => {
          const statuses = new Set(this.filter.statuses);
          if (on) {
            statuses.delete(name);
          } else {
            statuses.add(name);
          }
          this.change({ statuses, page: 1 });
          this.chips.querySelector<HTMLElement>(`[data-status="${name}"]`)?.focus();
        },
      );
    });
    this.chips.replaceChildren(h("span", { class: "label" }, "Status"), ...chips);
  }

  private rowLink(laneId: string): HTMLAnchorElement | null {
    for (const link of this.rows.querySelectorAll<HTMLAnchorElement>("tr.lane a.lane-link")) {
      if (link.closest<HTMLElement>("tr")?.dataset.laneId === laneId) {
        return link;
      }
    }
    return null;
  }

  private onKey(event: KeyboardEvent): void {
    if (event.altKey || event.ctrlKey || event.metaKey || document.querySelector("dialog[open]") !== null) {
      return;
    }
    const target = event.target as HTMLElement;
    const typing = target.matches("input, select, textarea");
    if (event.key === "/" && !typing) {
      event.preventDefault();
      this.prefixInput.focus();
      return;
    }
    if (typing) {
      if (event.key === "ArrowDown" && target === this.prefixInput) {
        event.preventDefault();
        this.rows.querySelector<HTMLElement>("a.lane-link")?.focus();
      }
      return;
    }
    const links = [...this.rows.querySelectorAll<HTMLElement>("a.lane-link")];
    const at = links.indexOf(document.activeElement as HTMLElement);
    const move = (index: number): void => {
      event.preventDefault();
      links[Math.max(0, Math.min(links.length - 1, index))]?.focus();
    };
    switch (event.key) {
      case "ArrowDown":
      case "j":
        move(at < 0 ? 0 : at + 1);
        break;
      case "ArrowUp":
      case "k":
        move(at < 0 ? 0 : at - 1);
        break;
      case "Home":
        if (at >= 0) move(0);
        break;
      case "End":
        if (at >= 0) move(links.length - 1);
        break;
      case "]":
        this.page.querySelector<HTMLButtonElement>("#page-next:not([disabled])")?.click();
        break;
      case "[":
        this.page.querySelector<HTMLButtonElement>("#page-prev:not([disabled])")?.click();
        break;
      default:
        break;
    }
  }

  /** The import dialog: an export file and the new lane's id; the lane's page once imported. */
  private openImport(): void {
    const file = h("input", { id: "import-file", type: "file", accept: ".jsonl,application/jsonl,application/json,text/plain", required: "" });
    const laneId = h("input", { id: "import-lane-id", type: "text", required: "", autocomplete: "off", spellcheck: "false" });
    const status = h("p", { id: "import-status", role: "status" });
    file.addEventListener("change", () => {
      const chosen = file.files?.[0];
      if (chosen !== undefined && laneId.value === "") {
        exportedLaneId(chosen).then((id) => {
          if (id !== undefined && laneId.value === "") {
            laneId.value = `${id}-copy`;
          }
        }, () => {});
      }
    });
    openDialog(
      "import-dialog",
      "Import a lane",
      [
        h("p", {}, "A lane's export file (its Export button, or lane export) comes back in as a new lane."),
        h("label", {}, h("span", { class: "label" }, "Export file"), file),
        h("label", {}, h("span", { class: "label" }, "New lane id"), laneId),
        status,
      ],
      "Import",
      (dialog) => {
        const chosen = file.files?.[0];
        if (chosen === undefined) {
          status.textContent = "Choose an export file first.";
          return;
        }
        status.className = "";
        status.textContent = "importing…";
        importFile(chosen, laneId.value.trim(), this.signal).then(
          (imported) => {
            dialog.close();
            location.hash = laneHref(imported.laneId);
          },
          (thrown: unknown) => {
            const error = laneErrorFrom(thrown);
            status.className = "error";
            status.replaceChildren(explain(error, laneId.value.trim()), " ", h("small", { class: "code" }, codeLine(error)));
          },
        );
      },
    );
  }
}

function valuesOf(names: Readonly<Record<number, string>>): Record<string, string> {
  return Object.fromEntries(Object.values(names).map((name) => [name, name]));
}

/** One lane's row. */
function row(lane: LaneSummary): HTMLElement {
  const status = STATUS_NAMES[lane.status] ?? "idle";
  const usage = lane.usageTotals;
  const result = RESULT_NAMES[lane.lastResultStatus];
  const cell = (label: string, ...children: (Node | string)[]): HTMLElement => h("td", { "data-label": label }, ...children);
  return h(
    "tr",
    { class: "lane", "data-lane-id": lane.laneId, "data-status": status },
    h("th", { scope: "row", "data-label": "Lane" }, h("a", { class: "lane-link", href: laneHref(lane.laneId) }, lane.laneId)),
    cell(
      "Status",
      h("span", { class: `badge s-${status.replace(" ", "-")}` }, status),
      lane.faulted && status !== "faulted" ? h("span", { class: "badge s-faulted", title: "this lane faulted once" }, "faulted") : "",
    ),
    cell(
      "Open run",
      ...(lane.operationId === ""
        ? [h("span", { class: "dim" }, "—")]
        : [`${KIND_NAMES[lane.operationKind] ?? "operation"} · started `, timeElement(msOf(lane.operationStartedTime))]),
    ),
    cell("Last activity", timeElement(msOf(lane.lastActivityTime))),
    cell(
      "Last run",
      result === undefined
        ? h("span", { class: "dim" }, "—")
        : h("span", { class: `badge r-${result}${badResult(lane.lastResultStatus) ? " bad" : ""}` }, result),
    ),
    cell(
      "Tokens",
      usage === undefined || (usage.input === 0n && usage.output === 0n)
        ? h("span", { class: "dim" }, "—")
        : `${tokens(usage.input)} in · ${tokens(usage.output)} out`,
    ),
    cell("Tools", lane.runningToolCalls > 0 ? h("span", { class: "running-tools" }, `${lane.runningToolCalls} running`) : h("span", { class: "dim" }, "—")),
    h("td", { "data-label": "Revision", class: "num" }, lane.revision.toString()),
  );
}
