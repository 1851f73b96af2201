/**
 * The web view's router (web/src/route.ts): a malformed lane address names no lane, and is
 * said so instead of throwing URIError (which left the previous lane's page up, "live").
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { routeOf } from "../web/src/route.js";

describe("the web view's routes", () => {
  it("names the list, a lane, or an address that names no lane", () => {
    assert.deepEqual(routeOf(""), { page: "lanes" });
    assert.deepEqual(routeOf("#/"), { page: "lanes" });
    assert.deepEqual(routeOf("#/lanes/"), { page: "lanes" });
    assert.deepEqual(routeOf("#/lanes/hello"), { page: "lane", laneId: "hello" });
    assert.deepEqual(routeOf("#/lanes/a%2Fb%20c%C3%A9"), { page: "lane", laneId: "a/b cé" });
    for (const malformed of ["#/lanes/%E0%A4%A", "#/lanes/%", "#/lanes/x%zz", "#/lanes/%C3"]) {
      assert.deepEqual(routeOf(malformed), { page: "invalid", address: malformed });
    }
  });
});
