// The MSE player's decisions: segment order, discontinuity and drift resyncs, playhead fixes.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  added, DriftGuard, driftOf, DRIFT_S, playheadFix, PlayerStats, seekTarget, SegmentPlan, trimRange,
} from "../../../sfu_sidecar/web/js/msemodel.js";

function seg(sequence, start, { duration = 1, discontinuity = false, init = 1 } = {}) {
  const number = Math.floor(start * 1000);
  return { sequence, number, start_s: start, duration_s: duration, discontinuity, init, url: `${number}.webm` };
}

function index(segments, init = "init.webm?v=1") {
  return { init, target_duration_s: 1, segments };
}

test("starts one closed segment behind the newest, with its init first", () => {
  const plan = new SegmentPlan();
  const actions = plan.plan(index([seg(0, 10), seg(1, 11), seg(2, 12)]));
  assert.deepEqual(actions.map((a) => a.type), ["init", "segment", "segment"]);
  assert.deepEqual(actions.slice(1).map((a) => a.segment.sequence), [1, 2]);
  assert.ok(actions.every((a) => a.type === "init" || a.resync === null));
  assert.deepEqual(plan.plan(index([seg(1, 11), seg(2, 12)])), []); // nothing new
  const next = plan.plan(index([seg(2, 12), seg(3, 13)]));
  assert.deepEqual(next.map((a) => [a.type, a.segment?.sequence, a.resync]), [["segment", 3, null]]);
});

test("nothing before the init segment and a closed segment exist", () => {
  const plan = new SegmentPlan();
  assert.deepEqual(plan.plan({ init: null, segments: [] }), []);
  assert.deepEqual(plan.plan(index([])), []);
  assert.equal(plan.next, null);
});

test("a discontinuity is one resync, on the segment that carries it", () => {
  const plan = new SegmentPlan({ startBehind: 0 });
  plan.plan(index([seg(0, 10), seg(1, 11)]));
  const actions = plan.plan(index([seg(1, 11), seg(2, 13.1, { discontinuity: true }), seg(3, 14.1)]));
  assert.deepEqual(actions.map((a) => a.resync?.reason ?? null), ["discontinuity", null]);
  assert.ok(Math.abs(actions[0].resync.jumpS - 1.1) < 1e-9);
});

test("a start jump past 0.8 s without the flag is a resync; a smaller one is not", () => {
  const plan = new SegmentPlan({ startBehind: 0 });
  plan.plan(index([seg(0, 10)]));
  assert.equal(plan.plan(index([seg(1, 11.5)]))[0].resync, null); // 0.5 s late: not a break
  const [jump] = plan.plan(index([seg(2, 13.4)])); // expected 12.5
  assert.equal(jump.resync.reason, "jump");
  assert.ok(Math.abs(jump.resync.jumpS - 0.9) < 1e-9);
});

test("a window that slid past unfetched segments resyncs once", () => {
  const plan = new SegmentPlan({ startBehind: 0 });
  plan.plan(index([seg(0, 10)]));
  const actions = plan.plan(index([seg(5, 15), seg(6, 16)]));
  assert.deepEqual(actions.map((a) => a.resync?.reason ?? null), ["window", null]);
});

test("a new init version is appended before the segment that needs it", () => {
  const plan = new SegmentPlan({ startBehind: 0 });
  plan.plan(index([seg(0, 10)]));
  const actions = plan.plan(index([seg(1, 11, { init: 2, discontinuity: true })], "init.webm?v=2"));
  assert.deepEqual(actions.map((a) => a.type), ["init", "segment"]);
  assert.equal(actions[0].url, "init.webm?v=2");
  assert.equal(actions[1].resync.reason, "discontinuity");
});

test("added: the span an append buffered", () => {
  assert.deepEqual(added([], [[10, 11]]), [10, 11]);
  assert.deepEqual(added([[10, 11]], [[10, 12]]), [11, 12]); // extended a range
  assert.deepEqual(added([[10, 11]], [[10, 11], [13, 14]]), [13, 14]); // a new range
  assert.equal(added([[10, 11]], [[10, 11]]), null); // a repeat append
  assert.equal(added([[10, 11]], [[10, 11.0005]]), null); // rounding at the edge
});

test("drift: where the media landed against the caption timeline", () => {
  const s = seg(3, 20);
  assert.equal(driftOf(s, 0, [20.01, 21]), 0.010000000000001563);
  assert.ok(Math.abs(driftOf(s, 0, [25, 26]) - 5) < 1e-9); // bytes five seconds late
  assert.ok(Math.abs(driftOf(s, -5, [20, 21]) - 5) < 1e-9); // offset moved media ahead of captions
  assert.ok(Math.abs(driftOf(s, 0, [19.9, 21])) < DRIFT_S);
  assert.equal(driftOf(s, 0, null), null);
});

test("seek target: inside a range, or the next one", () => {
  assert.equal(seekTarget([[10, 12], [14, 16]], 11), 11.001);
  assert.equal(seekTarget([[10, 12], [14, 16]], 12.5), 14.001);
  assert.equal(seekTarget([[10, 12]], 20), null);
});

