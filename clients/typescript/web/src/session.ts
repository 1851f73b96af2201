/**
 * The browser tab's token and the service's client. With auth on, the service answers
 * UNAUTHENTICATED and the page asks for a bearer token, kept for the tab only
 * (sessionStorage) and sent on every call, the upload of an import included.
 */
import { createLaneClient, type LaneServiceClient } from "@lane/client";

const TOKEN_KEY = "lane-token";

/** The token the tab holds, if any. */
export function token(): string | undefined {
  return sessionStorage.getItem(TOKEN_KEY) ?? undefined;
}

/** Keep `value` as the tab's token (empty: forget it). */
export function setToken(value: string): void {
  if (value === "") {
    sessionStorage.removeItem(TOKEN_KEY);
  } else {
    sessionStorage.setItem(TOKEN_KEY, value);
  }
}

/** The `authorization` header of the tab's token (none without one). */
export function authorization(): Record<string, string> {
  const held = token();
  return held === undefined ? {} : { authorization: `Bearer ${held}` };
}

/** The page's own origin and path: the service's HTTP port. */
export const BASE_URL = new URL(".", location.href).href;

/** LaneService over Connect to the page's own origin, with the tab's token. */
export const client: LaneServiceClient = createLaneClient(BASE_URL, { token });
