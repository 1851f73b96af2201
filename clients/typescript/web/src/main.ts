/**
 * The service's web view, served at `/` of its HTTP port: `#/` lists the lanes, `#/lanes/ID`
 * is a lane's live page (route.ts). It talks Connect to the page's own origin. With auth on, the service
 * answers UNAUTHENTICATED and the page asks for a token, kept for the browser tab
 * (sessionStorage) and sent as a bearer token.
 */
import { createLaneClient, type LaneError } from "@lane/client";
import { h } from "./dom.js";
import { showLane } from "./lane.js";
import { showLanes } from "./lanes.js";
import { routeOf } from "./route.js";

const TOKEN_KEY = "lane-token";
const root = document.getElementById("app")!;
const client = createLaneClient(new URL(".", location.href).href, {
  token: () => sessionStorage.getItem(TOKEN_KEY) ?? undefined,
});
let current = new AbortController();

function askToken(error: LaneError | undefined): void {
  document.body.dataset.page = "token";
  const input = h("input", { id: "token", type: "password", autocomplete: "off", placeholder: "token" });
  const form = h(
    "form",
    { id: "token-form" },
    h("h1", {}, "Token"),
    error ? h("p", { class: "error" }, `${error.codeName}: ${error.message}`) : null,
    h("p", {}, "The service has auth on: enter a bearer token. It is kept for this tab only."),
    input,
    " ",
    h("button", { type: "submit" }, "Use token"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    route();
  });
  root.replaceChildren(form);
  input.focus();
}

/** Show what the location's hash names, stopping the page shown before. */
function route(): void {
  current.abort();
  current = new AbortController();
  const signal = current.signal;
  const target = routeOf(location.hash);
  const failed = (thrown: unknown): void => {
    root.replaceChildren(h("p", { id: "fatal", class: "error" }, String(thrown)));
  };
  if (target.page === "lane") {
    document.body.dataset.page = "lane";
    showLane(root, client, target.laneId, { unauthenticated: askToken }, signal).catch(failed);
  } else if (target.page === "invalid") {
    // Nothing of the page before stays: it would still say "live" about another lane.
    document.body.dataset.page = "invalid";
    root.replaceChildren(
      h(
        "main",
        { id: "bad-address" },
        h("p", { class: "error" }, `not a valid lane address: ${target.address}`),
        h("p", {}, h("a", { href: "#/" }, "all lanes")),
      ),
    );
  } else {
    document.body.dataset.page = "lanes";
    showLanes(root, client, askToken, signal).catch(failed);
  }
}

document.getElementById("change-token")!.addEventListener("click", () => {
  current.abort();
  askToken(undefined);
});
window.addEventListener("hashchange", route);
route();
