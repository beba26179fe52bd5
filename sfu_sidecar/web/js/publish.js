// The publisher page: camera or screen -> WHIP, connection state and outgoing bitrate, a house
// clock join, and captions stamped with the house time of the moment they are sent.

import { browserNowNs, joinClock } from "./clocksync.js";
import { postCaptions } from "./ingest.js";
import {
  BitrateMeter, cueBody, durationNs, formatBitrate, InputError, sentCodecs,
} from "./publishcore.js";
import { publishWhip } from "./whip.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(window.location.search);
$("stream").value = params.get("stream") ?? "demo";
$("token").value = params.get("token") ?? "";

const STATS_INTERVAL_MS = 1000;
const REJOIN_MS = 60_000; // as the viewer page: a browser clock drifts, the join is renewed

let media = null;
let session = null;
let statsTimer = null;
let clock = null;
let meter = new BitrateMeter();

// Exposed for debugging and end-to-end tests; the page's whole state, read-only to them.
const page = {
  state: "idle", // idle | starting | publishing | stopping | stopped | failed
  connection: null, error: null, deleteStatus: null, stampsCaptureTime: null,
  bitrate: {}, codecs: {}, bytesSent: {},
  clock: { state: "joining", offsetNs: null, errorNs: null, rttNs: null, error: null },
  lastCue: null, lastReply: null,
};
window.sfuPublisher = page;

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.className = kind;
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

function wsUrl(path) {
  const url = new URL(path, window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
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

async function sampleStats() {
  if (session === null) return;
  const reports = [...(await session.pc.getStats()).values()];
  const rates = meter.update(reports);
  page.bitrate = rates;
  page.codecs = sentCodecs(reports);
  page.bytesSent = {};
  for (const r of reports) {
    if (r.type === "outbound-rtp") page.bytesSent[r.kind] = (page.bytesSent[r.kind] ?? 0) + r.bytesSent;
  }
  $("video-bitrate").textContent = formatBitrate(rates.video);
  $("audio-bitrate").textContent = formatBitrate(rates.audio);
  $("codecs").textContent = Object.entries(page.codecs).map(([k, v]) => `${k} ${v}`).join(", ") || "–";
}

function showConnection() {
  if (session === null) return;
  const state = session.pc.connectionState;
  page.connection = state;
  $("state").textContent = state;
  if (state === "connected") setStatus(`publishing stream "${page.stream}"`, "ok");
  if (state === "failed") {
    page.error = "the media connection failed (ICE or DTLS)";
    setStatus(page.error, "error");
    stop("failed");
  }
}

async function capture(source) {
  if (source === "screen") {
    return navigator.mediaDevices.getDisplayMedia({ video: { frameRate: 30 }, audio: true });
  }
  return navigator.mediaDevices.getUserMedia({
    video: { width: 640, height: 360, frameRate: 30 }, audio: true,
  });
}

async function start() {
  const stream = $("stream").value.trim();
  const token = $("token").value.trim() || undefined;
  const source = document.querySelector("input[name=source]:checked").value;
  const codec = $("codec").value;
  Object.assign(page, { state: "starting", stream, source, codec, error: null, deleteStatus: null,
    connection: null });
  setPublishing(true);
  setStatus(`asking for the ${source === "screen" ? "screen" : "camera and microphone"}…`);
  try {
    media = await capture(source);
  } catch (err) {
    return fail(`${source === "screen" ? "screen sharing" : "camera or microphone"} not available: ${err.message ?? err}`);
  }
  $("preview").srcObject = media;
  // A shared screen can be ended from the browser's own bar: that ends the publication too.
  for (const track of media.getTracks()) track.addEventListener("ended", () => stop("source ended"));
  setStatus(`publishing to /whip/${stream}…`);
  try {
    session = await publishWhip(`/whip/${encodeURIComponent(stream)}`, media, { token, codec });
  } catch (err) {
    return fail(err.message ?? String(err));
  }
  page.state = "publishing";
  page.stampsCaptureTime = session.stampsCaptureTime;
  $("stamps").textContent = page.stampsCaptureTime
    ? "stamped by this browser (abs-capture-time), moved to house time by the relay's estimate"
    : "not stamped: the relay maps them from sender reports or arrival";
  meter = new BitrateMeter();
  session.pc.addEventListener("connectionstatechange", showConnection);
  showConnection();
  statsTimer = setInterval(() => sampleStats().catch(() => {}), STATS_INTERVAL_MS);
}

function fail(reason) {
  page.state = "failed";
  page.error = reason;
  setStatus(reason, "error");
  $("state").textContent = "not published";
  releaseMedia();
  setPublishing(false);
}

function releaseMedia() {
  if (media !== null) for (const track of media.getTracks()) track.stop();
  media = null;
  $("preview").srcObject = null;
}

async function stop(why = "stopped") {
  if (session === null) return;
  const ending = session;
  session = null;
  page.state = "stopping";
  clearInterval(statsTimer);
  statsTimer = null;
  page.deleteStatus = await ending.close();
  releaseMedia();
  page.state = why === "failed" ? "failed" : "stopped";
  page.connection = "closed";
  $("state").textContent = "not published";
  for (const id of ["video-bitrate", "audio-bitrate", "codecs", "stamps"]) $(id).textContent = "–";
  if (why !== "failed") {
    setStatus(page.deleteStatus === 200 ? `stopped (${why}); the session was ended`
      : `stopped (${why}); ending the session answered ${page.deleteStatus ?? "nothing"}`,
    page.deleteStatus === 200 ? "" : "error");
  }
  setPublishing(false);
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
rejoin();
setInterval(rejoin, REJOIN_MS);
