// The viewer page: WHEP media + `sync` records -> capture time of the frame on screen -> captions.

import { CaptionTracks } from "./captiontracks.js";
import { CueBook } from "./captions.js";
import { browserNowNs, ClockJoin, joinClock, joinInRounds, parseResponse } from "./clocksync.js";
import { ViewerControls } from "./controls.js";
import { Liveness } from "./playermodel.js";
import { PlayoutMeter } from "./playout.js";
import { parseMessage, serializeMessage, SOURCES, SyncState } from "./syncwire.js";
import * as ui from "./ui.js";
import { connectWhep } from "./whep.js";
import { wsUrl } from "./wsurl.js";

const params = new URLSearchParams(window.location.search);
const stream = params.get("stream") ?? "demo";
const token = params.get("token") ?? undefined;
const mode = params.get("mode") === "mse" ? "mse" : "webrtc";

const sync = new SyncState();
const book = new CueBook();
const video = document.getElementById("video");
const stats = { presented: 0, mapped: 0, badMessages: 0, reconnects: 0, sessionChecks: 0 };
const TELEMETRY_INTERVAL_MS = 10000; // a few reports a minute: proto/sync.md "telemetry"
// Playout reports feed the operator dashboard, which shows one point a second.
const PLAYOUT_INTERVAL_MS = 2000;
const playout = new PlayoutMeter();
let syncChannel = null;
let reported = { presented: 0, mapped: 0, lost: 0, resets: 0 };
// The player controls (sound, captions, fullscreen, the live badge) and whether the stream is
// live, stalled or offline (the message over the picture).
const controls = new ViewerControls({ video });
const liveness = new Liveness();
if (params.get("lang") !== null) controls.prefs.set({ lang: params.get("lang") });
// Exposed for the dashboard, debugging and end-to-end tests.
window.sfuViewer = { stream, sync, book, stats, playout, controls, liveness, frameListeners: [] };

function showLiveness() {
  controls.showState(liveness.state, liveness.message());
}

// No frame for a while: ask the service whether the stream still has a publisher, so the page
// can say "offline" (and keep waiting for it) rather than show a frozen picture in silence.
async function checkLiveness() {
  if (!liveness.tick(performance.now())) return;
  showLiveness();
  let live = false;
  try {
    const resp = await fetch(`/api/streams/${encodeURIComponent(stream)}`, {
      headers: token ? { Authorization: `Bearer ${token}` } : {}, cache: "no-store",
    });
    live = resp.ok && (await resp.json()).publisher != null;
  } catch {
    live = false; // the service itself is unreachable: offline as far as this viewer can tell
  }
  liveness.publisherSeen(live);
  showLiveness();
}

// Latency behind live of a frame shown at `displayMs` (performance clock) that was captured at
// `captureNs` (house time): needs the page's house clock offset, null before it is known.
function latencyMs(captureNs, displayMs, offsetNs) {
  if (captureNs === null || offsetNs === null) return null;
  const displayNs = BigInt(Math.round((performance.timeOrigin + displayMs) * 1e6)) + offsetNs;
  return Number(displayNs - captureNs) / 1e6;
}

function frameShown(captureNs, displayMs, offsetNs) {
  const wasLive = liveness.state === "live";
  liveness.frame(performance.now());
  if (!wasLive) showLiveness();
  controls.frame(latencyMs(captureNs, displayMs, offsetNs));
}

function trackIndexForMid(mid) {
  for (const [track, anchor] of sync.current) if (anchor.mid === mid) return track;
  return null;
}

// Capture time of the audio heard when the frame shows: the last played audio packet's
// timestamp mapped through the sync records, moved on by the time between its playout and
// the frame's display. Chromium stamps synchronization sources in wall-clock ms (like
// Date.now()), rVFC's display time is on the performance clock: timeOrigin joins the two.
function audioCaptureNs(displayTime) {
  const transceiver = session?.pc.getTransceivers().find((x) => x.receiver.track.kind === "audio");
  const track = transceiver?.mid == null ? null : trackIndexForMid(transceiver.mid);
  const source = transceiver?.receiver.getSynchronizationSources()[0];
  if (track === null || source === undefined) return null;
  const captured = sync.captureOf(track, source.rtpTimestamp);
  if (captured === null) return null;
  const sincePlayedMs = performance.timeOrigin + displayTime - source.timestamp;
  // A browser stamping sources on another clock would make the correction nonsense: skip it.
  if (!(Math.abs(sincePlayedMs) < 200)) return captured;
  return captured + BigInt(Math.round(sincePlayedMs * 1e6));
}

