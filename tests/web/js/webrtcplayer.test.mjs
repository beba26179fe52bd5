// webrtcplayer.js: the viewer page's WebRTC player on a fake video element, peer connection and
// `sync` DataChannel fed with records the way the relay writes them.
import assert from "node:assert/strict";
import { test } from "node:test";

import { parseMessage, serializeMessage } from "../../../sfu_sidecar/web/js/syncwire.js";
import { STALL_CHECK_MS, WebrtcPlayer } from "../../../sfu_sidecar/web/js/webrtcplayer.js";
import { FakeVideo, withVttCue } from "./fakes.mjs";

const HOUSE0 = 1_796_082_985_000_000_000n; // house ns of video frame 0
const EPOCH = HOUSE0 - 10_000_000_000n; // stream time 0: frame 0 is at 10 s
const RTP0 = 4_000_000_000; // video frame 0's RTP timestamp (wraps during the test)
const AUDIO_RTP0 = 1234;
const rtpOf = (i) => (RTP0 + i * 3000) >>> 0;
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

class FakeChannel {
  constructor() {
    Object.assign(this, { readyState: "open", sent: [], listeners: new Map(), reply: null });
  }

  addEventListener(type, fn) {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), fn]);
  }

  emit(type, event = {}) {
    for (const fn of this.listeners.get(type) ?? []) fn(event);
  }

  send(bytes) {
    const msg = parseMessage(bytes);
    this.sent.push(msg.message);
    if (this.reply !== null) this.reply(msg.message);
  }

  deliver(msg) {
    this.emit("message", { data: serializeMessage(msg).buffer });
  }

  controls(type) {
    return this.sent.filter((m) => m.type === type);
  }
}

class FakePeer {
  constructor(audioSources) {
    this.connectionState = "new";
    this.listeners = [];
    const receiver = (kind, sources) => ({ track: { kind }, getSynchronizationSources: sources });
    this.transceivers = [
      { mid: "0", receiver: receiver("audio", audioSources) },
      { mid: "1", receiver: receiver("video", () => []) },
    ];
  }

  getTransceivers() {
    return this.transceivers;
  }

  addEventListener(type, fn) {
    if (type === "connectionstatechange") this.listeners.push(fn);
  }

  to(state) {
    this.connectionState = state;
    for (const fn of this.listeners) fn();
  }
}

// What the relay sends first on a viewer's channel: both tracks' anchors and the stream epoch.
function anchors(seq = 0) {
  return {
    kind: "batch", seq, records: [
      { type: "anchor", track: 0, generation: 0, source: "abs_capture_time", clock_rate: 90000, rtp_ts: RTP0,
        capture_ns: HOUSE0, drift_ppb: 0, reset: true, mid: "1" },
      { type: "anchor", track: 1, generation: 0, source: "abs_capture_time", clock_rate: 48000, rtp_ts: AUDIO_RTP0,
        capture_ns: HOUSE0, drift_ppb: 0, reset: true, audio: true, mid: "0" },
      { type: "control", message: { type: "epoch", stream: "s", epoch_ns: EPOCH } },
    ],
  };
}

const cue = (id, lang, start, end, text) => ({ kind: "control", message: {
  type: "cue", stream: "s", lang, id, start, end, text, final: true } });

// A player on a fake page; `open(attempt)` may refuse a session by throwing (each is made
// otherwise, with a fake peer and channel, and kept in `opened`).
function makePlayer({ open, audioSources = () => [], now = () => 0, ...options } = {}) {
  const video = new FakeVideo();
  const opened = [];
  const states = [];
  let attempts = 0;
  const player = new WebrtcPlayer({
    video, stream: "s", makeStream: () => ({ addTrack() {} }), timeOrigin: 0, now,
    onState: (state, detail) => states.push([state, detail]),
    onLanguages: () => {
      player.captions.select("en");
      player.selectLanguage("en");
    },
    openSession: async (endpoint, { onSyncChannel }) => {
      if (open) await open(attempts++);
      const channel = new FakeChannel();
      const session = { pc: new FakePeer(audioSources), channel, closed: 0, alive: true,
        close() { this.closed++; }, async exists() { return this.alive; } };
      onSyncChannel(channel);
      opened.push(session);
      return session;
    },
    ...options,
  });
  return { player, video, opened, states };
}

