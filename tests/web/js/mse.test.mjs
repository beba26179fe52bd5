// mse.js: the MSE player on a fake video element, MediaSource and server. A fake segment's bytes
// say where its media lies in container time, so the fake SourceBuffer buffers it where a real
// one would (container time + timestampOffset) and refuses bytes marked bad, as a real one
// refuses a corrupt segment.
import assert from "node:assert/strict";
import { test } from "node:test";

import { MsePlayer } from "../../../sfu_sidecar/web/js/mse.js";
import { FakeVideo, withVttCue } from "./fakes.mjs";

const BASE = "http://sidecar.test/";
const EPOCH = 1_700_000_000_000_000_000n;
const SEGMENT_S = 2;
const tick = () => new Promise((done) => setTimeout(done, 0));

// Polls the index once the player's own poll (start() begins one) is done.
async function pollNow(player) {
  while (player.busy) await tick();
  await player.poll();
}

class Emitter {
  constructor() {
    this.listeners = new Map();
  }

  addEventListener(type, fn, { once = false } = {}) {
    const wrapped = once ? (e) => { this.removeEventListener(type, wrapped); fn(e); } : fn;
    wrapped.original = fn;
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), wrapped]);
  }

  removeEventListener(type, fn) {
    this.listeners.set(type, (this.listeners.get(type) ?? []).filter((f) => f !== fn && f.original !== fn));
  }

  emit(type) {
    for (const fn of [...(this.listeners.get(type) ?? [])]) fn({ type });
  }
}

class FakeSourceBuffer extends Emitter {
  constructor() {
    super();
    Object.assign(this, { mode: "segments", timestampOffset: 0, updating: false, spans: [], appends: [] });
  }

  get buffered() {
    const merged = [];
    for (const [a, b] of [...this.spans].sort((x, y) => x[0] - y[0])) {
      const last = merged.at(-1);
      if (last && a <= last[1] + 1e-6) last[1] = Math.max(last[1], b);
      else merged.push([a, b]);
    }
    return { length: merged.length, start: (i) => merged[i][0], end: (i) => merged[i][1] };
  }

  appendBuffer(data) {
    const what = JSON.parse(new TextDecoder().decode(data));
    this.appends.push(what);
    this.updating = true;
    setTimeout(() => {
      this.updating = false;
      if (what.bad) {
        this.emit("error");
        return;
      }
      if (what.t !== undefined) this.spans.push([what.t + this.timestampOffset, what.t + what.d + this.timestampOffset]);
      this.emit("updateend");
    }, 0);
  }

  remove(start, end) {
    this.spans = this.spans.flatMap(([a, b]) => [[a, Math.min(b, start)], [Math.max(a, end), b]])
      .filter(([a, b]) => b - a > 1e-9);
    setTimeout(() => this.emit("updateend"), 0);
  }

  abort() {}
}

class FakeMediaSource extends Emitter {
  static made = [];

  static isTypeSupported(mime) {
    return mime.startsWith("video/webm");
  }

  constructor() {
    super();
    this.readyState = "open";
    this.buffers = [];
    FakeMediaSource.made.push(this);
    setTimeout(() => this.emit("sourceopen"), 0);
  }

  addSourceBuffer(mime) {
    const buffer = new FakeSourceBuffer();
    buffer.mime = mime;
    this.buffers.push(buffer);
    return buffer;
  }
}

const bytes = (o) => new TextEncoder().encode(JSON.stringify(o)).buffer;
const segment = (n, start) => ({ number: n, sequence: n, start_s: start, duration_s: SEGMENT_S,
  discontinuity: false, init: 1, url: `${n}.webm` });

// The service's answers: the index lists `server.segments`; a segment's bytes lie at its stream
// time plus `server.driftS` in container time, or are refused when its number is in `bad`.
function makeServer() {
  const server = {
    segments: [0, 1, 2, 3].map((n) => segment(n, n * SEGMENT_S)), driftS: 0, bad: new Set(),
    requests: [],
    chunk: `WEBVTT\nX-TIMESTAMP-MAP=MPEGTS:0,LOCAL:00:00:00.000\n\nc1\n00:00:05.000 --> 00:00:06.000\nhello\n`,
  };
  server.fetch = async (url) => {
    const path = new URL(url).pathname;
    server.requests.push(path);
    const ok = (body, headers = {}) => ({
      ok: true, status: 200, headers: { get: (h) => headers[h] ?? null },
      json: async () => JSON.parse(body), text: async () => body,
      arrayBuffer: async () => bytes(JSON.parse(body)),
    });
    if (path.endsWith("/index.json")) {
      return ok(JSON.stringify({
        container: "webm", codecs: ["vp8"], init: "init.webm?v=1", segments: server.segments,
        languages: ["en"], caption_chunk_s: 6, target_duration_s: SEGMENT_S, epoch_ns: Number(EPOCH),
        open: null,
      }));
    }
    if (path.endsWith("/init.webm")) return ok(JSON.stringify({ init: true }));
    const seg = /\/(\d+)\.webm$/.exec(path);
    if (seg !== null) {
      const n = Number(seg[1]);
      if (server.bad.has(n)) return ok(JSON.stringify({ bad: true }));
      return ok(JSON.stringify({ t: n * SEGMENT_S + server.driftS, d: SEGMENT_S }));
    }
    if (path.endsWith("/en/chunk-0.vtt")) return ok(server.chunk, { "Cache-Control": "immutable" });
    return { ok: false, status: 404, headers: { get: () => null } };
  };
  return server;
}

