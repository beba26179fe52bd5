// The pure parts of the publisher page: codec order, cue bodies, bitrate, server reasons.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  audioConstraints, Backoff, BitrateMeter, captureErrorMessage, cueBody, deviceChoices, durationNs,
  formatBitrate, InputError, levelFromSamples, linkHealth, preferredCodecs, RESOLUTIONS, Republisher,
  sentCodecs, serverReason, videoConstraints, whipFailure, withMaxBitrate,
} from "../../../sfu_sidecar/web/js/publishcore.js";

// What Chromium lists in RTCRtpSender.getCapabilities("video").codecs (abridged, in its order).
const CAPS = [
  { mimeType: "video/VP8", clockRate: 90000 },
  { mimeType: "video/rtx", clockRate: 90000 },
  { mimeType: "video/H264", clockRate: 90000,
    sdpFmtpLine: "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42001f" },
  { mimeType: "video/H264", clockRate: 90000,
    sdpFmtpLine: "level-asymmetry-allowed=1;packetization-mode=0;profile-level-id=42e01f" },
  { mimeType: "video/H264", clockRate: 90000,
    sdpFmtpLine: "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=640034" },
  { mimeType: "video/H264", clockRate: 90000,
    sdpFmtpLine: "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f" },
  { mimeType: "video/VP9", clockRate: 90000, sdpFmtpLine: "profile-id=2" },
  { mimeType: "video/VP9", clockRate: 90000, sdpFmtpLine: "profile-id=0" },
  { mimeType: "video/red", clockRate: 90000 },
  { mimeType: "video/ulpfec", clockRate: 90000 },
];

test("VP8 is offered alone with its retransmission", () => {
  assert.deepEqual(preferredCodecs(CAPS, "vp8").map((c) => c.mimeType), ["video/VP8", "video/rtx"]);
});

test("H.264 offers packetization-mode 1 only, constrained baseline first, then baseline", () => {
  const chosen = preferredCodecs(CAPS, "h264");
  assert.deepEqual(chosen.map((c) => c.sdpFmtpLine?.match(/profile-level-id=(\w+)/)?.[1] ?? c.mimeType),
    ["42e01f", "42001f", "640034", "video/rtx"]);
  assert.ok(chosen.every((c) => c.mimeType === "video/rtx" || /packetization-mode=1/.test(c.sdpFmtpLine)));
});

test("VP9 offers profile 0 only, which every VP9 decoder has", () => {
  assert.deepEqual(preferredCodecs(CAPS, "vp9").map((c) => c.sdpFmtpLine ?? c.mimeType),
    ["profile-id=0", "video/rtx"]);
  const profile2 = CAPS.filter((c) => c.sdpFmtpLine !== "profile-id=0");
  assert.throws(() => preferredCodecs(profile2, "vp9"),
    (e) => e instanceof InputError && /profile 0/.test(e.message));
});

test("a codec the browser cannot send, or an unknown choice, is an input error naming it", () => {
  const noH264 = CAPS.filter((c) => c.mimeType !== "video/H264");
  assert.throws(() => preferredCodecs(noH264, "h264"), (e) => e instanceof InputError && /H264/.test(e.message));
  assert.throws(() => preferredCodecs(CAPS, "av1"), InputError);
});

test("the cue body carries house ns exactly as integer literals, past 2^53", () => {
  const startNs = 1_796_082_985_790_293_849n; // odd: a Number would round it
  const body = cueBody({ startNs, lengthNs: 2_000_000_000n, text: "  hello \"world\"  ", lang: "pt-BR" });
  assert.match(body, /"start":1796082985790293849,/);
  assert.match(body, /"end":1796082987790293849,/);
  const doc = JSON.parse(body);
  assert.equal(doc.timebase, "house_ns");
  assert.equal(doc.lang, "pt-BR");
  assert.equal(doc.cues.length, 1);
  assert.equal(doc.cues[0].text, "hello \"world\"");
  assert.equal(doc.cues[0].id, "page-1796082985790293849");
});

test("an empty caption is refused before anything is sent", () => {
  assert.throws(() => cueBody({ startNs: 1n, lengthNs: 1n, text: "   " }), InputError);
  assert.throws(() => cueBody({ startNs: 1, lengthNs: 1n, text: "x" }), TypeError);
  assert.throws(() => cueBody({ startNs: 1n, lengthNs: 1n, text: "x", id: "auto-1" }), InputError);
});

