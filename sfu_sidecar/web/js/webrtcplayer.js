// The viewer page's WebRTC player: WHEP media and the `sync` DataChannel -> the capture time of
// each presented frame -> captions placed on it. It joins the page's clock to the house clock
// over the channel, sends its telemetry and playout reports back to the relay, and keeps the
// connection up (reconnecting with back-off). No DOM beyond the <video> it is given: the page
// (viewer.js) shows what it reports through the callbacks and `frameListeners`.

import { CaptionTracks } from "./captiontracks.js";
import { CueBook } from "./captions.js";
import { browserNowNs, ClockJoin, joinInRounds, parseResponse } from "./clocksync.js";
import { FrameStats } from "./framestats.js";
import { latencyMs } from "./playermodel.js";
import { PlayoutMeter } from "./playout.js";
import { parseMessage, serializeMessage, SOURCES, SyncState } from "./syncwire.js";
import { connectWhep } from "./whep.js";

export const TELEMETRY_INTERVAL_MS = 10000; // a few reports a minute: proto/sync.md "telemetry"
// Playout reports feed the operator dashboard, which shows one point a second.
export const PLAYOUT_INTERVAL_MS = 2000;
// The clock join over the sync channel (proto/clock.md) is renewed: a browser's clock drifts.
export const REJOIN_MS = 60000;
export const JOIN_MAX_EXCHANGES = 48;
// A lost connection (the relay restarted, the worker serving it died, the network dropped) or
// a stream not published yet is tried again, 0.5 s doubling to 8 s, reset once connected. A
// refusal that trying again cannot change (bad token, bad request) is reported and left.
export const RECONNECT_FIRST_MS = 500;
export const RECONNECT_MAX_MS = 8000;
export const FINAL_STATUSES = new Set([400, 401, 403, 413, 415, 422]);
// Chromium says "disconnected" once ICE consent checks go unanswered for a few seconds; one
// that lasts this much longer is a lost connection (a blip recovers well within it).
export const DISCONNECTED_GIVE_UP_MS = 3000;
// Video that stops for this long makes the player ask the server whether it still holds the
// session (WhepSession.exists): a restarted server or a dead worker answers 404 at once, while
// Chromium takes several seconds to call the silent connection "disconnected". A publisher
// that pauses leaves the session in place (answered 204), so nothing else happens.
export const STALL_CHECK_MS = 2000;
// How far apart an audio source's playout stamp and a frame's display may be for the one to
// move the other's capture time: a browser stamping on another clock would make it nonsense.
const AUDIO_STAMP_SANE_MS = 200;

// What every player counts of its frames, and what the WebRTC player adds.
export class ViewerStats extends FrameStats {
  constructor() {
    super();
    this.badMessages = 0; // sync messages that did not parse (counted and dropped)
    this.reconnects = 0;
    this.sessionChecks = 0; // times the server was asked whether it still holds the session
  }

  snapshot() {
    return { ...super.snapshot(), badMessages: this.badMessages, reconnects: this.reconnects,
      sessionChecks: this.sessionChecks };
  }
}

export class WebrtcPlayer {
  // video: the <video>; stream: its name; token: view token (Bearer) or undefined.
  // onStatus(text, isError): what the page shows as its status line. onState(state, detail):
  // "connecting", "reconnecting" (detail: why) or "error" (detail: the refusal).
  // onLanguages(langs): every caption language once a new one appears. play(): starts
  // playback (the page's controls, which handle a refused autoplay).
  // openSession, makeStream, now (ms, monotonic), timeOrigin (ms) and clockNowNs stand in for the
  // browser's in tests; joinOptions go to the clock join (clocksync.joinInRounds).
  constructor({
    video, stream, token, onStatus = () => {}, onState = () => {}, onLanguages = () => {},
    play = () => video.play().catch(() => {}), openSession = connectWhep,
    makeStream = () => new MediaStream(), now = () => globalThis.performance.now(),
    timeOrigin = globalThis.performance.timeOrigin, clockNowNs = browserNowNs,
    reconnectFirstMs = RECONNECT_FIRST_MS, joinOptions = {},
  }) {
    Object.assign(this, { video, stream, token, onStatus, onState, play, openSession, makeStream, now,
      timeOrigin, clockNowNs, reconnectFirstMs, joinOptions });
    this.sync = new SyncState();
    this.book = new CueBook();
    this.stats = new ViewerStats();
    this.playout = new PlayoutMeter();
    this.clockJoin = new ClockJoin(JOIN_MAX_EXCHANGES); // the least-delay exchange of a join
    this.shownLang = null;
    // Captions as VTTCues on a text track per language of the <video> (rendered by the
    // browser, selectable), placed for each presented frame by its capture time.
    this.captions = new CaptionTracks({
      video, hidden: true, // until the page applies the viewer's choice (selectLanguage)
      onLanguages,
    });
    this.frameListeners = []; // called with each presented frame's record and rVFC metadata
    this.session = null;
    this.syncChannel = null;
    this.reported = { presented: 0, mapped: 0, lost: 0, resets: 0 };
    this.reconnectDelayMs = reconnectFirstMs;
    this.reconnectTimer = null;
    this.lastFrameMs = now();
    this.lastCheckMs = 0;
    this.timers = [];
    this.frameHandle = null;
    this.stopped = false;
  }

