/**
 * The live lane page: folds `WatchLane` with the client's watcher (the reducer the conformance
 * vectors test) and redraws after every update, so an assistant message streaming in grows with
 * each committed partial and gives way to the settled message in the redraw of the group that
 * settles it. The watcher resumes on its own after a dropped stream or a service restart;
 * meanwhile the page says `reconnecting · attempt n · cause`, and `live` again at the next
 * update or heartbeat. Abort calls AbortOperation on the open operation.
 */
import { Code } from "@connectrpc/connect";
import { LaneError, laneErrorFrom, watchLane, type LaneServiceClient, type LaneSnapshot } from "@lane/client";
import { ToolClock } from "./clock.js";
import { h } from "./dom.js";
import { countdown, renderOperation, renderQueue, renderTranscript, seconds } from "./render.js";

/** Elapsed times and a retry's countdown are redrawn this often, between updates. */
const TICK_MS = 200;

export interface LanePageHooks {
  /** The service wants a (different) bearer token. */
  unauthenticated(error: LaneError): void;
}

/** Show lane `laneId` in `root` until `signal` aborts. */
export async function showLane(
  root: HTMLElement,
  client: LaneServiceClient,
  laneId: string,
  hooks: LanePageHooks,
  signal: AbortSignal,
): Promise<void> {
  const clock = new ToolClock();
  const connection = h("span", { id: "connection", "data-state": "connecting" }, "connecting");
  const notice = h("p", { id: "notice", class: "error" });
  const body = h("div", { id: "lane-body" });
  const page = h(
    "main",
    { id: "lane", "data-lane-id": laneId },
    h("header", {}, h("a", { href: "#/" }, "lanes"), " / ", h("b", {}, laneId), " · ",
      h("span", { id: "revision" }, "…"), " · ", connection),
    notice,
    body,
  );
  root.replaceChildren(page);
  let snapshot: LaneSnapshot | undefined;

  const setConnection = (state: string, text: string): void => {
    connection.dataset.state = state;
    connection.textContent = text;
  };
  const abort = (operationId: string): void => {
    notice.textContent = "";
    client.abortOperation({ laneId, operationId }).catch((thrown: unknown) => {
      const error = laneErrorFrom(thrown);
      notice.textContent = `abort failed: ${error.codeName} ${error.reason}: ${error.message}`;
    });
  };
  const draw = (): void => {
    if (snapshot === undefined) {
      return;
    }
    const queue = renderQueue(snapshot);
    body.replaceChildren(
      renderTranscript(snapshot),
      renderOperation(snapshot, clock, abort),
      ...(queue === null ? [] : [queue]),
    );
    page.querySelector("#revision")!.textContent = `revision ${snapshot.revision}`;
    // Last: whoever waits for a revision finds the page drawn for it.
    page.dataset.revision = snapshot.revision.toString();
  };
  const ticker = setInterval(() => {
    for (const span of page.querySelectorAll<HTMLElement>(".elapsed")) {
      span.textContent = seconds(clock.elapsed(span.dataset.callId ?? ""));
    }
    for (const span of page.querySelectorAll<HTMLElement>(".countdown")) {
      span.textContent = countdown(Number(span.dataset.at));
    }
  }, TICK_MS);

  try {
    for await (const update of watchLane(client, laneId, {
      signal,
      heartbeats: true,
      connectTimeoutMs: 0, // a page rides outages out, saying "reconnecting" meanwhile
      onRetry: (info) => {
        const cause = info.error ? `${info.error.codeName}: ${info.error.message}` : "stream ended";
        setConnection(
          "reconnecting",
          info.mode === "resnapshot"
            ? `re-snapshotting · ${cause}`
            : `reconnecting · attempt ${info.attempt} · ${cause}`,
        );
      },
    })) {
      setConnection("live", "live");
      if (update.kind === "snapshot") {
        // How many snapshots the page has folded from: 1 unless it re-snapshotted (a resume
        // after a restart continues from its revision, without one).
        page.dataset.snapshots = String(Number(page.dataset.snapshots ?? 0) + 1);
      }
      if (update.kind !== "heartbeat") {
        snapshot = update.snapshot;
        clock.observe(snapshot, update.events);
        draw();
      }
    }
  } catch (thrown) {
    const error = laneErrorFrom(thrown);
    setConnection("failed", "stopped");
    if (error.code === Code.Unauthenticated) {
      hooks.unauthenticated(error);
      return;
    }
    body.replaceChildren(
      h("p", { id: "fatal", class: "error" }, `${error.codeName} ${error.reason}: ${error.message}`),
    );
  } finally {
    clearInterval(ticker);
  }
}
