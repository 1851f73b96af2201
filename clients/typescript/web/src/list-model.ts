/**
 * The lane list's filters, order and pages, over the summaries the WatchLanes stream keeps
 * (no DOM: the node tests check it). The id prefix goes to the service (the stream follows
 * only those lanes); status, last result and activity window are applied here, so the status
 * counts stay in view and a filter changes the rows at once, without a new stream.
 */
import type { LaneSummary } from "@lane/client";
import { RESULT_NAMES, STATUS_NAMES } from "./names.js";

/** Rows per page. */
export const PAGE_ROWS = 50;

/** Activity windows, by their query spelling. */
export const WINDOWS: Readonly<Record<string, number>> = {
  "5m": 5 * 60_000,
  "1h": 60 * 60_000,
  "24h": 24 * 60 * 60_000,
};

export interface ListFilter {
  /** Lane id prefix (the stream's). */
  readonly prefix: string;
  /** Status names (STATUS_NAMES); empty: every status. */
  readonly statuses: ReadonlySet<string>;
  /** Last result name (RESULT_NAMES), "none" (no run ended yet), or "" for any. */
  readonly result: string;
  /** An activity window of WINDOWS, or "" for any time. */
  readonly since: string;
  /** "activity" (most recent first) or "id". */
  readonly sort: "activity" | "id";
  /** 1-based. */
  readonly page: number;
}

/** The filter an address's query names. */
export function filterOf(query: Readonly<Record<string, string>>): ListFilter {
  const statuses = new Set(
    (query.status ?? "").split(",").filter((name) => Object.values(STATUS_NAMES).includes(name)),
  );
  const result = query.result ?? "";
  const page = Number(query.page ?? "1");
  return {
    prefix: query.prefix ?? "",
    statuses,
    result: result === "none" || Object.values(RESULT_NAMES).includes(result) ? result : "",
    since: (query.since ?? "") in WINDOWS ? (query.since ?? "") : "",
    sort: query.sort === "id" ? "id" : "activity",
    page: Number.isInteger(page) && page >= 1 ? page : 1,
  };
}

/** The query of `filter` (what `filterOf` reads back). */
export function queryOf(filter: ListFilter): Record<string, string> {
  return {
    prefix: filter.prefix,
    status: [...filter.statuses].join(","),
    result: filter.result,
    since: filter.since,
    sort: filter.sort === "id" ? "id" : "",
    page: filter.page > 1 ? String(filter.page) : "",
  };
}

/** When the lane was last active (ms, with the microseconds as a fraction, so lanes active
 *  within the same millisecond keep their order; 0 when unknown). */
export function activityMs(lane: LaneSummary): number {
  const time = lane.lastActivityTime;
  return time === undefined ? 0 : Number(time.seconds) * 1000 + time.nanos / 1e6;
}

/** Whether `lane` passes every filter but the status one. */
function passesOthers(lane: LaneSummary, filter: ListFilter, now: number): boolean {
  if (filter.result !== "") {
    const result = RESULT_NAMES[lane.lastResultStatus] ?? "none";
    if (result !== filter.result) {
      return false;
    }
  }
  const window = WINDOWS[filter.since];
  return window === undefined || activityMs(lane) >= now - window;
}

export interface ListView {
  /** The rows of the page shown. */
  readonly rows: readonly LaneSummary[];
  /** How many lanes pass the filters (all pages). */
  readonly matching: number;
  /** The page shown (clamped to the pages there are) and how many there are. */
  readonly page: number;
  readonly pages: number;
  /** Per status name, how many lanes pass the other filters. */
  readonly counts: Readonly<Record<string, number>>;
}

/** The page of `lanes` that `filter` shows. */
export function viewOf(lanes: Iterable<LaneSummary>, filter: ListFilter, now = Date.now()): ListView {
  const counts: Record<string, number> = {};
  const matching: LaneSummary[] = [];
  for (const lane of lanes) {
    if (!passesOthers(lane, filter, now)) {
      continue;
    }
    const status = STATUS_NAMES[lane.status] ?? "idle";
    counts[status] = (counts[status] ?? 0) + 1;
    if (filter.statuses.size === 0 || filter.statuses.has(status)) {
      matching.push(lane);
    }
  }
  if (filter.sort === "id") {
    matching.sort((a, b) => (a.laneId < b.laneId ? -1 : a.laneId > b.laneId ? 1 : 0));
  } else {
    // The most recently active first, ties by id (as ListLanes' LANE_ORDER_LAST_ACTIVITY).
    matching.sort((a, b) => activityMs(b) - activityMs(a) || (a.laneId < b.laneId ? -1 : 1));
  }
  const pages = Math.max(1, Math.ceil(matching.length / PAGE_ROWS));
  const page = Math.min(filter.page, pages);
  const start = (page - 1) * PAGE_ROWS;
  return { rows: matching.slice(start, start + PAGE_ROWS), matching: matching.length, page, pages, counts };
}