  start() {
    this.frameHandle = this.video.requestVideoFrameCallback((n, m) => this.onFrame(n, m));
    this.timers.push(setInterval(() => this.sendTelemetry(), TELEMETRY_INTERVAL_MS));
    this.timers.push(setInterval(() => this.sendPlayout(), PLAYOUT_INTERVAL_MS));
    this.timers.push(setInterval(() => this.joinHouseClock(), REJOIN_MS));
    this.timers.push(setInterval(() => this.watchStall(), STALL_CHECK_MS / 4));
    return this.connect();
  }

  stop() {
    this.stopped = true;
    for (const timer of this.timers) clearInterval(timer);
    clearTimeout(this.reconnectTimer);
    if (this.frameHandle !== null) this.video.cancelVideoFrameCallback?.(this.frameHandle);
    const old = this.session;
    this.session = null;
    this.captions.clear();
    return old?.close();
  }

  // The caption language whose cues the page reports as shown (its controls show that track).
  selectLanguage(lang) {
    this.shownLang = lang;
  }

  sendControl(message) {
    if (this.syncChannel !== null && this.syncChannel.readyState === "open") {
      this.syncChannel.send(serializeMessage({ kind: "control", message }));
    }
  }

  // Clock join over the sync channel (proto/clock.md): the page learns house time, so its
  // telemetry is stamped on the house clock and the relay sees this viewer's offset.
  async joinHouseClock() {
    const report = await joinInRounds((m) => this.sendControl(m), this.clockJoin,
      { maxExchanges: JOIN_MAX_EXCHANGES, now: this.clockNowNs, ...this.joinOptions });
    if (report !== null) this.sendControl(report);
    return report;
  }

  houseNowNs() {
    const best = this.clockJoin.best();
    return this.clockNowNs() + (best === null ? 0n : best.offsetNs);
  }

  onSyncMessage(event) {
    let msg;
    try {
      msg = parseMessage(new Uint8Array(event.data));
    } catch (err) {
      this.stats.badMessages++; // count and carry on: one bad message must not stop the captions
      console.warn("sync message dropped:", err.message);
      return;
    }
    for (const control of this.sync.ingest(msg)) {
      if (control.type === "clock_resp") this.clockJoin.response(parseResponse(control), this.clockNowNs());
      else this.book.apply(control);
    }
  }

  transceiverOf(kind) {
    return this.session?.pc.getTransceivers().find((x) => x.receiver.track.kind === kind) ?? null;
  }

  trackIndexForMid(mid) {
    if (mid == null) return null;
    for (const [track, anchor] of this.sync.current) if (anchor.mid === mid) return track;
    return null;
  }

  // Capture time of the audio heard when the frame shows: the last played audio packet's
  // timestamp mapped through the sync records, moved on by the time between its playout and
  // the frame's display. Chromium stamps synchronization sources in wall-clock ms (like
  // Date.now()), rVFC's display time is on the performance clock: timeOrigin joins the two.
  audioCaptureNs(displayTime) {
    const transceiver = this.transceiverOf("audio");
    const track = this.trackIndexForMid(transceiver?.mid);
    const source = transceiver?.receiver.getSynchronizationSources()[0];
    if (track === null || source === undefined) return null;
    const captured = this.sync.captureOf(track, source.rtpTimestamp);
    if (captured === null) return null;
    const sincePlayedMs = this.timeOrigin + displayTime - source.timestamp;
    if (!(Math.abs(sincePlayedMs) < AUDIO_STAMP_SANE_MS)) return captured;
    return captured + BigInt(Math.round(sincePlayedMs * 1e6));
  }

  onFrame(now, meta) {
    if (this.stopped) return;
    this.lastFrameMs = this.now();
    const track = this.trackIndexForMid(this.transceiverOf("video")?.mid);
    const captureNs = track === null || meta.rtpTimestamp === undefined
      ? null : this.sync.captureOf(track, meta.rtpTimestamp);
    const anchor = track === null ? undefined : this.sync.current.get(track);
    const source = anchor === undefined
      ? null : typeof anchor.source === "number" ? SOURCES[anchor.source] : anchor.source;
    const streamS = this.book.streamSeconds(captureNs);
    const cues = streamS === null
      ? [] : this.captions.placeBook(streamS, this.video.currentTime, this.book.cues, () => this.shownLang);
    const errors = this.stats.frame({ captureNs, source, estimated: anchor?.estimated ?? null, streamS, cues });
    for (const errorMs of errors) this.playout.captionError(errorMs);
    const displayMs = meta.expectedDisplayTime ?? now;
    if (captureNs !== null) this.playout.frame(captureNs, this.audioCaptureNs(displayMs));
    const record = {
      rtpTimestamp: meta.rtpTimestamp, captureNs, streamS, mediaTime: meta.mediaTime, source,
      latencyMs: latencyMs(captureNs, displayMs, this.clockJoin.best()?.offsetNs ?? null, this.timeOrigin),
    };
    for (const listener of this.frameListeners) listener(record, meta);
    if (streamS !== null && this.stats.presented % 300 === 0) this.book.prune(streamS);
    this.frameHandle = this.video.requestVideoFrameCallback((n, m) => this.onFrame(n, m));
  }

