/**
 * The service's web console, served at `/` of its HTTP port: `#/` lists the lanes, `#/lanes/ID`
 * is a lane's page with its tabs (route.ts). It talks Connect to the page's own origin. With
 * auth on, the service answers UNAUTHENTICATED and the page asks for a token, kept for the
 * browser tab (sessionStorage) and sent as a bearer token.
 *
 * A new address within the same page (the list's filters, a lane's tab or history revision)
 * updates that page in place; its streams go on.
 */
import type { LaneError } from "@lane/client";
import { h } from "./dom.js";
import { LanePage } from "./lane.js";
import { LanesPage } from "./lanes.js";
import { codeLine, explain } from "./refusals.js";
import { routeOf } from "./route.js";
import { setToken, token } from "./session.js";

const root = document.getElementById("app")!;
let current = new AbortController();
let shown: LanePage | LanesPage | undefined;

function askToken(error: LaneError | undefined): void {
  current.abort();
  shown = undefined;
  document.body.dataset.page = "token";
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    "aria-describedby": "token-help",
    "aria-label": "Token",
  });
  const wrong = error?.reason === "TOKEN_UNKNOWN";
  const form = h(
    "form",
    { id: "token-form" },
    h("h1", {}, wrong ? "That token is not accepted" : "Sign in with a token"),
    error === undefined
      ? null
      : h("p", { class: "error", id: "token-problem" }, explain(error), " ", h("small", { class: "code" }, codeLine(error))),
    h(
      "p",
      { id: "token-help" },
      "This service is shared: each token opens the lanes of one team. Paste the token you were given ",
      "(whoever runs the service sets them in LANE_AUTH_TOKENS). It is kept in this browser tab only, until you close it.",
    ),
    h("div", { class: "send-row" }, input, h("button", { type: "submit", class: "primary" }, "Use this token")),
    token() !== undefined ? h("p", {}, h("button", { type: "button", id: "token-forget" }, "Forget the token I gave")) : null,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    route();
  });
  form.querySelector("#token-forget")?.addEventListener("click", () => {
    setToken("");
    askToken(error);
  });
  root.replaceChildren(form);
  input.focus();
}

/** Show what the location's hash names, stopping the page shown before unless it is the one. */
function route(): void {
  const target = routeOf(location.hash);
  if (target.page === "lane" && shown instanceof LanePage && shown.laneId === target.laneId && !current.signal.aborted) {
    shown.show(target.tab, target.revision);
    return;
  }
  if (target.page === "lanes" && shown instanceof LanesPage && !current.signal.aborted) {
    shown.update(target.query);
    return;
  }
  current.abort();
  current = new AbortController();
  const signal = current.signal;
  shown = undefined;
  document.body.dataset.tab = "";
  if (target.page === "lane") {
    document.body.dataset.page = "lane";
    document.title = `${target.laneId} · lane service`;
    shown = new LanePage(root, target.laneId, target.tab, target.revision, { unauthenticated: askToken }, signal);
  } else if (target.page === "invalid") {
    document.body.dataset.page = "invalid";
    document.title = "lane service";
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
    document.title = "Lanes · lane service";
    shown = new LanesPage(root, target.query, askToken, signal);
  }
}

document.getElementById("change-token")!.addEventListener("click", () => askToken(undefined));
window.addEventListener("hashchange", route);
route();