// Clock join over the sync channel (proto/clock.md): the page learns house time, so its
// telemetry is stamped on the house clock and the relay sees this viewer's offset.
const REJOIN_MS = 60000;
const JOIN_MAX_EXCHANGES = 48;
const clockJoin = new ClockJoin(JOIN_MAX_EXCHANGES); // the least-delay exchange of a whole join

function sendControl(message) {
  if (syncChannel !== null && syncChannel.readyState === "open") {
    syncChannel.send(serializeMessage({ kind: "control", message }));
  }
}

async function joinHouseClock() {
  const report = await joinInRounds(sendControl, clockJoin, { maxExchanges: JOIN_MAX_EXCHANGES });
  if (report !== null) sendControl(report);
}

function houseNowNs() {
  const best = clockJoin.best();
  return browserNowNs() + (best === null ? 0n : best.offsetNs);
}

function onSyncMessage(event) {
  let msg;
  try {
    msg = parseMessage(new Uint8Array(event.data));
  } catch (err) {
    stats.badMessages++; // count and carry on: one bad message must not stop the captions
    console.warn("sync message dropped:", err.message);
    return;
  }
  for (const control of sync.ingest(msg)) {
    if (control.type === "clock_resp") clockJoin.response(parseResponse(control), browserNowNs());
    else book.apply(control);
  }
}

// Captions as VTTCues on a text track per language of the <video> (rendered by the browser,
// selectable), placed for each presented frame by its capture time (captiontracks.js).
let shownLang = null;
const captions = new CaptionTracks({
  video, hidden: true, // until the controls apply the viewer's choice
  onLanguages: (langs) => {
    controls.setLanguages(langs);
    shownLang = controls.shownLanguage();
  },
});

// The controls show the chosen language's track; the page reports that one's cues as shown.
controls.onLanguage = (lang) => {
  shownLang = lang;
};

// Places every cue for the frame at stream time `streamS`; returns the cues shown with it.
function showCues(streamS) {
  return captions.placeBook(streamS, video.currentTime, book.cues, () => shownLang);
}

function onFrame(now, meta) {
  stats.presented++;
  lastFrameMs = performance.now();
  const mid = videoTransceiverMid();
  const track = mid === null ? null : trackIndexForMid(mid);
  const captureNs = track === null || meta.rtpTimestamp === undefined
    ? null : sync.captureOf(track, meta.rtpTimestamp);
  if (captureNs !== null) stats.mapped++;
  const streamS = book.streamSeconds(captureNs);
  const cues = streamS === null ? [] : showCues(streamS);
  for (const cue of cues) playout.caption(cue, streamS);
  if (captureNs !== null) playout.frame(captureNs, audioCaptureNs(meta.expectedDisplayTime ?? now));
  frameShown(captureNs, meta.expectedDisplayTime ?? now, clockJoin.best()?.offsetNs ?? null);
  const anchor = track === null ? undefined : sync.current.get(track);
  ui.showFrameInfo({
    streamS, source: anchor ? (typeof anchor.source === "number" ? SOURCES[anchor.source] : anchor.source) : null, mapped: stats.mapped,
    presented: stats.presented, lostBatches: sync.lostBatches,
  });
  const record = { rtpTimestamp: meta.rtpTimestamp, captureNs, streamS, mediaTime: meta.mediaTime };
  for (const listener of window.sfuViewer.frameListeners) listener(record, meta);
  if (streamS !== null && stats.presented % 300 === 0) book.prune(streamS);
  video.requestVideoFrameCallback(onFrame);
}