test("duration: seconds to whole-millisecond ns, bounded like the ingest", () => {
  assert.equal(durationNs("2"), 2_000_000_000n);
  assert.equal(durationNs(" 0.25 "), 250_000_000n);
  assert.equal(durationNs("1.0004"), 1_000_000_000n);
  for (const bad of ["", "0", "-1", "abc", "3601", "Infinity", "0.0001"]) {
    assert.throws(() => durationNs(bad), InputError, bad);
  }
});

test("outgoing bitrate per kind from bytesSent deltas, simulcast layers summed", () => {
  const meter = new BitrateMeter();
  const at = (ms, video, audio) => [
    { type: "outbound-rtp", kind: "video", bytesSent: video[0], timestamp: ms },
    { type: "outbound-rtp", kind: "video", bytesSent: video[1], timestamp: ms },
    { type: "outbound-rtp", kind: "audio", bytesSent: audio, timestamp: ms },
    { type: "remote-inbound-rtp", kind: "video", bytesSent: 1e9, timestamp: ms },
  ];
  assert.deepEqual(meter.update(at(1000, [1000, 500], 100)), { video: null, audio: null });
  assert.deepEqual(meter.update(at(2000, [126000, 500], 4100)), { video: 1_000_000, audio: 32_000 });
  // A counter going back (a new sender) gives no rate for that round.
  assert.deepEqual(meter.update(at(3000, [0, 0], 8100)), { video: null, audio: 32_000 });
  assert.equal(formatBitrate(1_000_000), "1.00 Mbit/s");
  assert.equal(formatBitrate(32_000), "32 kbit/s");
  assert.equal(formatBitrate(null), "–");
});

test("the codec each kind is sent with comes from the outbound stream's codec report", () => {
  const reports = [
    { type: "codec", id: "c1", mimeType: "video/H264" },
    { type: "codec", id: "c2", mimeType: "audio/opus" },
    { type: "outbound-rtp", kind: "video", codecId: "c1" },
    { type: "outbound-rtp", kind: "audio", codecId: "c2" },
  ];
  assert.deepEqual(sentCodecs(reports), { video: "video/H264", audio: "audio/opus" });
});

test("the server's reason is its JSON error, or its text", () => {
  assert.equal(serverReason(401, '{"error": "wrong token for publishing"}'), "401: wrong token for publishing");
  assert.equal(serverReason(502, "Bad Gateway"), "502: Bad Gateway");
  assert.equal(serverReason(500, ""), "HTTP 500");
});

// --- Capture choices, failures in words, staying on air ------------------------------------

test("resolutions become ideal getUserMedia sizes, with the chosen camera exact", () => {
  assert.deepEqual(videoConstraints("720p", "cam-2"), {
    width: { ideal: 1280 }, height: { ideal: 720 }, frameRate: { ideal: 30 }, deviceId: { exact: "cam-2" },
  });
  assert.equal(videoConstraints("360p", "").deviceId, undefined);
  assert.equal(videoConstraints("1080p").height.ideal, 1080);
  assert.deepEqual(Object.keys(RESOLUTIONS), ["360p", "540p", "720p", "1080p"]);
  assert.throws(() => videoConstraints("4k"), InputError);
  assert.equal(audioConstraints(""), true);
  assert.deepEqual(audioConstraints("mic-1"), { deviceId: { exact: "mic-1" } });
});

test("device choices: one option per device of the kind, labelled before permission too", () => {
  const devices = [
    { kind: "videoinput", deviceId: "a", label: "" },
    { kind: "audioinput", deviceId: "m", label: "Fake Audio Input 1" },
    { kind: "videoinput", deviceId: "b", label: "" },
    { kind: "audiooutput", deviceId: "o", label: "speaker" },
    { kind: "videoinput", deviceId: "a", label: "" }, // listed twice: once
  ];
  assert.deepEqual(deviceChoices(devices, "videoinput", "b"), {
    options: [{ value: "a", label: "camera 1" }, { value: "b", label: "camera 2" }], selected: "b",
  });
  // A device that went away is not kept selected: the first one is.
  assert.equal(deviceChoices(devices, "videoinput", "gone").selected, "a");
  assert.deepEqual(deviceChoices(devices, "audioinput", null).options, [{ value: "m", label: "Fake Audio Input 1" }]);
  assert.deepEqual(deviceChoices([], "audioinput", "x"), { options: [], selected: "" });
});

