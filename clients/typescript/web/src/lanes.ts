/**
 * The list of lanes (ListLanes, every page), each with its open operation; refreshed every
 * two seconds while shown. A lane links to its live page.
 */
import { Code } from "@connectrpc/connect";
import { LaneError, OperationStatus, laneErrorFrom, type LaneServiceClient, type LaneSummary } from "@lane/client";
import { h } from "./dom.js";

const REFRESH_MS = 2_000;

async function allLanes(client: LaneServiceClient, signal: AbortSignal): Promise<LaneSummary[]> {
  const lanes: LaneSummary[] = [];
  let pageToken = "";
  do {
    const page = await client.listLanes({ pageSize: 1000, pageToken }, { signal });
    lanes.push(...page.lanes);
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  return lanes;
}

function row(lane: LaneSummary): HTMLElement {
  const aborting = lane.operationStatus === OperationStatus.ABORTING;
  return h(
    "tr",
    { class: "lane", "data-lane-id": lane.laneId },
    h("td", {}, h("a", { href: `#/lanes/${encodeURIComponent(lane.laneId)}` }, lane.laneId)),
    h("td", { class: "num" }, lane.revision.toString()),
    h(
      "td",
      { class: aborting ? "error" : undefined },
      lane.operationId ? `${lane.operationId} · ${aborting ? "aborting" : "open"}` : "—",
    ),
  );
}

/** Show the lanes in `root` until `signal` aborts. */
export async function showLanes(
  root: HTMLElement,
  client: LaneServiceClient,
  unauthenticated: (error: LaneError) => void,
  signal: AbortSignal,
): Promise<void> {
  const rows = h("tbody", {});
  const notice = h("p", { id: "notice", class: "error" });
  const page = h(
    "main",
    { id: "lanes" },
    h("h1", {}, "Lanes"),
    notice,
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "lane"), h("th", {}, "revision"), h("th", {}, "open operation"))), rows),
  );
  root.replaceChildren(page);
  while (!signal.aborted) {
    try {
      const lanes = await allLanes(client, signal);
      rows.replaceChildren(...lanes.map(row));
      notice.textContent = "";
      page.dataset.loaded = "true";
    } catch (thrown) {
      if (signal.aborted) {
        return;
      }
      const error = laneErrorFrom(thrown);
      if (error.code === Code.Unauthenticated) {
        unauthenticated(error);
        return;
      }
      notice.textContent = `${error.codeName}: ${error.message} (retrying)`;
    }
    await new Promise((resolve) => setTimeout(resolve, REFRESH_MS));
  }
}
