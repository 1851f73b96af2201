/**
 * Tokens over turns: a small bar chart, input and output side by side for each turn, the runs
 * set apart, then the same numbers per run as a table (the chart's exact values, for reading
 * and for screen readers). Drawn as inline SVG by hand: two kinds of bars and an axis are not
 * worth a charting library in the bundle.
 */
import type { LaneSnapshot } from "@lane/client";
import { h } from "./dom.js";
import { tokens } from "./format.js";
import type { RunSpan } from "./runs.js";

const SVG = "http://www.w3.org/2000/svg";
/** The most turns the chart shows (the newest). */
const MAX_TURNS = 80;

function svg(tag: string, attrs: Record<string, string | number>, ...children: (Node | string)[]): SVGElement {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) {
    element.setAttribute(name, String(value));
  }
  element.append(...children);
  return element;
}

/** The usage of `runs` (and the lane's totals from `snapshot`). */
export function renderUsage(runs: readonly RunSpan[], snapshot: LaneSnapshot): HTMLElement {
  const turns = runs.flatMap((run, r) => run.turns.map((turn) => ({ run: r, label: `${r + 1}.${turn.index}`, turn })));
  const shown = turns.slice(-MAX_TURNS);
  const top = shown.reduce((most, { turn }) => Math.max(most, Number(turn.input), Number(turn.output)), 0);
  const width = 640;
  const height = 180;
  const left = 44;
  const bottom = 22;
  const slot = shown.length === 0 ? 0 : (width - left) / shown.length;
  const barWidth = Math.max(1, Math.min(14, slot / 2 - 1));
  const y = (value: number): number => height - bottom - (top === 0 ? 0 : (value / top) * (height - bottom - 8));
  const parts: SVGElement[] = [
    svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis-line" }),
    svg("text", { x: left - 4, y: y(top) + 4, "text-anchor": "end", class: "tick" }, tokens(top)),
    svg("text", { x: left - 4, y: height - bottom, "text-anchor": "end", class: "tick" }, "0"),
  ];
  shown.forEach(({ run, label, turn }, i) => {
    const x = left + i * slot + slot / 2;
    if (i > 0 && shown[i - 1]!.run !== run) {
      parts.push(svg("line", { x1: left + i * slot, y1: 4, x2: left + i * slot, y2: height - bottom, class: "run-line" }));
    }
    parts.push(
      svg("rect", { x: x - barWidth - 0.5, y: y(Number(turn.input)), width: barWidth, height: height - bottom - y(Number(turn.input)), class: "in" },
        svg("title", {}, `turn ${label}: ${turn.input} tokens in`)),
      svg("rect", { x: x + 0.5, y: y(Number(turn.output)), width: barWidth, height: height - bottom - y(Number(turn.output)), class: "out" },
        svg("title", {}, `turn ${label}: ${turn.output} tokens out`)),
    );
    if (shown.length <= 24 || i % Math.ceil(shown.length / 24) === 0) {
      parts.push(svg("text", { x, y: height - 6, "text-anchor": "middle", class: "tick" }, label));
    }
  });
  const totals = snapshot.stats?.usage;
  return h(
    "section",
    { id: "usage" },
    h(
      "p",
      { class: "totals" },
      `Lane total: ${tokens(totals?.input ?? 0n)} in · ${tokens(totals?.output ?? 0n)} out`,
      totals?.cost !== undefined && totals.cost.total > 0 ? ` · cost ${totals.cost.total.toFixed(4)}` : "",
    ),
    shown.length === 0
      ? h("p", { class: "dim" }, "No turn has recorded usage yet.")
      : h(
          "figure",
          {},
          svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "Tokens in and out per turn", class: "chart" }, ...parts) as unknown as HTMLElement,
          h("figcaption", {}, h("span", { class: "key in" }), " in ", h("span", { class: "key out" }), " out · per turn (run.turn)",
            turns.length > shown.length ? ` · the newest ${shown.length} of ${turns.length} turns` : ""),
        ),
    h(
      "table",
      { class: "usage-table" },
      h("thead", {}, h("tr", {}, ...["Run", "Turns", "In", "Out"].map((name) => h("th", { scope: "col" }, name)))),
      h(
        "tbody",
        {},
        ...runs.map((run, r) =>
          h(
            "tr",
            { "data-run-id": run.id },
            h("th", { scope: "row", "data-label": "Run" }, `${r + 1} · ${run.id.slice(0, 8)}`),
            h("td", { "data-label": "Turns", class: "num" }, String(run.turns.length)),
            h("td", { "data-label": "In", class: "num" }, tokens(run.input)),
            h("td", { "data-label": "Out", class: "num" }, tokens(run.output)),
          ),
        ),
      ),
    ),
  );
}