  // Tells the relay how well this viewer maps frames (shown per viewer in /api/sync).
  sendTelemetry() {
    if (this.syncChannel === null || this.syncChannel.readyState !== "open") return null;
    const seen = { presented: this.stats.presented, mapped: this.stats.mapped, lost: this.sync.lostBatches };
    const message = {
      type: "telemetry", stream: this.stream, t_ns: this.houseNowNs(),
      presented: seen.presented - this.reported.presented, mapped: seen.mapped - this.reported.mapped,
      lost_batches: seen.lost - this.reported.lost,
    };
    this.sendControl(message);
    this.reported = { ...seen, resets: this.reported.resets };
    return message;
  }

  // A/V skew and caption timing for the operator dashboard (proto/sync.md "playout").
  sendPlayout() {
    if (this.syncChannel === null || this.syncChannel.readyState !== "open") return null;
    this.playout.resync(this.sync.resets - this.reported.resets);
    this.reported.resets = this.sync.resets;
    const message = this.playout.report(this.stream, this.houseNowNs());
    this.sendControl(message);
    return message;
  }

  async checkSession(why) {
    const checked = this.session;
    if (checked === null) return;
    this.lastCheckMs = this.now();
    this.stats.sessionChecks++;
    if ((await checked.exists()) === false && this.session === checked) {
      this.reconnectLater(`${why}; the server no longer has this session`);
    }
  }

  watchStall() {
    const now = this.now();
    if (this.session === null || this.reconnectTimer !== null) return;
    if (now - this.lastFrameMs >= STALL_CHECK_MS && now - this.lastCheckMs >= STALL_CHECK_MS) {
      this.checkSession("no video");
    }
  }

  reconnectLater(why) {
    if (this.reconnectTimer !== null || this.stopped) return;
    const delay = this.reconnectDelayMs;
    this.reconnectDelayMs = Math.min(2 * this.reconnectDelayMs, RECONNECT_MAX_MS);
    this.onStatus(`stream "${this.stream}": ${why}; trying again in ${(delay / 1000).toFixed(1)} s`, true);
    this.onState("reconnecting", "reconnecting");
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      this.stats.reconnects++;
      this.connect();
    }, delay);
  }

  async connect() {
    const old = this.session;
    this.session = null;
    if (old !== null) old.close(); // not awaited: its server may be gone
    this.sync.restart();
    this.onStatus(`connecting to stream "${this.stream}"…`);
    this.onState("connecting", null);
    const media = this.makeStream();
    this.video.srcObject = media;
    let opened = null;
    try {
      opened = await this.openSession(`/whep/${encodeURIComponent(this.stream)}`, {
        token: this.token,
        onTrack: (event) => media.addTrack(event.track),
        onSyncChannel: (channel) => {
          this.syncChannel = channel;
          channel.addEventListener("message", (event) => this.onSyncMessage(event));
          channel.addEventListener("open", () => this.joinHouseClock());
          channel.addEventListener("close", () => {
            if (opened !== null && this.session === opened) this.reconnectLater("sync channel closed");
          });
        },
      });
    } catch (err) {
      const why = String(err.message ?? err);
      if (FINAL_STATUSES.has(err.status)) {
        this.onStatus(why, true);
        this.onState("error", why);
      } else {
        this.reconnectLater(why);
      }
      return;
    }
    if (this.stopped) {
      opened.close();
      return;
    }
    this.session = opened;
    this.follow(opened);
    this.play();
  }

  // The peer's connection state: a failed or closed one reconnects; a disconnection that lasts
  // reconnects too, and makes the player ask the server about the session at once.
  follow(opened) {
    let giveUp = null;
    opened.pc.addEventListener("connectionstatechange", () => {
      if (this.session !== opened) return; // an old connection closing
      const state = opened.pc.connectionState;
      clearTimeout(giveUp);
      if (state === "failed" || state === "closed") {
        this.reconnectLater(`connection ${state}`);
        return;
      }
      if (state === "connected") this.reconnectDelayMs = this.reconnectFirstMs;
      if (state === "disconnected") {
        giveUp = setTimeout(() => {
          if (this.session === opened) this.reconnectLater("connection lost");
        }, DISCONNECTED_GIVE_UP_MS);
        this.checkSession("connection disconnected");
      }
      this.onStatus(`stream "${this.stream}": ${state}`);
    });
  }
}