test("playhead: live-edge jump, hole skip, and leave alone", () => {
  const opts = { maxLagS: 4, targetLagS: 1.5 };
  assert.deepEqual(playheadFix([[10, 20]], 11, opts), { reason: "live-edge", to: 18.5 });
  assert.deepEqual(playheadFix([[10, 12], [13, 16]], 12, opts), { reason: "hole", to: 13.001 });
  assert.equal(playheadFix([[10, 12], [13, 14]], 11, opts), null); // playing, not behind
  assert.deepEqual(playheadFix([[10, 12], [13, 14]], 11.5, { ...opts, stalled: true }), { reason: "hole", to: 13.001 });
  assert.equal(playheadFix([], 0, opts), null);
  assert.equal(playheadFix([[10, 12], [30, 31]], 12, { ...opts, maxLagS: 40 }), null); // too far to skip
});

test("trim keeps 20 s behind the playhead, in steps", () => {
  assert.equal(trimRange([[0, 40]], 25), null);
  assert.deepEqual(trimRange([[0, 40]], 31), [0, 11]);
  assert.equal(trimRange([], 31), null);
});

test("stats: one resync counted per call, beside the frame counts every player keeps", () => {
  const stats = new PlayerStats();
  stats.resync({ reason: "discontinuity", jumpS: 1, atS: 5 });
  assert.equal(stats.resyncs, 1);
  assert.deepEqual(stats.lastCorrection, { reason: "discontinuity", jumpS: 1, atS: 5 });
  stats.frame({ captureNs: 5n, source: "segment", estimated: false, streamS: 1.99 });
  assert.equal(stats.presented, 1);
  assert.equal(stats.mapped, 1);
});


function open(start, { discontinuity = false, init = 1 } = {}) {
  const number = Math.floor(start * 1000);
  return { number, start_s: start, discontinuity, init, parts: 1, url: `${number}.webm` };
}

function live(segments, openSegment, init = "init.webm?v=1") {
  return { ...index(segments, init), open: openSegment };
}

test("low latency: starts on the segment being made and streams it once", () => {
  const plan = new SegmentPlan({ open: true });
  const actions = plan.plan(live([seg(0, 10), seg(1, 11)], open(12)));
  assert.deepEqual(actions.map((a) => [a.type, a.segment?.number ?? null, a.open ?? null]),
    [["init", null, null], ["segment", 12000, true]]);
  assert.equal(actions[1].resync, null);
  // Listed again while it is being streamed, or before it is listed as closed: nothing new.
  assert.deepEqual(plan.plan(live([seg(0, 10), seg(1, 11)], open(12))), []);
  plan.streamed(true);
  assert.deepEqual(plan.plan(live([seg(0, 10), seg(1, 11)], open(12))), []);
  // Closed now: not appended again; on to the next open one, which starts where it ended.
  const next = plan.plan(live([seg(1, 11), seg(2, 12)], open(13)));
  assert.deepEqual(next.map((a) => [a.segment.number, a.open, a.resync]), [[13000, true, null]]);
});

test("low latency: a stream that broke off is appended whole once closed", () => {
  const plan = new SegmentPlan({ open: true });
  plan.plan(live([seg(0, 10)], open(11)));
  plan.streamed(false);
  const actions = plan.plan(live([seg(0, 10), seg(1, 11)], open(12)));
  assert.deepEqual(actions.map((a) => [a.segment.number, a.open, a.resync]),
    [[11000, false, null], [12000, true, null]]);
});

test("low latency: a break before the segment being made is one resync", () => {
  const plan = new SegmentPlan({ open: true });
  plan.plan(live([], open(10)));
  plan.streamed(true);
  const actions = plan.plan(live([seg(0, 10)], open(12.5, { discontinuity: true })));
  assert.deepEqual(actions.map((a) => a.resync?.reason ?? null), ["discontinuity"]);
  assert.ok(Math.abs(actions[0].resync.jumpS - 1.5) < 1e-9);
  plan.streamed(true);
  assert.deepEqual(plan.plan(live([seg(0, 10), seg(1, 12.5)], open(13.5))).map(
    (a) => a.resync), [null]);
});

test("low latency: a segment being made that never closes is passed by", () => {
  const plan = new SegmentPlan({ open: true });
  plan.plan(live([], open(10)));
  plan.streamed(false);
  // The service dropped it (no keyframe came in time); the next one closed meanwhile.
  const actions = plan.plan(live([seg(0, 11.5)], open(12.5)));
  assert.deepEqual(actions.map((a) => [a.segment.number, a.open, a.resync]),
    [[11500, false, null], [12500, true, null]]);
});

test("without low latency the segment being made is ignored", () => {
  const plan = new SegmentPlan();
  const actions = plan.plan(live([seg(0, 10), seg(1, 11)], open(12)));
  assert.deepEqual(actions.filter((a) => a.type === "segment").map((a) => [a.segment.number, a.open]),
    [[10000, false], [11000, false]]);
});

test("drift guard: two segments in a row that agree, not one", () => {
  const guard = new DriftGuard();
  assert.equal(guard.confirm(null), false);
  assert.equal(guard.confirm(0.1), false); // within DRIFT_S
  assert.equal(guard.confirm(-0.83), false); // one segment off: a late track's tail, say
  assert.equal(guard.confirm(0.0), false);
  assert.equal(guard.confirm(-0.5), false);
  assert.equal(guard.confirm(-0.49), true); // the bytes' clock is off: corrected
  assert.equal(guard.confirm(-0.5), false); // starts over after a correction
  assert.equal(guard.confirm(0.5), false);
  assert.equal(guard.confirm(-0.5), false); // disagreeing signs never confirm
  assert.equal(guard.confirm(0.3), false);
  assert.equal(guard.confirm(0.32), true);
});
