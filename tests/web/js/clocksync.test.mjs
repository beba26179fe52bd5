// The JS clock join against proto/vectors/clock_exchange.json, the same vectors pytest uses.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import {
  ClockJoin, ClockSyncError, browserNowNs, joinInRounds, parseResponse, request, sampleOf,
} from "../../../sfu_sidecar/web/js/clocksync.js";
import { decode, encode } from "../../../sfu_sidecar/web/js/msgpack.js";

// Epoch values in these vectors are multiples of 512 ns, so JSON numbers carry them exactly.
const V = JSON.parse(readFileSync(fileURLToPath(new URL("../../../proto/vectors/clock_exchange.json",
  import.meta.url)), "utf8"));
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const bigMap = (m) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, typeof v === "number" ? BigInt(v) : v]));

for (const vec of V.samples) {
  test(`sample ${vec.name}`, () => {
    const s = sampleOf(BigInt(vec.t1), BigInt(vec.t2), BigInt(vec.t3), BigInt(vec.t4));
    assert.equal(s.offsetNs, BigInt(vec.offset_ns));
    assert.equal(s.rttNs, BigInt(vec.rtt_ns));
  });
}

for (const vec of V.windows) {
  test(`window ${vec.name}`, () => {
    const join = new ClockJoin(vec.window);
    for (const [t1, t2, t3, t4] of vec.exchanges) {
      join.response({ t1: BigInt(t1), t2: BigInt(t2), t3: BigInt(t3) }, BigInt(t4));
    }
    assert.equal(join.samples.length, vec.accepted);
    const report = join.report();
    assert.deepEqual(report, vec.report === null ? null : bigMap(vec.report));
  });
}

for (const vec of V.messages) {
  test(`message ${vec.name} encodes like Python`, () => {
    assert.equal(hex(encode(bigMap(vec.map))), vec.msgpack_hex);
    const back = decode(new Uint8Array(Buffer.from(vec.msgpack_hex, "hex")));
    assert.deepEqual(bigMap(Object.fromEntries(Object.entries(back).map(([k, v]) => [k, typeof v === "bigint" ? v : v]))),
      bigMap(vec.map));
    if (vec.map.type === "clock_resp") assert.deepEqual(parseResponse(back), bigMap(vec.map));
    if (vec.map.type === "clock_req") assert.deepEqual(request(BigInt(vec.map.t1)), bigMap(vec.map));
  });
}

test("parseResponse refuses what the spec refuses", () => {
  for (const bad of [null, { type: "clock_req", t1: 1 }, { type: "clock_resp", t1: 1, t2: 2 },
    { type: "clock_resp", t1: 1.5, t2: 2, t3: 3 }, { type: "clock_resp", t1: true, t2: 2, t3: 3 }]) {
    assert.throws(() => parseResponse(bad), ClockSyncError);
  }
});

test("browser clock is performance.timeOrigin + performance.now() in ns", () => {
  const perf = { timeOrigin: 1764489600123.456, now: () => 1500.25 };
  assert.equal(browserNowNs(perf), 1764489600123456000n + 1500250000n);
  const a = browserNowNs();
  const b = browserNowNs();
  assert.ok(b >= a);
  assert.ok(Math.abs(Number(a / 1000000n) - Date.now()) < 1000);
});

test("a join over a caller's channel goes on in rounds until its error is bounded", async () => {
  // A server 5 ms ahead; the first 16 exchanges take 40 ms each way (a busy machine), then 1 ms.
  let clock = 1_000_000_000n;
  const join = new ClockJoin(48);
  const sent = [];
  const send = (req) => {
    sent.push(req);
    const oneWay = sent.length <= 16 ? 40_000_000n : 1_000_000n;
    const t2 = req.t1 + oneWay + 5_000_000n;
    join.response({ t1: req.t1, t2, t3: t2 }, req.t1 + 2n * oneWay);
  };
  const report = await joinInRounds(send, join, {
    now: () => (clock += 20_000_000n), sleep: async () => {},
  });
  assert.equal(sent.length, 24); // two busy rounds, then one good one was enough
  assert.equal(report.offset_ns, 5_000_000n);
  assert.equal(report.error_ns, 1_000_000n);
  // Never past the bound, and a join that gets nothing back reports nothing.
  const silent = await joinInRounds(() => {}, new ClockJoin(48), { sleep: async () => {} });
  assert.equal(silent, null);
});
