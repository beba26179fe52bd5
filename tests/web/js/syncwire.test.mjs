// The JS sync codec against proto/vectors/sync_*.json, the same vectors pytest uses.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import {
  SyncState, SyncWireError, anchorCaptureOf, frameCaptureNs, frameRtpTs, parseMessage, serializeMessage,
} from "../../../sfu_sidecar/web/js/syncwire.js";
import { decode, encode } from "../../../sfu_sidecar/web/js/msgpack.js";

const VECTORS = new URL("../../../proto/vectors/", import.meta.url);
const load = (name) => JSON.parse(readFileSync(fileURLToPath(new URL(name, VECTORS)), "utf8")).vectors;
const VALID = load("sync_messages.json");
const MALFORMED = load("sync_malformed.json");

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"));

// JSON form (64-bit values as decimal strings) <-> codec objects (BigInt).
const INT_FIELDS = new Set(["epoch_ns", "t1", "t2", "t3", "offset_ns", "error_ns", "rtt_ns", "t_ns",
  "presented", "mapped", "lost_batches"]);
const KNOWN = new Set(["epoch", "cue", "cue_retract", "clock_req", "clock_resp", "clock_report", "telemetry"]);

function controlFromJson(m) {
  if (!KNOWN.has(m.type)) return { ...m };
  return Object.fromEntries(Object.entries(m).map(([k, v]) => [k, INT_FIELDS.has(k) ? BigInt(v) : v]));
}
function controlToJson(m) {
  return Object.fromEntries(Object.entries(m).map(([k, v]) => [k, typeof v === "bigint" ? v.toString() : v]));
}
function fromJson(msg) {
  if (msg.kind === "control") return { kind: "control", message: controlFromJson(msg.message) };
  return {
    kind: "batch",
    seq: msg.seq,
    records: msg.records.map((r) => {
      if (r.type === "anchor") return { ...r, capture_ns: BigInt(r.capture_ns) };
      if (r.type === "control") return { type: "control", message: controlFromJson(r.message) };
      return { ...r };
    }),
  };
}
function toJson(msg) {
  if (msg.kind === "control") return { kind: "control", message: controlToJson(msg.message) };
  return {
    kind: "batch",
    seq: msg.seq,
    records: msg.records.map((r) => {
      if (r.type === "anchor") return { ...r, capture_ns: r.capture_ns.toString() };
      if (r.type === "control") return { type: "control", message: controlToJson(r.message) };
      return r;
    }),
  };
}

for (const v of VALID) {
  test(`parse: ${v.name}`, () => {
    const msg = parseMessage(unhex(v.hex));
    assert.deepEqual(toJson(msg), v.message);
    if (v.frames) {
      const anchors = new Map(msg.records.filter((r) => r.type === "anchor").map((a) => [`${a.track}/${a.generation}`, a]));
      const derived = msg.records.filter((r) => r.type === "frame").map((f) => {
        const a = anchors.get(`${f.track}/${f.generation}`);
        return { rtp_ts: frameRtpTs(f, a), capture_ns: frameCaptureNs(f, a).toString() };
      });
      assert.deepEqual(derived, v.frames);
    }
  });

  test(`serialize: ${v.name}`, () => {
    assert.equal(hex(serializeMessage(fromJson(v.message))), v.hex);
  });

  test(`every strict prefix is truncated: ${v.name}`, () => {
    const raw = unhex(v.hex);
    for (let cut = 0; cut < raw.length; cut++) {
      assert.throws(() => parseMessage(raw.subarray(0, cut)), (e) => e instanceof SyncWireError && e.kind === "truncated", `cut ${cut}`);
    }
  });
}

for (const v of MALFORMED) {
  test(`malformed: ${v.name}`, () => {
    assert.throws(() => parseMessage(unhex(v.hex)), (e) => e instanceof SyncWireError && e.kind === v.error);
  });
}

test("random bytes and flipped bytes only ever raise SyncWireError", () => {
  let seed = 12345;
  const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 8) / (1 << 24);
  const bases = VALID.map((v) => unhex(v.hex));
  for (let i = 0; i < 5000; i++) {
    const base = bases[i % bases.length];
    const raw = i % 2 ? Uint8Array.from(base) : Uint8Array.from({ length: Math.floor(rand() * 64) }, () => Math.floor(rand() * 256));
    if (raw.length) raw[Math.floor(rand() * raw.length)] ^= 1 + Math.floor(rand() * 255);
    try {
      parseMessage(raw);
    } catch (e) {
      assert.ok(e instanceof SyncWireError, `${e} on ${hex(raw)}`);
    }
  }
});

test("msgpack integers pick the smallest form, both signs, past 2**53", () => {
  const cases = [[0, "00"], [127, "7f"], [128, "cc80"], [65536, "ce00010000"], [-32, "e0"], [-33, "d0df"],
    [2n ** 63n, "cf8000000000000000"], [-(2n ** 63n), "d38000000000000000"]];
  for (const [v, h] of cases) {
    assert.equal(hex(encode(v)), h);
    assert.equal(BigInt(decode(unhex(h))), BigInt(v));
  }
});

test("viewer state resolves frames, interpolates, counts lost batches and unknown anchors", () => {
  const vec = VALID.find((v) => v.frames);
  const msg = parseMessage(unhex(vec.hex));
  const state = new SyncState();
  state.ingest({ kind: "batch", seq: 65533, records: [] });
  state.ingest(msg); // seq 65535: one batch (65534) lost across nothing but the gap
  assert.equal(state.lostBatches, 1);
  const first = vec.frames[0];
  assert.equal(state.captureOf(0, first.rtp_ts), BigInt(first.capture_ns));
  const anchor = msg.records[0];
  assert.equal(state.captureOf(0, anchor.rtp_ts + 1500), anchorCaptureOf(anchor, anchor.rtp_ts + 1500));
  state.ingest({ kind: "batch", seq: 0, records: [{ ...msg.records[2], generation: 9 }] });
  assert.equal(state.unresolved, 1);
  assert.equal(state.lostBatches, 1);
});

test("after a restart (a new connection) nothing of the old records maps, counters go on", () => {
  const vec = VALID.find((v) => v.frames);
  const msg = parseMessage(unhex(vec.hex));
  const state = new SyncState();
  state.ingest({ kind: "batch", seq: 65533, records: [] });
  state.ingest(msg);
  state.restart();
  assert.equal(state.captureOf(0, vec.frames[0].rtp_ts), null);
  assert.equal(state.current.size, 0);
  // The new connection's batches count from its own first one, not the old sequence.
  state.ingest({ kind: "batch", seq: 7, records: msg.records });
  assert.equal(state.lostBatches, 1);
  assert.equal(state.captureOf(0, vec.frames[0].rtp_ts), BigInt(vec.frames[0].capture_ns));
});

test("anchor interpolation matches the shared predict vectors to the nanosecond", () => {
  const cases = load("sync_predict.json");
  assert.ok(cases.length >= 50);
  for (const c of cases) {
    const anchor = { rtp_ts: c.anchor_rtp_ts, capture_ns: BigInt(c.capture_ns), clock_rate: c.clock_rate, drift_ppb: c.drift_ppb };
    assert.equal(anchorCaptureOf(anchor, c.rtp_ts), BigInt(c.expected_ns), JSON.stringify(c));
  }
});
