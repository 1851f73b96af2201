/**
 * The web console's router (web/src/route.ts): the list with its filters, a lane's tabs and a
 * history revision; a malformed lane address names no lane, and is said so instead of
 * throwing URIError (which left the previous lane's page up, "live").
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { laneHref, lanesHref, routeOf } from "../web/src/route.js";

describe("the web console's routes", () => {
  it("names the list, a lane, or an address that names no lane", () => {
    assert.deepEqual(routeOf(""), { page: "lanes", query: {} });
    assert.deepEqual(routeOf("#/"), { page: "lanes", query: {} });
    assert.deepEqual(routeOf("#/lanes/"), { page: "lanes", query: {} });
    assert.deepEqual(routeOf("#/lanes/hello"), { page: "lane", laneId: "hello", tab: "transcript" });
    assert.deepEqual(routeOf("#/lanes/a%2Fb%20c%C3%A9"), { page: "lane", laneId: "a/b cé", tab: "transcript" });
    for (const malformed of ["#/lanes/%E0%A4%A", "#/lanes/%", "#/lanes/x%zz", "#/lanes/%C3"]) {
      assert.deepEqual(routeOf(malformed), { page: "invalid", address: malformed });
    }
  });

  it("keeps the list's filters and a lane's tab and revision", () => {
    assert.deepEqual(routeOf("#/?status=failed&prefix=web-&page=2"), {
      page: "lanes",
      query: { status: "failed", prefix: "web-", page: "2" },
    });
    assert.deepEqual(routeOf("#/lanes/a%2Fb/timeline"), { page: "lane", laneId: "a/b", tab: "timeline" });
    assert.deepEqual(routeOf("#/lanes/x/history?rev=42"), {
      page: "lane",
      laneId: "x",
      tab: "history",
      revision: 42n,
    });
    assert.deepEqual(routeOf("#/lanes/x/history?rev=nope"), { page: "lane", laneId: "x", tab: "history" });
    assert.deepEqual(routeOf("#/lanes/x/bogus"), { page: "lane", laneId: "x", tab: "transcript" });
    for (const [laneId, tab, revision] of [
      ["a/b c", "transcript", undefined],
      ["x", "usage", undefined],
      ["y?z", "history", 7n],
    ] as const) {
      assert.deepEqual(routeOf(laneHref(laneId, tab, revision)), {
        page: "lane",
        laneId,
        tab,
        ...(revision === undefined ? {} : { revision }),
      });
    }
    assert.equal(lanesHref({ status: "", prefix: "a b" }), "#/?prefix=a+b");
    assert.deepEqual(routeOf(lanesHref({ prefix: "a&b=c" })), { page: "lanes", query: { prefix: "a&b=c" } });
  });
});