test("the level meter reads RMS on a -60..0 dBFS scale", () => {
  assert.equal(levelFromSamples(new Float32Array(512)), 0);
  assert.equal(levelFromSamples([]), 0);
  assert.equal(levelFromSamples(new Float32Array(512).fill(1)), 1);
  assert.ok(Math.abs(levelFromSamples(new Float32Array(512).fill(0.001))) < 1e-6); // -60 dBFS
  assert.ok(Math.abs(levelFromSamples(new Float32Array(512).fill(-0.1)) - 2 / 3) < 1e-6); // -20 dBFS
  const sine = Float32Array.from({ length: 480 }, (_, i) => 0.5 * Math.sin((2 * Math.PI * i) / 48));
  const db = 20 * Math.log10(0.5 / Math.SQRT2);
  assert.ok(Math.abs(levelFromSamples(sine) - (db + 60) / 60) < 1e-6);
});

test("the bitrate ceiling goes on the first encoding and comes off again", () => {
  const params = { transactionId: "t1", encodings: [{ active: true }], codecs: [] };
  const capped = withMaxBitrate(params, 500_000);
  assert.deepEqual(capped, { transactionId: "t1", encodings: [{ active: true, maxBitrate: 500_000 }], codecs: [] });
  assert.deepEqual(params.encodings[0], { active: true }, "the sender's own object is left alone");
  assert.deepEqual(withMaxBitrate(capped, null).encodings, [{ active: true }]);
  assert.deepEqual(withMaxBitrate({ encodings: [] }, 250_000).encodings, [{ maxBitrate: 250_000 }]);
  assert.throws(() => withMaxBitrate(params, -5), InputError);
});

test("capture refusals are named for what the broadcaster can do", () => {
  const err = (name, extra = {}) => Object.assign(new Error("browser words"), { name, ...extra });
  assert.match(captureErrorMessage(err("NotAllowedError")), /^permission to use the camera or microphone was denied/);
  assert.match(captureErrorMessage(err("NotAllowedError"), "screen"), /^screen sharing was not allowed/);
  assert.match(captureErrorMessage(err("NotFoundError")), /^no camera or microphone was found/);
  assert.match(captureErrorMessage(err("NotFoundError"), "microphone"), /^no microphone was found/);
  assert.match(captureErrorMessage(err("NotReadableError"), "video"), /^the camera is busy/);
  assert.match(captureErrorMessage(err("OverconstrainedError", { constraint: "width" }), "video"),
    /choose a lower resolution/);
  assert.match(captureErrorMessage(err("OverconstrainedError", { constraint: "deviceId" })), /no longer there/);
  assert.match(captureErrorMessage(err("TypeError")), /not available: browser words/);
});

test("WHIP refusals: token and offer refusals are final, the rest is tried again", () => {
  assert.deepEqual(whipFailure(401, "401: wrong token for publishing"),
    { message: "publish token refused (401: wrong token for publishing)", retry: false });
  assert.equal(whipFailure(403, "403: x").retry, false);
  for (const status of [400, 415, 422]) {
    const f = whipFailure(status, `${status}: offer has no codec the relay forwards (AV1)`);
    assert.equal(f.retry, false);
    assert.match(f.message, /^the relay refused this offer \(\d{3}: .*\(AV1\)\)$/);
  }
  for (const status of [null, 409, 429, 500, 502, 503]) {
    assert.equal(whipFailure(status, "x").retry, true, String(status));
  }
  assert.match(whipFailure(null, "Failed to fetch").message, /could not be reached \(Failed to fetch\)/);
  assert.equal(whipFailure(404, "404: no").retry, false);
  assert.equal(whipFailure(418, "418: teapot").retry, false);
});

test("backoff doubles from half a second to its ceiling, and starts over on reset", () => {
  const b = new Backoff();
  assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next()], [500, 1000, 2000, 4000, 4000]);
  b.reset();
  assert.equal(b.next(), 500);
});

test("link health: failed or a closed DTLS is lost, disconnected is unsteady", () => {
  assert.equal(linkHealth({ connection: "connected", ice: "connected", dtls: "connected" }), "up");
  assert.equal(linkHealth({ connection: "connecting", ice: "checking", dtls: "new" }), "pending");
  assert.equal(linkHealth({ connection: "disconnected", ice: "disconnected", dtls: "connected" }), "unsteady");
  assert.equal(linkHealth({ connection: "failed", ice: "failed" }), "lost");
  // The relay ending the session closes its DTLS before ICE notices anything.
  assert.equal(linkHealth({ connection: "connected", ice: "connected", dtls: "closed" }), "lost");
});

