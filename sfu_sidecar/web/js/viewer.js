// The viewer page: the player (WebRTC: webrtcplayer.js; MSE: mse.js) on the page's <video>,
// its controls (sound, captions, fullscreen, the live badge), whether the stream is live,
// stalled or offline, and the stats panel. The players do the work; this wires them to the page.

import { joinClock } from "./clocksync.js";
import { ViewerControls } from "./controls.js";
import { latencyMs, Liveness } from "./playermodel.js";
import * as ui from "./ui.js";
import { REJOIN_MS, WebrtcPlayer } from "./webrtcplayer.js";
import { wsUrl } from "./wsurl.js";

const params = new URLSearchParams(window.location.search);
const stream = params.get("stream") ?? "demo";
const token = params.get("token") ?? undefined;
const mode = params.get("mode") === "mse" ? "mse" : "webrtc";

const video = document.getElementById("video");
const LIVENESS_CHECK_MS = 500;
// The player controls, and whether the stream is live, stalled or offline (the message over
// the picture).
const controls = new ViewerControls({ video });
const liveness = new Liveness();
if (params.get("lang") !== null) controls.prefs.set({ lang: params.get("lang") });
// Exposed for the dashboard, debugging and end-to-end tests.
window.sfuViewer = { stream, controls, liveness };

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

// A frame on screen, and how far behind live it is (ms; null while unknown).
function frameShown(behindMs) {
  const wasLive = liveness.state === "live";
  liveness.frame(performance.now());
  if (!wasLive) showLiveness();
  controls.frame(behindMs);
}

function startWebrtc() {
  const player = new WebrtcPlayer({
    video, stream, token,
    onStatus: (text, isError) => ui.setStatus(text, isError),
    onState: (state, detail) => {
      if (state === "error") liveness.error(detail);
      else liveness.connecting(detail);
      showLiveness();
    },
    onLanguages: (langs) => {
      controls.setLanguages(langs);
      player.selectLanguage(controls.shownLanguage());
    },
    play: () => controls.play(),
  });
  // The controls show the chosen language's track; the player reports that one's cues as shown.
  controls.onLanguage = (lang) => player.selectLanguage(lang);
  player.frameListeners.push((record) => {
    frameShown(record.latencyMs);
    ui.showFrameInfo({
      streamS: record.streamS, source: record.source, mapped: player.stats.mapped,
      presented: player.stats.presented, lostBatches: player.sync.lostBatches,
    });
  });
  Object.assign(window.sfuViewer, {
    player, sync: player.sync, book: player.book, playout: player.playout,
    frameListeners: player.frameListeners,
    // Send a report now (tests); the messages stay in the page.
    sendTelemetry: () => { player.sendTelemetry(); }, sendPlayout: () => { player.sendPlayout(); },
  });
  for (const [name, get] of [["session", () => player.session], ["stats", () => player.stats.snapshot()]]) {
    Object.defineProperty(window.sfuViewer, name, { get, configurable: true });
  }
  Object.defineProperty(window, "sidecarStats", {
    get: () => ({ ...player.stats.snapshot(), mode }), configurable: true,
  });
  setInterval(checkLiveness, LIVENESS_CHECK_MS);
  player.start();
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
  Object.assign(window.sfuViewer, { player, frameListeners: player.frameListeners });
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
    const { captureNs } = record;
    frameShown(latencyMs(captureNs, meta.expectedDisplayTime ?? performance.now(), clock?.offsetNs ?? null,
      performance.timeOrigin));
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
if (mode === "mse") startMse();
else startWebrtc();
