// The viewer page's playout meter, and the `playout` message as both codecs write it.
import { test } from "node:test";
import assert from "node:assert/strict";

import { median, PlayoutMeter } from "../../../sfu_sidecar/web/js/playout.js";
import { parseMessage, serializeMessage, SyncState } from "../../../sfu_sidecar/web/js/syncwire.js";

const hex = (bytes) => Buffer.from(bytes).toString("hex");

test("median of odd, even and empty samples", () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.equal(median([]), null);
});

test("A/V skew is audio capture minus video capture, reported as the interval median", () => {
  const meter = new PlayoutMeter();
  const video = 1_700_000_000_000_000_000n;
  assert.equal(meter.frame(video, video + 20_000_000n), 20); // audio 20 ms ahead: leads
  assert.equal(meter.frame(video, video - 40_000_000n), -40);
  assert.equal(meter.frame(video, video + 5_000_000n), 5);
  assert.equal(meter.frame(null, video), null); // no video anchor yet: no sample
  const report = meter.report("demo", 123n);
  assert.equal(report.frames, 3);
  assert.equal(report.av_skew_ms, 5);
  assert.equal(meter.report("demo", 124n).frames, 0); // a new interval starts empty
});

test("caption errors are reported as the interval's mean, then start over", () => {
  const meter = new PlayoutMeter();
  meter.captionError(16);
  meter.captionError(24);
  meter.resync();
  const report = meter.report("demo", 1n);
  assert.equal(report.captions, 2);
  assert.ok(Math.abs(report.caption_error_ms - 20) < 1e-9);
  assert.equal(report.resyncs, 1);
  assert.equal(meter.report("demo", 2n).captions, 0);
});

test("playout serialises to the bytes the Python codec writes", () => {
  // sfu_sidecar.sync.wire: ControlMessage(Playout(stream="demo", t_ns=1700000000123456789,
  // frames=28, av_skew_ms=-12.5, captions=1, caption_error_ms=16.0, resyncs=0)).serialize()
  const python = "010288a474797065a7706c61796f7574a673747265616da464656d6fa4745f6e73cf17979cfe3d85cd15"
    + "a66672616d65731caa61765f736b65775f6d73cbc029000000000000a863617074696f6e7301b063617074"
    + "696f6e5f6572726f725f6d73cb4030000000000000a7726573796e637300";
  const message = { type: "playout", stream: "demo", t_ns: 1700000000123456789n, frames: 28,
    av_skew_ms: -12.5, captions: 1, caption_error_ms: 16, resyncs: 0 };
  const bytes = serializeMessage({ kind: "control", message });
  assert.equal(hex(bytes), python);
  const back = parseMessage(bytes).message;
  assert.equal(back.type, "playout");
  assert.equal(back.frames, 28n);
  assert.equal(back.av_skew_ms, -12.5);
});

test("a reset anchor on a known track counts as a resync, its repeats do not", () => {
  const state = new SyncState();
  const anchor = { type: "anchor", track: 0, generation: 0, source: 0, clock_rate: 90000,
    rtp_ts: 1000, capture_ns: 5_000_000_000n, drift_ppb: 0, mid: "0", audio: false,
    reset: true, estimated: false };
  state.ingest({ kind: "batch", seq: 0, records: [anchor] });
  assert.equal(state.resets, 0); // the first timeline is no resync
  state.ingest({ kind: "batch", seq: 1, records: [anchor] });
  assert.equal(state.resets, 0); // a repeat
  state.ingest({ kind: "batch", seq: 2, records: [{ ...anchor, rtp_ts: 99, generation: 1 }] });
  assert.equal(state.resets, 1);
});
