// WebSocket URLs follow the page's scheme.
import assert from "node:assert/strict";
import { test } from "node:test";

import { wsUrl } from "../../../sfu_sidecar/web/js/wsurl.js";

test("https pages get wss:, http pages ws:, on the same host and port", () => {
  assert.equal(wsUrl("/api/clock/ws", "https://media.example:8443/publish?x=1"),
    "wss://media.example:8443/api/clock/ws");
  assert.equal(wsUrl("/api/dashboard/ws", "http://127.0.0.1:8080/dashboard"),
    "ws://127.0.0.1:8080/api/dashboard/ws");
  assert.equal(wsUrl("live", "http://h/captions/s/"), "ws://h/captions/s/live");
});
