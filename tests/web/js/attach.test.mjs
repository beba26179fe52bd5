// attach.js: capture times from synchronization sources, cue placement, and attach() itself on a
// fake video element, receiver and caption feed.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  absCaptureNs, absMissingReason, attach, CaptureLog, GUARD_S, NTP_EPOCH_UNIX_MS, placeCue, rtpDiff,
  SOURCE_ABS,
} from "../../../sfu_sidecar/web/js/attach.js";
import { ABS_CAPTURE_TIME } from "../../../sfu_sidecar/web/js/whep.js";
import { FakeVideo } from "./fakes.mjs";

const base = 1_796_082_985_790_293_848n; // house ns of frame 0
const captureOf = (i) => base + BigInt(Math.round((i * 1e9) / 30));
// What Chromium reports: ms since 1900, rounded to the millisecond.
const source = (i, rtp0 = 1000) => ({
  rtpTimestamp: (rtp0 + i * 3000) >>> 0,
  captureTimestamp: Math.round(Number(captureOf(i)) / 1e6) + NTP_EPOCH_UNIX_MS,
});

test("RTP timestamp differences survive the 32-bit wrap", () => {
  assert.equal(rtpDiff(5, 0xfffffffb), 10);
  assert.equal(rtpDiff(0xfffffffb, 5), -10);
});

test("a frame's capture time is learnt below the millisecond rounding, across the RTP wrap", () => {
  const log = new CaptureLog();
  const rtp0 = 0xffffffff - 20 * 3000; // wraps after frame 20
  for (let i = 0; i < 40; i++) assert.equal(log.addSources([source(i, rtp0)]), true);
  const next = source(40, rtp0).rtpTimestamp;
  const errorMs = Number(log.captureOf(next) - captureOf(40)) / 1e6;
  assert.ok(Math.abs(errorMs) < 0.2, errorMs); // one sample alone is off by up to 0.5 ms
  assert.equal(log.captureOf((next + 2 * 90_000) >>> 0), null); // two seconds away: unknown
});

test("sources without a capture time are not samples; a jump starts the line anew", () => {
  const log = new CaptureLog();
  assert.equal(log.addSources([{ rtpTimestamp: 1, timestamp: 5 }]), false);
  for (let i = 0; i < 10; i++) log.addSources([source(i)]);
  // The publisher restarts: same RTP clock, capture times a minute later.
  const later = { ...source(10), captureTimestamp: source(10).captureTimestamp + 60_000 };
  log.addSources([later]);
  assert.equal(log.samples.length, 1);
  assert.equal(log.captureOf(later.rtpTimestamp), absCaptureNs(later));
});

test("a cue is active for the frame exactly when its capture time is in [start, end)", () => {
  const cue = { start: 10, end: 12 };
  const t = 3.5; // currentTime as read for the frame
  const active = (frameS) => {
    const [s, e] = placeCue(cue, frameS, t);
    assert.ok(e > s);
    return s <= t && t < e;
  };
  assert.equal(active(9.999), false);
  assert.equal(active(10), true);
  assert.equal(active(11.999), true);
  assert.equal(active(12), false);
});

test("boundaries still ahead are pushed out, so currentTime running on cannot cross them", () => {
  const t = 3.5;
  // Due 10 ms after this frame: still not active until the next frame, up to GUARD_S away.
  const [start] = placeCue({ start: 10.01, end: 11 }, 10, t);
  assert.ok(start >= t + GUARD_S, start);
  // Ends 10 ms after this frame: stays on until the next frame says otherwise.
  const [, end] = placeCue({ start: 9, end: 10.01 }, 10, t);
  assert.ok(end >= t + GUARD_S, end);
  // Past cues sit wholly behind currentTime, where it never returns to on a live stream.
  const [s, e] = placeCue({ start: 8, end: 9 }, 10, t);
  assert.deepEqual([s, e], [t - 2, t - 1]);
});

test("the fallback reason says whether abs-capture-time was negotiated", () => {
  const receiver = (uris) => ({ getParameters: () => ({ headerExtensions: uris.map((uri) => ({ uri })) }) });
  assert.match(absMissingReason(receiver(["urn:ietf:params:rtp-hdrext:sdes:mid"])), /not negotiated/);
  assert.match(absMissingReason(receiver([ABS_CAPTURE_TIME])), /does not forward it/);
  assert.match(absMissingReason({}), /reports no abs-capture-time/);
});

// --- attach() on a fake video element, receiver and caption feed ----------------------------

test("attach() shows a feed's cue on exactly the frames captured in its interval", async () => {
  const savedCue = globalThis.VTTCue;
  globalThis.VTTCue = class { constructor(s, e, text) { Object.assign(this, { startTime: s, endTime: e, text }); } };
  const feed = [
    `{"epoch_ns": ${base}, "next": 1, "cues": [{"id": "c1", "lang": "en", "start": 1.0, "end": 2.0, "text": "one"}]}`,
    '{"next": 1, "cues": []}',
  ];
  const savedFetch = globalThis.fetch;
  globalThis.fetch = async () => ({ ok: true, status: 200, text: async () => feed.shift() ?? '{"next": 1, "cues": []}' });
  let frame = 0;
  const receiver = { getSynchronizationSources: () => [source(frame)], getParameters: () => ({}) };
  const video = new FakeVideo();
  const { stats, track, detach } = attach({
    video, receiver, sidecarUrl: "http://127.0.0.1:9/", stream: "s", pollMs: 60_000,
  });
  try {
    await new Promise((done) => setTimeout(done, 20)); // the feed's first answers
    assert.equal(stats.epochNs, base);
    assert.equal(track.mode, "showing");
    const shownOn = [];
    for (frame = 0; frame < 75; frame++) {
      video.currentTime = 100 + frame / 30; // media time runs on its own origin
      video.frame(0, { rtpTimestamp: source(frame).rtpTimestamp, mediaTime: video.currentTime });
      if (track.activeCues.length) shownOn.push(frame);
    }
    // Frames 30..59 are captured in [1 s, 2 s): the cue shows on them and on no other.
    assert.deepEqual(shownOn, Array.from({ length: 30 }, (_, i) => 30 + i));
    assert.equal(stats.source, SOURCE_ABS);
    assert.equal(stats.cuesShown, 1);
  } finally {
    detach();
    globalThis.fetch = savedFetch;
    globalThis.VTTCue = savedCue;
  }
  assert.equal(track.mode, "disabled");
  assert.equal(track.cues.size, 0);
});