// Tells the relay how well this viewer maps frames (shown per viewer in /api/sync).
function sendTelemetry() {
  if (syncChannel === null || syncChannel.readyState !== "open") return;
  const now = { presented: stats.presented, mapped: stats.mapped, lost: sync.lostBatches };
  const message = {
    type: "telemetry", stream, t_ns: houseNowNs(),
    presented: now.presented - reported.presented, mapped: now.mapped - reported.mapped,
    lost_batches: now.lost - reported.lost,
  };
  syncChannel.send(serializeMessage({ kind: "control", message }));
  reported = { ...now, resets: reported.resets };
}

// A/V skew and caption timing for the operator dashboard (proto/sync.md "playout").
function sendPlayout() {
  if (syncChannel === null || syncChannel.readyState !== "open") return;
  playout.resync(sync.resets - reported.resets);
  reported.resets = sync.resets;
  syncChannel.send(serializeMessage({ kind: "control", message: playout.report(stream, houseNowNs()) }));
}

let session = null;
function videoTransceiverMid() {
  const t = session?.pc.getTransceivers().find((x) => x.receiver.track.kind === "video");
  return t?.mid ?? null;
}

// A lost connection (the relay restarted, the worker serving it died, the network dropped) or
// a stream not published yet is tried again, 0.5 s doubling to 8 s, reset once connected. A
// refusal that trying again cannot change (bad token, bad request) is shown and left.
const RECONNECT_FIRST_MS = 500;
const RECONNECT_MAX_MS = 8000;
const FINAL_STATUSES = new Set([400, 401, 403, 413, 415, 422]);
// Chromium says "disconnected" once ICE consent checks go unanswered for a few seconds; one
// that lasts this much longer is a lost connection (a blip recovers well within it).
const DISCONNECTED_GIVE_UP_MS = 3000;
// Video that stops for this long makes the page ask the server whether it still holds the
// session (WhepSession.exists): a restarted server or a dead worker answers 404 at once, while
// Chromium takes several seconds to call the silent connection "disconnected". A publisher
// that pauses leaves the session in place (answered 204), so nothing else happens.
const STALL_CHECK_MS = 2000;
const LIVENESS_CHECK_MS = 500;
let reconnectDelayMs = RECONNECT_FIRST_MS;
let reconnectTimer = null;
let lastFrameMs = performance.now();
let lastCheckMs = 0;

async function checkSession(why) {
  const checked = session;
  if (checked === null) return;
  lastCheckMs = performance.now();
  stats.sessionChecks++;
  if ((await checked.exists()) === false && session === checked) {
    reconnectLater(`${why}; the server no longer has this session`);
  }
}

function watchStall() {
  const now = performance.now();
  if (session === null || reconnectTimer !== null) return;
  if (now - lastFrameMs >= STALL_CHECK_MS && now - lastCheckMs >= STALL_CHECK_MS) {
    checkSession("no video");
  }
}

function reconnectLater(why) {
  if (reconnectTimer !== null) return;
  const delay = reconnectDelayMs;
  reconnectDelayMs = Math.min(2 * reconnectDelayMs, RECONNECT_MAX_MS);
  ui.setStatus(`stream "${stream}": ${why}; trying again in ${(delay / 1000).toFixed(1)} s`, true);
  liveness.connecting("reconnecting");
  showLiveness();
  reconnectTimer = setTimeout(() => {
    reconnectTimer = null;
    stats.reconnects++;
    connect();
  }, delay);
}

