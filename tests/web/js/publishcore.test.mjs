// The pure parts of the publisher page: codec order, cue bodies, bitrate, server reasons.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  BitrateMeter, cueBody, durationNs, formatBitrate, InputError, preferredCodecs, sentCodecs,
  serverReason,
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
