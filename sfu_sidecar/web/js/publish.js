// The publisher page: camera (chosen camera and microphone, resolution, bitrate, a level meter)
// or screen -> WHIP, kept on air across network drops; connection state and outgoing bitrate, a
// house clock join, and captions stamped with the house time of the moment they are sent.
// The network is whip.js's and ingest.js's; the decisions are publishcore.js's.

import { browserNowNs, joinClock } from "./clocksync.js";
import { postCaptions } from "./ingest.js";
import {
  audioConstraints, BitrateMeter, captureErrorMessage, cueBody, deviceChoices, durationNs,
  formatBitrate, InputError, Republisher, sentCodecs, videoConstraints,
} from "./publishcore.js";
import { LevelMeter } from "./levelmeter.js";
import { fillSelect } from "./ui.js";
import { publishWhip, whipErrorFailure } from "./whip.js";
import { wsUrl } from "./wsurl.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(window.location.search);
$("stream").value = params.get("stream") ?? "demo";
$("token").value = params.get("token") ?? "";

const STATS_INTERVAL_MS = 1000;
const METER_INTERVAL_MS = 100;
const REJOIN_MS = 60_000; // as the viewer page: a browser clock drifts, the join is renewed
// A connection disconnected this long is given up and published again (ICE may recover
// from a shorter blip by itself); one that does not come up in CONNECT_TIMEOUT_MS neither.
const DROP_GRACE_MS = 1500;
const CONNECT_TIMEOUT_MS = 8000;

let media = null; // the local tracks, kept across reconnections; ended by Stop
let mediaSource = null; // "camera" | "screen": what `media` holds
let session = null; // the WHIP session now on air (or connecting)
let republisher = null;
let running = null; // republisher.run()'s promise
let statsTimer = null;
let clock = null;
let meter = new BitrateMeter();

// Exposed for debugging and end-to-end tests; the page's whole state, read-only to them.
const page = {
  // idle | previewing | starting | publishing | reconnecting | stopping | stopped | failed
  state: "idle",
  connection: null, error: null, deleteStatus: null, stampsCaptureTime: null,
  bitrate: {}, codecs: {}, bytesSent: {}, video: {},
  sessionUrl: null, sessions: 0, reconnects: 0, lastDrop: null,
  devices: { cameras: [], microphones: [] }, micLevel: 0, micLevelPeak: 0,
  resolution: null, maxBitrate: null, appliedMaxBitrate: null,
  trackIds: {}, sentTrackIds: {}, // the local tracks, and those the session on air sends
  clock: { state: "joining", offsetNs: null, errorNs: null, rttNs: null, error: null },
  lastCue: null, lastReply: null,
};
window.sfuPublisher = page;

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.className = kind;
}

function showError(message) {
  page.error = message;
  setStatus(message, "error");
}

function setPublishing(on) {
  $("start").disabled = on;
  $("stop").disabled = !on;
  for (const el of document.querySelectorAll("#settings input, #settings select")) el.disabled = on;
}

function watchLink() {
  const url = new URL("/", window.location.href);
  url.searchParams.set("stream", $("stream").value.trim());
  $("watch").href = url.href;
}

async function rejoin() {
  try {
    clock = await joinClock(wsUrl("/api/clock/ws"));
    Object.assign(page.clock, { state: "joined", offsetNs: clock.offsetNs, errorNs: clock.errorNs,
      rttNs: clock.rttNs, error: null });
    $("clock").textContent = `${(Number(clock.offsetNs) / 1e6).toFixed(3)} ms ± ` +
      `${(Number(clock.errorNs) / 1e6).toFixed(3)} ms`;
  } catch (err) {
    // Keep the last good join: a cue is better stamped with it than not sent.
    Object.assign(page.clock, { state: clock === null ? "failed" : "joined (renewal failed)",
      error: String(err.message ?? err) });
    $("clock").textContent = `${page.clock.state}: ${page.clock.error}`;
  }
}

