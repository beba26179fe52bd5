// framestats.js: what every player counts of the frames it presents.
import assert from "node:assert/strict";
import { test } from "node:test";

import { FrameStats } from "../../../sfu_sidecar/web/js/framestats.js";

test("frames are counted presented, and mapped only with a capture time", () => {
  const stats = new FrameStats();
  stats.frame({ captureNs: null, streamS: null });
  stats.frame({ captureNs: 1_000n, source: "abs_capture_time", estimated: false, streamS: 0.5 });
  stats.frame({ captureNs: null, streamS: null }); // a later unmapped frame keeps the last source
  assert.equal(stats.presented, 3);
  assert.equal(stats.mapped, 1);
  assert.equal(stats.source, "abs_capture_time");
  assert.equal(stats.estimated, false);
  assert.equal(stats.lastCaptureNs, 1_000n);
  assert.equal(stats.snapshot().lastCaptureNs, "1000");
});

test("a cue's caption error comes from the first frame that shows it, once", () => {
  const stats = new FrameStats();
  const cue = { id: "a", start: 2 };
  assert.deepEqual(stats.frame({ captureNs: 1n, streamS: 1.99, cues: [cue] }).map(Math.round), [-10]);
  assert.deepEqual(stats.frame({ captureNs: 2n, streamS: 2.02, cues: [cue] }), []);
  stats.frame({ captureNs: 3n, streamS: 3.02, cues: [{ id: "b", start: 3 }] });
  assert.equal(stats.cuesShown, 2);
  assert.ok(Math.abs(stats.captionErrorP95Ms() - 20) < 1e-6);
  assert.ok(Math.abs(stats.captionErrorMedianMs() + 10) < 1e-6); // the lower middle of two
});

test("before the stream's epoch is known no cue is judged", () => {
  const stats = new FrameStats();
  assert.deepEqual(stats.frame({ captureNs: 1n, streamS: null, cues: [{ id: "a", start: 0 }] }), []);
  assert.equal(stats.cuesShown, 0);
  assert.equal(stats.captionErrorMedianMs(), null);
  assert.equal(stats.captionErrorP95Ms(), null);
});

test("memory stays bounded over a long session, and each cue still counts once", () => {
  const stats = new FrameStats();
  for (let i = 0; i < 5000; i++) {
    const cue = { id: `c${i}`, start: i };
    stats.frame({ captureNs: 1n, streamS: i + 0.01, cues: [cue] });
    stats.frame({ captureNs: 1n, streamS: i + 0.02, cues: [cue] });
  }
  assert.equal(stats.cuesShown, 5000);
  assert.ok(stats.seenCues.size <= 2000);
  assert.ok(stats.captionErrorsMs.length <= 500);
});