// Presents frames first..last-1, each with currentTime on the media's own origin; returns the
// indexes of the frames that showed `text`.
function present(player, video, first, last, text) {
  const shownOn = [];
  for (let i = first; i < last; i++) {
    video.currentTime = 500 + i / 30;
    video.frame(0, { rtpTimestamp: rtpOf(i), mediaTime: video.currentTime, expectedDisplayTime: 0 });
    if (video.showing().includes(text)) shownOn.push(i);
  }
  return shownOn;
}

test("a cue shows on exactly the frames captured in its interval, in the chosen language", async () => {
  await withVttCue(async () => {
    const { player, video, opened } = makePlayer();
    await player.connect();
    player.frameHandle = video.requestVideoFrameCallback((n, m) => player.onFrame(n, m));
    const { channel } = opened[0];
    channel.deliver(anchors());
    channel.deliver(cue("c1", "en", 11, 12, "one"));
    channel.deliver(cue("c1-de", "de", 11, 12, "eins"));
    // Frames 30..59 are captured in [11 s, 12 s) of stream time.
    assert.deepEqual(present(player, video, 0, 75, "one"), Array.from({ length: 30 }, (_, i) => 30 + i));
    assert.equal(video.showing().length, 0);
    const stats = player.stats.snapshot();
    assert.equal(stats.presented, 75);
    assert.equal(stats.mapped, 75);
    assert.equal(stats.source, "abs_capture_time");
    assert.equal(stats.cuesShown, 1); // the German cue was placed, on a hidden track: not shown
    assert.ok(Math.abs(stats.captionErrorMedianMs) < 0.01, stats.captionErrorMedianMs);
    await player.stop();
  });
});

test("every frame listener gets the frame's capture and stream time", async () => {
  const { player, video, opened } = makePlayer();
  await player.connect();
  video.requestVideoFrameCallback((n, m) => player.onFrame(n, m));
  const records = [];
  player.frameListeners.push((record) => records.push(record));
  present(player, video, 0, 1, "");
  assert.equal(records[0].captureNs, null); // before any record: not mapped
  opened[0].channel.deliver(anchors());
  present(player, video, 3, 4, "");
  assert.equal(records[1].captureNs, HOUSE0 + 100_000_000n);
  assert.ok(Math.abs(records[1].streamS - 10.1) < 1e-9);
  assert.equal(records[1].latencyMs, null); // no clock join yet: latency unknown, not guessed
  await player.stop();
});

test("the reported A/V skew is the audio playing minus the frame showing, by capture time", async () => {
  // The audio playing was captured 20 ms after the frame on screen (3000 ticks = 62.5 ms of
  // 48 kHz audio after its anchor, the frame 42.5 ms after its own, both anchored at HOUSE0).
  const audio = [{ rtpTimestamp: AUDIO_RTP0 + 3000, timestamp: 0 }];
  const { player, video, opened } = makePlayer({ audioSources: () => audio });
  await player.connect();
  video.requestVideoFrameCallback((n, m) => player.onFrame(n, m));
  opened[0].channel.deliver(anchors());
  const frameAt = (ms) => ((RTP0 + ms * 90) >>> 0);
  video.frame(0, { rtpTimestamp: frameAt(42.5), mediaTime: 0, expectedDisplayTime: 0 });
  // Displayed 5 ms after that audio began to play: the audio heard is 5 ms further on.
  video.frame(0, { rtpTimestamp: frameAt(42.5), mediaTime: 0, expectedDisplayTime: 5 });
  const report = player.sendPlayout();
  assert.equal(report.frames, 2);
  assert.ok(Math.abs(report.av_skew_ms - 22.5) < 1e-6, report.av_skew_ms); // median of 20 and 25
  assert.deepEqual(opened[0].channel.controls("playout").map((m) => m.frames), [2n]);
  await player.stop();
});