// --- Devices ---------------------------------------------------------------------------

function currentDeviceId(kind) {
  const track = media?.getTracks().find((t) => t.kind === kind);
  return track?.getSettings().deviceId ?? null;
}

async function refreshDevices() {
  if (!navigator.mediaDevices?.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  const cameras = deviceChoices(devices, "videoinput", currentDeviceId("video") ?? $("camera").value);
  const mics = deviceChoices(devices, "audioinput", currentDeviceId("audio") ?? $("microphone").value);
  fillSelect($("camera"), cameras, "no camera found");
  fillSelect($("microphone"), mics, "no microphone found");
  page.devices = { cameras: cameras.options, microphones: mics.options };
}

// --- Microphone level ------------------------------------------------------------------

const micMeter = new LevelMeter(METER_INTERVAL_MS, (value) => {
  page.micLevel = value;
  page.micLevelPeak = Math.max(page.micLevelPeak, value);
  $("mic-level").value = value;
  $("mic-level").textContent = `${Math.round(value * 100)}%`;
});

function stopMeter() {
  micMeter.stop();
  page.micLevel = 0;
  $("mic-level").value = 0;
  $("mic-level").textContent = "0";
}

function startMeter(track) {
  stopMeter();
  page.micLevelPeak = 0;
  micMeter.start(track);
}

// --- Capture ---------------------------------------------------------------------------

function chosenSource() {
  return document.querySelector("input[name=source]:checked").value;
}

function onTrackEnded(event) {
  // A shared screen can be ended from the browser's own bar: that ends the publication too.
  if (mediaSource === "screen") return stop("source ended");
  showError(`the ${event.target.kind === "video" ? "camera" : "microphone"} stopped (unplugged?): choose another one above`);
}

function adopt(stream, source) {
  media = stream;
  mediaSource = source;
  for (const track of media.getTracks()) track.addEventListener("ended", onTrackEnded);
  $("preview").srcObject = media;
  startMeter(media.getAudioTracks()[0]);
  showVideoSize();
  showTracks();
}

async function capture(source) {
  if (source === "screen") {
    return navigator.mediaDevices.getDisplayMedia({ video: { frameRate: 30 }, audio: true });
  }
  page.resolution = $("resolution").value;
  return navigator.mediaDevices.getUserMedia({
    video: videoConstraints(page.resolution, $("camera").value),
    audio: audioConstraints($("microphone").value),
  });
}

// The local tracks for `source`, asked for when there are none (or they are of the other
// source); null after showing why they could not be had.
let capturing = null; // the capture in progress: Preview and Start pressed together ask once

function ensureMedia(source) {
  if (media !== null && mediaSource === source) return Promise.resolve(media);
  capturing ??= captureMedia(source).finally(() => { capturing = null; });
  return capturing;
}

async function captureMedia(source) {
  releaseMedia();
  setStatus(`asking for the ${source === "screen" ? "screen" : "camera and microphone"}…`);
  let stream;
  try {
    stream = await capture(source);
  } catch (err) {
    showError(captureErrorMessage(err, source === "screen" ? "screen" : "camera"));
    return null;
  }
  adopt(stream, source);
  // Labels are only listed once permission is given.
  await refreshDevices().catch(() => {});
  return media;
}

function showTracks() {
  page.trackIds = Object.fromEntries((media?.getTracks() ?? []).map((t) => [t.kind, t.id]));
  page.sentTrackIds = Object.fromEntries((session?.pc.getSenders() ?? []).filter((x) => x.track)
    .map((x) => [x.track.kind, x.track.id]));
}

function releaseMedia() {
  stopMeter();
  if (media !== null) {
    for (const track of media.getTracks()) {
      track.removeEventListener("ended", onTrackEnded);
      track.stop();
    }
  }
  media = null;
  mediaSource = null;
  $("preview").srcObject = null;
  $("video-size").textContent = "–";
}

function showVideoSize() {
  const s = media?.getVideoTracks()[0]?.getSettings();
  $("video-size").textContent = s?.width ? `${s.width}×${s.height}${s.frameRate ? ` at ${Math.round(s.frameRate)} fps` : ""}` : "–";
}

// Another camera or microphone: a new track of that kind takes the old one's place, on the
// sender too while publishing (no renegotiation).
async function switchDevice(kind) {
  if (media === null || mediaSource !== "camera") return;
  const deviceId = $(kind === "video" ? "camera" : "microphone").value;
  const old = media.getTracks().find((t) => t.kind === kind);
  if (old?.getSettings().deviceId === deviceId) return;
  let track;
  try {
    const constraints = kind === "video"
      ? { video: videoConstraints($("resolution").value, deviceId) }
      : { audio: audioConstraints(deviceId) };
    [track] = (await navigator.mediaDevices.getUserMedia(constraints)).getTracks();
  } catch (err) {
    showError(captureErrorMessage(err, kind === "video" ? "video" : "microphone"));
    return;
  }
  try {
    if (session !== null) await session.replaceTrack(track);
  } catch (err) {
    track.stop();
    showError(`could not switch the ${kind === "video" ? "camera" : "microphone"}: ${err.message ?? err}`);
    return;
  }
  if (old) {
    old.removeEventListener("ended", onTrackEnded);
    media.removeTrack(old);
    old.stop();
  }
  track.addEventListener("ended", onTrackEnded);
  media.addTrack(track);
  $("preview").srcObject = media;
  if (kind === "audio") startMeter(track);
  else showVideoSize();
  showTracks();
  page.error = null;
  if (page.state !== "publishing") setStatus(`${kind === "video" ? "camera" : "microphone"} switched`);
}

async function changeResolution() {
  page.resolution = $("resolution").value;
  const track = media?.getVideoTracks()[0];
  if (!track || mediaSource !== "camera") return;
  try {
    await track.applyConstraints(videoConstraints(page.resolution, null));
  } catch (err) {
    showError(captureErrorMessage(err, "video"));
  }
  showVideoSize();
}

async function changeBitrate() {
  const bps = Number($("bitrate").value) || null;
  page.maxBitrate = bps;
  if (session === null) return;
  try {
    await session.setMaxBitrate(bps);
    page.appliedMaxBitrate = session.sender("video")?.getParameters().encodings?.[0]?.maxBitrate ?? null;
  } catch (err) {
    showError(`could not change the video bitrate: ${err.message ?? err}`);
  }
}

// --- Publishing ------------------------------------------------------------------------

async function sampleStats() {
  if (session === null) return;
  const reports = [...(await session.pc.getStats()).values()];
  const rates = meter.update(reports);
  page.bitrate = rates;
  page.codecs = sentCodecs(reports);
  page.bytesSent = {};
  for (const r of reports) {
    if (r.type !== "outbound-rtp") continue;
    page.bytesSent[r.kind] = (page.bytesSent[r.kind] ?? 0) + r.bytesSent;
    if (r.kind === "video") {
      page.video = { width: r.frameWidth ?? null, height: r.frameHeight ?? null,
        targetBitrate: r.targetBitrate ?? null, qualityLimitationReason: r.qualityLimitationReason ?? null };
    }
  }
  $("video-bitrate").textContent = formatBitrate(rates.video)
    + (page.appliedMaxBitrate ? ` (at most ${formatBitrate(page.appliedMaxBitrate)})` : "");
  $("audio-bitrate").textContent = formatBitrate(rates.audio);
  $("codecs").textContent = Object.entries(page.codecs).map(([k, v]) => `${k} ${v}`).join(", ") || "–";
}

function showConnection(pc) {
  if (session === null || session.pc !== pc) return;
  page.connection = pc.connectionState;
  $("state").textContent = pc.connectionState;
}

// One WHIP session for the Republisher: publishes the current tracks with the current
// bitrate ceiling; its close() records the DELETE's answer.
async function connectOnce(settings) {
  const s = await publishWhip(`/whip/${encodeURIComponent(settings.stream)}`, media, {
    token: settings.token, codec: settings.codec, maxBitrate: page.maxBitrate,
  });
  session = s;
  page.sessionUrl = s.resourceUrl;
  page.sessions += 1;
  page.connection = s.pc.connectionState;
  page.appliedMaxBitrate = s.sender("video")?.getParameters().encodings?.[0]?.maxBitrate ?? null;
  s.pc.addEventListener("connectionstatechange", () => showConnection(s.pc));
  meter = new BitrateMeter();
  $("sessions").textContent = `${page.sessions} (${page.reconnects})`;
  showTracks();
  return {
    watch: (handlers) => s.watch({ ...handlers, graceMs: DROP_GRACE_MS, connectTimeoutMs: CONNECT_TIMEOUT_MS }),
    close: async () => {
      if (session === s) session = null;
      page.deleteStatus = await s.close();
      return page.deleteStatus;
    },
  };
}

function onRepublisherState(state, detail) {
  if (state === "connecting") {
    page.state = "starting";
    setStatus(`publishing to /whip/${page.stream}…`);
  } else if (state === "publishing") {
    page.state = "publishing";
    page.error = null;
    page.connection = "connected";
    $("state").textContent = "connected";
    page.stampsCaptureTime = session?.stampsCaptureTime ?? null;
    $("stamps").textContent = page.stampsCaptureTime
      ? "stamped by this browser (abs-capture-time), moved to house time by the relay's estimate"
      : "not stamped: the relay maps them from sender reports or arrival";
    setStatus(`publishing stream "${page.stream}"` + (page.reconnects ? ` (reconnected ${page.reconnects}×)` : ""), "ok");
  } else if (state === "reconnecting") {
    if (page.state !== "reconnecting") {
      page.reconnects += 1;
      page.lastDrop = detail.reason;
    }
    page.state = "reconnecting";
    $("state").textContent = "reconnecting…";
    $("sessions").textContent = `${page.sessions} (${page.reconnects})`;
    const wait = detail.delayMs ? `; trying again in ${(detail.delayMs / 1000).toFixed(1)} s` : "";
    setStatus(`reconnecting… (${detail.reason ?? "connection lost"})${wait}`, "warn");
  } else if (state === "failed") {
    fail(detail.message);
  }
}

async function start() {
  const stream = $("stream").value.trim();
  const token = $("token").value.trim() || undefined;
  const source = chosenSource();
  const codec = $("codec").value;
  Object.assign(page, { state: "starting", stream, source, codec, error: null, deleteStatus: null,
    connection: null, sessions: 0, reconnects: 0, lastDrop: null, sessionUrl: null });
  page.maxBitrate = Number($("bitrate").value) || null;
  setPublishing(true);
  if (await ensureMedia(source) === null) {
    page.state = "failed";
    $("state").textContent = "not published";
    setPublishing(false);
    return;
  }
  const settings = { stream, token, codec };
  republisher = new Republisher({
    connect: () => connectOnce(settings),
    classify: whipErrorFailure,
    sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
    onState: onRepublisherState,
  });
  statsTimer = setInterval(() => sampleStats().catch(() => {}), STATS_INTERVAL_MS);
  running = republisher.run();
}

// A refusal retrying cannot fix: shown, nothing published; the preview stays, to try again.
function fail(reason) {
  page.state = "failed";
  showError(reason);
  $("state").textContent = "not published";
  clearInterval(statsTimer);
  statsTimer = null;
  republisher = null;
  running = null;
  setPublishing(false);
}

async function stop(why = "stopped") {
  if (republisher === null) return;
  const ending = republisher;
  const finished = running;
  republisher = null;
  running = null;
  page.state = "stopping";
  clearInterval(statsTimer);
  statsTimer = null;
  ending.stop();
  await finished; // closes the session on air: the DELETE's answer is in page.deleteStatus
  releaseMedia();
  page.state = "stopped";
  page.connection = "closed";
  $("state").textContent = "not published";
  for (const id of ["video-bitrate", "audio-bitrate", "codecs", "stamps"]) $(id).textContent = "–";
  setStatus(page.deleteStatus === 200 ? `stopped (${why}); the session was ended`
    : `stopped (${why}); ending the session answered ${page.deleteStatus ?? "nothing"}`,
  page.deleteStatus === 200 ? "" : "error");
  setPublishing(false);
}

async function preview() {
  if (await ensureMedia(chosenSource()) === null) return;
  if (page.state === "idle" || page.state === "stopped" || page.state === "failed") page.state = "previewing";
  page.error = null;
  setStatus("previewing: press Start to publish");
}

async function sendCaption(event) {
  event.preventDefault();
  // First thing: the instant the caption is sent, on the page's clock. Everything after this
  // (validation, the request) takes time that must not move the cue.
  const localNs = browserNowNs();
  const reply = $("caption-reply");
  const show = (text, kind) => {
    reply.textContent = text;
    reply.className = kind;
  };
  if (clock === null) return show(`not sent: not joined to the house clock (${page.clock.error ?? "joining"})`, "error");
  const startNs = localNs + clock.offsetNs;
  const stream = $("stream").value.trim();
  let body;
  try {
    body = cueBody({ startNs, lengthNs: durationNs($("caption-duration").value),
      text: $("caption-text").value, lang: $("caption-lang").value.trim() });
  } catch (err) {
    if (err instanceof InputError) return show(`not sent: ${err.message}`, "error");
    throw err;
  }
  page.lastCue = { startNs: String(startNs), stream, body };
  show("sending…", "");
  const result = await postCaptions(window.location.href, stream, body, $("token").value.trim());
  page.lastReply = result;
  if (!result.ok) return show(`refused: ${result.reason}`, "error");
  const cue = JSON.parse(result.text).cues[0];
  show(`ok: cue ${cue.id} from stream ${cue.start.toFixed(3)} s to ${cue.end.toFixed(3)} s`, "ok");
  $("caption-text").value = "";
}

$("settings").addEventListener("submit", (event) => {
  event.preventDefault();
  start();
});
$("stop").addEventListener("click", () => stop());
$("devices-form").addEventListener("submit", (event) => {
  event.preventDefault();
  preview();
});
$("camera").addEventListener("change", () => switchDevice("video"));
$("microphone").addEventListener("change", () => switchDevice("audio"));
$("resolution").addEventListener("change", () => changeResolution());
$("bitrate").addEventListener("change", () => changeBitrate());
navigator.mediaDevices?.addEventListener?.("devicechange", () => refreshDevices().catch(() => {}));
$("stream").addEventListener("input", watchLink);
$("caption-form").addEventListener("submit", (event) => {
  sendCaption(event).catch((err) => {
    $("caption-reply").textContent = `not sent: ${err.message ?? err}`;
    $("caption-reply").className = "error";
  });
});
// A closed tab ends its publication at once instead of after the relay's media timeout.
window.addEventListener("pagehide", () => {
  if (session !== null) fetch(session.resourceUrl, { method: "DELETE", keepalive: true,
    headers: session.token ? { Authorization: `Bearer ${session.token}` } : {} });
});

watchLink();
setStatus("ready");
refreshDevices().catch(() => {});
// Where camera and microphone are allowed already, the preview (and level meter) starts at
// once; otherwise on Preview or Start, so the browser asks when the broadcaster expects it.
Promise.all(["camera", "microphone"].map((name) => navigator.permissions?.query({ name })))
  .then((states) => {
    if (states.every((s) => s?.state === "granted") && media === null && page.state === "idle") preview();
  })
  .catch(() => {});
rejoin();
setInterval(rejoin, REJOIN_MS);