// A fake WHIP session for the Republisher: the test fires its link events.
class FakeSession {
  constructor(id) {
    this.id = id;
    this.closed = 0;
    this.handlers = null;
  }

  watch(handlers) {
    this.handlers = handlers;
    return () => { this.handlers = null; };
  }

  async close() {
    this.closed += 1;
    return 200;
  }
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

function harness(outcomes) {
  const log = [];
  const sessions = [];
  const sleeps = [];
  const r = new Republisher({
    connect: async (attempt) => {
      log.push(`connect ${attempt}`);
      const next = outcomes.shift();
      if (next instanceof Error) throw next;
      const s = new FakeSession(attempt);
      sessions.push(s);
      return s;
    },
    classify: (err) => whipFailure(err.status ?? null, err.message),
    sleep: async (ms) => { sleeps.push(ms); },
    onState: (state, detail) => log.push(detail?.reason ? `${state}: ${detail.reason}` : state),
  });
  return { r, log, sessions, sleeps };
}

const httpError = (status, message) => Object.assign(new Error(message), { status });

test("a dropped session is closed and the stream published again, backoff reset once on air", async () => {
  const { r, log, sessions, sleeps } = harness(["ok", httpError(409, "409: stream has a publisher"), "ok", "ok"]);
  const done = r.run();
  await tick();
  sessions[0].handlers.onConnected();
  sessions[0].handlers.onDrop("disconnected for over 1.5 s");
  for (let i = 0; i < 10 && sessions.length < 2; i++) await tick();
  assert.equal(sessions[0].closed, 1, "the old resource is DELETEd before publishing again");
  assert.equal(sessions[0].handlers, null, "and no longer watched");
  sessions[1].handlers.onConnected();
  assert.equal(r.connects, 2);
  // On air again: the next drop waits the first delay again.
  sessions[1].handlers.onDrop("the relay ended the session");
  for (let i = 0; i < 10 && sessions.length < 3; i++) await tick();
  assert.deepEqual(sleeps, [500, 1000, 500]);
  r.stop();
  assert.equal(await done, "stopped");
  assert.equal(sessions[2].closed, 1, "stop closes the session on air");
  const drop = "reconnecting: disconnected for over 1.5 s";
  const busy = "reconnecting: the relay answered 409: stream has a publisher";
  const ended = "reconnecting: the relay ended the session";
  assert.deepEqual(log, [
    "connecting", "connect 1", "publishing",
    drop, drop, "connect 2", busy, busy, "connect 3", "publishing",
    ended, ended, "connect 4",
  ]);
  assert.equal(log.filter((l) => l === "publishing").length, 2);
});

test("a refused token ends the loop at once, with the message, and nothing is retried", async () => {
  const { r, log, sleeps } = harness([httpError(401, "401: wrong token for publishing")]);
  assert.equal(await r.run(), "failed");
  assert.deepEqual(sleeps, []);
  assert.deepEqual(log.filter((l) => !l.startsWith("connect ")),
    ["connecting", "failed"]);
  assert.equal(r.running, false);
});

test("a refusal while reconnecting is final too; the network failing is not", async () => {
  const { r, log, sessions } = harness(["ok", new TypeError("Failed to fetch"),
    httpError(415, "415: offer refused")]);
  const done = r.run();
  await tick();
  sessions[0].handlers.onDrop("the connection failed");
  assert.equal(await done, "failed");
  assert.ok(log.includes("reconnecting: the relay could not be reached (Failed to fetch)"), log);
});

test("stop while waiting to reconnect ends the loop without another attempt", async () => {
  let slept = 0;
  const sessions = [];
  const r = new Republisher({
    connect: async () => {
      sessions.push(new FakeSession(sessions.length + 1));
      return sessions.at(-1);
    },
    classify: () => ({ retry: true, message: "x" }),
    sleep: () => { slept += 1; return new Promise(() => {}); }, // a wait that never ends
  });
  const done = r.run();
  await tick();
  sessions[0].handlers.onDrop("the connection failed");
  for (let i = 0; i < 10 && slept === 0; i++) await tick();
  r.stop();
  assert.equal(await done, "stopped");
  assert.equal(sessions.length, 1);
  assert.equal(sessions[0].closed, 1);
});