test("the clock join runs over the channel; telemetry is stamped in house time, per interval", async () => {
  let browserNs = 1_000_000_000n;
  const { player, video, opened } = makePlayer({
    clockNowNs: () => (browserNs += 1_000_000n),
    joinOptions: { sleep: async () => {} },
  });
  await player.connect();
  const { channel } = opened[0];
  // The relay answers at once; house time runs 7 ms ahead of the browser's clock.
  channel.reply = (m) => {
    if (m.type !== "clock_req") return;
    const t2 = m.t1 + 7_000_000n + 500_000n; // half of the exchange's 1 ms each way
    channel.deliver({ kind: "control", message: { type: "clock_resp", t1: m.t1, t2, t3: t2 } });
  };
  const report = await player.joinHouseClock();
  assert.equal(report.offset_ns, 7_000_000n);
  assert.deepEqual(channel.controls("clock_report").map((m) => m.offset_ns), [7_000_000n]);
  video.requestVideoFrameCallback((n, m) => player.onFrame(n, m));
  channel.deliver(anchors());
  present(player, video, 0, 10, "");
  const first = player.sendTelemetry();
  assert.equal(first.presented, 10);
  assert.equal(first.mapped, 10);
  assert.ok(first.t_ns - browserNs >= 7_000_000n - 2_000_000n && first.t_ns - browserNs <= 7_000_000n);
  present(player, video, 10, 14, "");
  assert.equal(player.sendTelemetry().presented, 4); // only what is new since the last report
  await player.stop();
});

test("a bad sync message is counted and dropped, and the records after it still map", async () => {
  const { player, video, opened } = makePlayer();
  await player.connect();
  video.requestVideoFrameCallback((n, m) => player.onFrame(n, m));
  const { channel } = opened[0];
  const warn = console.warn;
  console.warn = () => {};
  try {
    channel.emit("message", { data: new Uint8Array([1, 9, 9]).buffer });
  } finally {
    console.warn = warn;
  }
  channel.deliver(anchors(1));
  present(player, video, 0, 3, "");
  assert.equal(player.stats.badMessages, 1);
  assert.equal(player.stats.mapped, 3);
  await player.stop();
});

test("a failed connection is tried again with back-off, and the new one maps by its own records", async () => {
  const { player, video, opened, states } = makePlayer({
    reconnectFirstMs: 5,
    open: async (n) => {
      if (n === 0) throw Object.assign(new Error("WHEP 503: no publisher"), { status: 503 });
    },
  });
  // The first try fails with a status trying again can change: the second is made.
  await player.connect();
  assert.equal(opened.length, 0);
  await sleep(30);
  assert.equal(opened.length, 1);
  assert.equal(player.stats.reconnects, 1);
  assert.deepEqual(states.map(([s]) => s), ["connecting", "reconnecting", "connecting"]);
  const first = opened[0];
  first.channel.deliver(anchors());
  video.requestVideoFrameCallback((n, m) => player.onFrame(n, m));
  present(player, video, 0, 1, "");
  first.pc.to("connected");
  assert.equal(player.reconnectDelayMs, 5); // back to the first delay once connected
  first.pc.to("failed");
  await sleep(30);
  assert.equal(opened.length, 2);
  assert.equal(first.closed, 1);
  // The old connection's records are gone: nothing maps until the new one's arrive.
  present(player, video, 1, 2, "");
  assert.equal(player.stats.mapped, 1);
  opened[1].channel.deliver(anchors());
  present(player, video, 2, 3, "");
  assert.equal(player.stats.mapped, 2);
  await player.stop();
});

test("a refusal that trying again cannot change is reported once and left", async () => {
  const { player, opened, states } = makePlayer({
    reconnectFirstMs: 5,
    open: async () => {
      throw Object.assign(new Error("WHEP 401: bad token"), { status: 401 });
    },
  });
  await player.connect();
  await sleep(30);
  assert.equal(opened.length, 0);
  assert.equal(player.stats.reconnects, 0);
  assert.deepEqual(states.at(-1), ["error", "WHEP 401: bad token"]);
  await player.stop();
});

test("a stalled picture makes the player ask the server, and a session it lost is replaced", async () => {
  let nowMs = 0;
  const { player, opened } = makePlayer({ reconnectFirstMs: 5, now: () => nowMs });
  await player.connect();
  nowMs = STALL_CHECK_MS - 1;
  player.watchStall();
  assert.equal(player.stats.sessionChecks, 0); // not stalled yet
  nowMs = STALL_CHECK_MS;
  player.watchStall();
  await sleep(0);
  assert.equal(player.stats.sessionChecks, 1);
  assert.equal(opened.length, 1); // the server still had it: a paused publisher, nothing to do
  opened[0].alive = false;
  nowMs += STALL_CHECK_MS;
  player.watchStall();
  await sleep(30);
  assert.equal(opened.length, 2);
  await player.stop();
});
