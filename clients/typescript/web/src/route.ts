/**
 * What the location's hash names:
 *
 * - `#/` (optionally `#/?status=failed&prefix=web-&since=1h&page=2`): the list of lanes, its
 *   filters in the query so an address keeps them (and the back button restores them);
 * - `#/lanes/ID`: a lane's page (the id percent-encoded), its transcript; `#/lanes/ID/timeline`,
 *   `/usage`, `/history` its other tabs, `#/lanes/ID/history?rev=N` the lane as it was at
 *   revision N.
 *
 * A lane address whose encoding is malformed (`#/lanes/%E0%A4%A`: no UTF-8 text decodes from
 * it) names no lane: the page says so rather than guess one.
 */
export const TABS = ["transcript", "timeline", "usage", "history"] as const;
export type Tab = (typeof TABS)[number];

export type Route =
  | { readonly page: "lanes"; readonly query: Readonly<Record<string, string>> }
  | {
      readonly page: "lane";
      readonly laneId: string;
      readonly tab: Tab;
      /** History only: the revision shown (undefined: the newest). */
      readonly revision?: bigint;
    }
  | { readonly page: "invalid"; readonly address: string };

/** The page `hash` names. */
export function routeOf(hash: string): Route {
  const [path = "", search = ""] = hash.replace(/^#/, "").split("?", 2);
  const query = Object.fromEntries(new URLSearchParams(search));
  const match = /^\/lanes\/([^/]+)(?:\/([a-z]+))?\/?$/.exec(path);
  if (match?.[1] === undefined) {
    return { page: "lanes", query };
  }
  let laneId: string;
  try {
    laneId = decodeURIComponent(match[1]);
  } catch {
    // URIError: a malformed escape, or one that is not UTF-8.
    return { page: "invalid", address: hash };
  }
  const tab = (TABS as readonly string[]).includes(match[2] ?? "") ? (match[2] as Tab) : "transcript";
  const rev = query.rev;
  if (tab === "history" && rev !== undefined && /^\d+$/.test(rev)) {
    return { page: "lane", laneId, tab, revision: BigInt(rev) };
  }
  return { page: "lane", laneId, tab };
}

/** The address of a lane's page (`tab`, and for the history a `revision`). */
export function laneHref(laneId: string, tab: Tab = "transcript", revision?: bigint): string {
  const base = `#/lanes/${encodeURIComponent(laneId)}`;
  if (tab === "transcript") {
    return base;
  }
  return revision === undefined ? `${base}/${tab}` : `${base}/${tab}?rev=${revision}`;
}

/** The address of the list of lanes with `query` (empty values left out). */
export function lanesHref(query: Readonly<Record<string, string>>): string {
  const kept = Object.entries(query).filter(([, value]) => value !== "");
  return kept.length === 0 ? "#/" : `#/?${new URLSearchParams(kept).toString()}`;
}
