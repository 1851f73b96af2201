/**
 * A run's timeline: its turns and tool calls as bars on one time axis (runs.ts derives them
 * from the event log). A call's bar runs from its start to when its result was staged; a
 * hatched tail runs on to when the result was placed — a call that finished early but waited
 * for an earlier one shows that wait at a glance, labelled with the call it waited for, and
 * the call that held the batch back is marked. Error results are red; a call or turn still
 * open runs to now.
 *
 * Plain elements positioned in percent of the run's span: they reflow at any width, and need
 * no charting library.
 */
import { h } from "./dom.js";
import { duration, relative } from "./format.js";
import { KIND_NAMES, RESULT_NAMES, badResult } from "./names.js";
import type { CallSpan, RunSpan, TurnSpan } from "./runs.js";

/** The timeline of `run` at `now` (for what is still open). */
export function renderTimeline(run: RunSpan, now = Date.now()): HTMLElement {
  const start = run.start;
  const end = Math.max(run.end ?? now, start + 1);
  const span = end - start;
  const at = (ms: number): number => Math.max(0, Math.min(100, ((ms - start) / span) * 100));
  const bar = (from: number, to: number, className: string, title: string): HTMLElement =>
    h("span", {
      class: `bar ${className}`,
      style: `left:${at(from).toFixed(2)}%;width:${Math.max(0, at(to) - at(from)).toFixed(2)}%`,
      title,
    });
  const holders = new Set(run.turns.flatMap((turn) => turn.calls.map((call) => call.heldBy)).filter((id) => id !== undefined));
  const rows: HTMLElement[] = [];
  for (const turn of run.turns) {
    rows.push(turnRow(turn, now, bar));
    for (const call of turn.calls) {
      rows.push(callRow(call, turn, now, bar, holders.has(call.id)));
    }
  }
  const status = run.end === undefined ? "open" : (RESULT_NAMES[run.status] ?? "ended");
  return h(
    "section",
    { id: "timeline", "data-run-id": run.id },
    h(
      "header",
      {},
      h("b", {}, `${KIND_NAMES[run.kind] ?? "operation"} ${run.id}`),
      ` · started ${relative(start, now)} · ${duration(end - start)} · `,
      h("span", { class: `badge ${run.end === undefined ? "s-running" : `r-${status}`}${badResult(run.status) ? " bad" : ""}` }, status),
      run.error === "" ? "" : h("span", { class: "error" }, ` ${run.error}`),
    ),
    h("div", { class: "axis", "aria-hidden": "true" }, ...[0, 25, 50, 75, 100].map((p) =>
      h("span", { style: `left:${p}%` }, p === 0 ? "0" : duration((span * p) / 100)))),
    rows.length === 0
      ? h("p", { class: "dim" }, "No turn yet.")
      : h("ol", { class: "rows" }, ...rows),
    h(
      "p",
      { class: "legend" },
      h("span", { class: "key turn" }), " turn (model, then tools) ",
      h("span", { class: "key run" }), " tool running ",
      h("span", { class: "key wait" }), " result waiting for placement ",
      h("span", { class: "key fail" }), " error",
    ),
  );
}

type Bar = (from: number, to: number, className: string, title: string) => HTMLElement;

function turnRow(turn: TurnSpan, now: number, bar: Bar): HTMLElement {
  const end = turn.end ?? now;
  const label = `turn ${turn.index}${turn.retries > 0 ? ` · ${turn.retries} retr${turn.retries === 1 ? "y" : "ies"}` : ""}`;
  const model = turn.settled ?? end;
  return h(
    "li",
    { class: "row turn", "data-turn-id": turn.id },
    h("span", { class: "label" }, label, h("small", {}, duration(end - turn.start))),
    h(
      "span",
      { class: "track" },
      bar(turn.start, model, "model", `model: ${duration(model - turn.start)}`),
      bar(model, end, "turn", `tools and placement: ${duration(end - model)}`),
    ),
  );
}

function callRow(call: CallSpan, turn: TurnSpan, now: number, bar: Bar, holder: boolean): HTMLElement {
  const start = call.start ?? turn.start;
  const staged = call.staged ?? now;
  const placed = call.placed ?? (call.staged === undefined ? staged : now);
  const state = call.staged === undefined ? "running" : call.placed === undefined ? "waiting" : "placed";
  const waited = placed - staged;
  const note =
    call.heldBy !== undefined ? `waited ${duration(waited)} for ${call.heldBy}` : holder ? "held the batch back" : state === "running" ? "running" : "";
  return h(
    "li",
    {
      class: `row call${call.error ? " error" : ""}${holder ? " holder" : ""}`,
      "data-call-id": call.id,
      "data-state": state,
      "data-held-by": call.heldBy,
    },
    h("span", { class: "label" }, `${call.name} ${call.id}`, h("small", {}, note === "" ? duration(staged - start) : `${duration(staged - start)} · ${note}`)),
    h(
      "span",
      { class: "track" },
      bar(start, staged, call.error ? "run fail" : "run", `${call.name}: ran ${duration(staged - start)}`),
      waited > 0 ? bar(staged, placed, "wait", `waited ${duration(waited)} for placement`) : null,
    ),
  );
}