async function connect() {
  const old = session;
  session = null;
  window.sfuViewer.session = null;
  if (old !== null) old.close(); // not awaited: its server may be gone
  sync.restart();
  ui.setStatus(`connecting to stream "${stream}"…`);
  liveness.connecting();
  showLiveness();
  const media = new MediaStream();
  video.srcObject = media;
  let opened = null;
  try {
    opened = await connectWhep(`/whep/${encodeURIComponent(stream)}`, {
      token,
      onTrack: (event) => media.addTrack(event.track),
      onSyncChannel: (channel) => {
        syncChannel = channel;
        channel.addEventListener("message", onSyncMessage);
        channel.addEventListener("open", joinHouseClock);
        channel.addEventListener("close", () => {
          if (opened !== null && session === opened) reconnectLater("sync channel closed");
        });
      },
    });
  } catch (err) {
    if (FINAL_STATUSES.has(err.status)) {
      ui.setStatus(String(err.message ?? err), true);
      liveness.error(String(err.message ?? err));
      showLiveness();
    } else {
      reconnectLater(String(err.message ?? err));
    }
    return;
  }
  session = opened;
  window.sfuViewer.session = opened;
  let giveUp = null;
  opened.pc.addEventListener("connectionstatechange", () => {
    if (session !== opened) return; // an old connection closing
    const state = opened.pc.connectionState;
    clearTimeout(giveUp);
    if (state === "failed" || state === "closed") {
      reconnectLater(`connection ${state}`);
      return;
    }
    if (state === "connected") reconnectDelayMs = RECONNECT_FIRST_MS;
    if (state === "disconnected") {
      giveUp = setTimeout(() => {
        if (session === opened) reconnectLater("connection lost");
      }, DISCONNECTED_GIVE_UP_MS);
      checkSession("connection disconnected");
    }
    ui.setStatus(`stream "${stream}": ${state}`);
  });
  controls.play();
}

function start() {
  video.requestVideoFrameCallback(onFrame);
  window.sfuViewer.sendTelemetry = sendTelemetry;
  window.sfuViewer.sendPlayout = sendPlayout;
  setInterval(sendTelemetry, TELEMETRY_INTERVAL_MS);
  setInterval(sendPlayout, PLAYOUT_INTERVAL_MS);
  setInterval(joinHouseClock, REJOIN_MS);
  setInterval(watchStall, STALL_CHECK_MS / 4);
  setInterval(checkLiveness, LIVENESS_CHECK_MS);
  connect();
}

// MSE mode: HTTP segments and caption chunks, no WebRTC (mse.js); the stats panel and
// window.sidecarStats show its resyncs.
async function startMse() {
  const { MsePlayer } = await import("./mse.js");
  const lag = Number.parseFloat(params.get("lag") ?? "");
  const player = new MsePlayer({
    video, stream, token, lang: controls.prefs.get("lang"),
    onStatus: (text, isError) => ui.setStatus(text, isError),
    mayPlay: () => !controls.userPaused,
    play: () => controls.play(),
    // Low latency unless asked for whole segments (`&latency=segments`): a part behind the
    // live edge instead of a segment or two.
    lowLatency: params.get("latency") !== "segments", lagS: Number.isFinite(lag) && lag > 0 ? lag : null,
  });
  window.sfuViewer.player = player;
  controls.mayResume = () => !player.holding;
  controls.onLanguage = (lang) => player.selectLanguage(lang);
  // The house clock for the latency behind live (capture time of the frame on screen); MSE has
  // no sync channel, so the page joins over the clock WebSocket, renewed like the channel join.
  let clock = null;
  const join = async () => {
    try {
      clock = await joinClock(wsUrl("/api/clock/ws"));
    } catch {
      /* keep the last join: the latency shown is only as good as it, and none is shown without */
    }
  };
  join();
  setInterval(join, REJOIN_MS);
  player.frameListeners.push((record, meta) => {
    const epoch = player.index?.epoch_ns;
    const captureNs = epoch == null || record.frameS == null
      ? null : BigInt(epoch) + BigInt(Math.round(record.frameS * 1e9));
    frameShown(captureNs, meta.expectedDisplayTime ?? performance.now(), clock?.offsetNs ?? null);
  });
  setInterval(checkLiveness, LIVENESS_CHECK_MS);
  Object.defineProperty(window, "sidecarStats", { get: () => player.snapshot(), configurable: true });
  setInterval(() => {
    const snapshot = player.snapshot();
    ui.showMseStats(snapshot);
    controls.setLanguages([...player.tracks.keys()]);
  }, 500);
  try {
    await player.start();
  } catch (err) {
    ui.setStatus(String(err.message ?? err), true);
  }
}

ui.showMode(mode, params, stream);
if (mode === "mse") {
  startMse();
} else {
  window.sidecarStats = Object.assign(stats, { mode });
  start();
}