// Runs `body(player, video, server)` with the browser's MSE objects and fetch stood in for.
async function withPlayer(server, body) {
  const saved = { MediaSource: globalThis.MediaSource, fetch: globalThis.fetch,
    create: URL.createObjectURL, revoke: URL.revokeObjectURL, HTMLMediaElement: globalThis.HTMLMediaElement };
  globalThis.MediaSource = FakeMediaSource;
  globalThis.fetch = server.fetch;
  globalThis.HTMLMediaElement = { HAVE_FUTURE_DATA: 3 };
  URL.createObjectURL = () => `blob:${FakeMediaSource.made.length}`;
  URL.revokeObjectURL = () => {};
  FakeMediaSource.made = [];
  const video = new FakeVideo();
  Object.assign(video, { readyState: 4, error: null, pause() { this.paused = true; } });
  const player = new MsePlayer({ video, stream: "s", base: BASE });
  try {
    await withVttCue(() => body(player, video));
  } finally {
    player.stop();
    Object.assign(globalThis, { MediaSource: saved.MediaSource, fetch: saved.fetch,
      HTMLMediaElement: saved.HTMLMediaElement });
    URL.createObjectURL = saved.create;
    URL.revokeObjectURL = saved.revoke;
  }
}

test("closed segments are appended from one behind the newest, where the index puts them", async () => {
  const server = makeServer();
  await withPlayer(server, async (player, video) => {
    await player.start();
    const [buffer] = FakeMediaSource.made[0].buffers;
    assert.equal(buffer.mime, 'video/webm; codecs="vp8"');
    assert.deepEqual(buffer.appends.map((a) => (a.init ? "init" : a.t)), ["init", 4, 6]);
    assert.deepEqual([buffer.buffered.start(0), buffer.buffered.end(0)], [4, 8]);
    assert.ok(video.currentTime >= 4 && video.currentTime < 4.01, video.currentTime); // seeked in
    assert.equal(video.plays, 1);
    // The next poll appends what the index newly lists, and only that.
    server.segments.push(segment(4, 8));
    await pollNow(player);
    assert.deepEqual(buffer.appends.slice(3).map((a) => a.t), [8]);
    assert.equal(player.stats.segments, 3);
    assert.equal(player.stats.resyncs, 0);
  });
});

test("a caption chunk's cue shows on exactly the frames of its interval", async () => {
  const server = makeServer();
  await withPlayer(server, async (player, video) => {
    await player.start();
    const shownOn = [];
    for (let i = 0; i < 60; i++) { // frames at stream time 4.0 .. 5.967 s
      video.currentTime = 4 + i / 30;
      video.frame(0, { mediaTime: video.currentTime });
      if (video.showing().includes("hello")) shownOn.push(i);
    }
    // A cue at [5 s, 6 s): frames 30..59.
    assert.deepEqual(shownOn, Array.from({ length: 30 }, (_, i) => 30 + i));
    const snap = player.snapshot();
    assert.equal(snap.presented, 60);
    assert.equal(snap.cuesShown, 1);
    assert.ok(Math.abs(snap.captionErrorMedianMs) < 0.01, snap.captionErrorMedianMs);
    // A frame's capture time is the stream epoch plus its stream time.
    assert.ok(Math.abs(Number(player.lastFrame.captureNs - EPOCH) / 1e9 - (4 + 59 / 30)) < 1e-6);
  });
});

test("bytes that drift off the index are moved back onto the caption timeline", async () => {
  const server = makeServer();
  server.driftS = 0.5; // the bytes' clock runs half a second ahead of the index
  await withPlayer(server, async (player) => {
    await player.start();
    const [buffer] = FakeMediaSource.made[0].buffers;
    // One segment off is not yet drift (it could be a late tail); two that agree are.
    assert.equal(player.stats.resyncs, 1);
    assert.equal(player.stats.lastCorrection.reason, "drift");
    assert.ok(Math.abs(buffer.timestampOffset + 0.5) < 1e-9, buffer.timestampOffset);
    server.segments.push(segment(4, 8));
    await pollNow(player);
    assert.deepEqual(buffer.buffered.end(buffer.buffered.length - 1), 10); // lands where the index says
  });
});

test("a refused append starts a new MediaSource, counted, and playback goes on after it", async () => {
  const server = makeServer();
  await withPlayer(server, async (player) => {
    await player.start();
    server.segments.push(segment(4, 8), segment(5, 10));
    server.bad.add(4);
    await pollNow(player);
    assert.equal(player.stats.restarts, 1);
    assert.match(player.stats.lastError, /SourceBuffer error at 4\.webm/);
    assert.equal(FakeMediaSource.made.length, 2);
    const fresh = FakeMediaSource.made[1].buffers[0];
    // The new source gets its init, then the segment after the refused one: nothing shown twice.
    assert.deepEqual(fresh.appends.map((a) => (a.init ? "init" : a.t)), ["init", 10]);
  });
});
