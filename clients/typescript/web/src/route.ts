/**
 * What the location's hash names: `#/lanes/ID` a lane's page (the id percent-encoded), anything
 * else the list of lanes. A lane address whose encoding is malformed (`#/lanes/%E0%A4%A`: no
 * UTF-8 text decodes from it) names no lane: the page says so rather than guess one.
 */
export type Route =
  | { readonly page: "lanes" }
  | { readonly page: "lane"; readonly laneId: string }
  | { readonly page: "invalid"; readonly address: string };

/** The page `hash` names. */
export function routeOf(hash: string): Route {
  const match = /^#\/lanes\/(.+)$/.exec(hash);
  if (match?.[1] === undefined) {
    return { page: "lanes" };
  }
  try {
    return { page: "lane", laneId: decodeURIComponent(match[1]) };
  } catch {
    // URIError: a malformed escape, or one that is not UTF-8.
    return { page: "invalid", address: hash };
  }
}
