// Captions placed by capture time in a player the page already has: the media comes from any SFU
// (LiveKit, mediasoup, Janus, the sidecar's own WHEP), the captions and the house clock from the
// sidecar. The page hands over its <video> and the video track's RTCRtpReceiver; attach() shows
// each cue on a TextTrack of that <video>, active while the frames captured in its interval are
// on screen.
//
// How a frame's capture time is found, best first:
//   1. abs-capture-time: Chromium reports it per frame in receiver.getSynchronizationSources()
//      (captureTimestamp, ms since the NTP epoch) when the connection negotiated the header
//      extension and the SFU forwards it. Publishers joined to the house clock stamp house time.
//   2. rVFC captureTime: requestVideoFrameCallback metadata on the page's performance clock,
//      which a browser may estimate for remote frames from RTCP sender reports (Chromium 156
//      gave none on the sidecar's connections); moved to house time through the clock join.
//   3. arrival: the frame's receive time (or its presentation time) on the house clock, an
//      estimate late by the publisher's encode and the network path.
// The source in use and, below the first, the reason are in `stats`.
//
// Cues are placed on the video.currentTime timeline: for a frame captured at stream time C and
// presented while currentTime reads t, a cue [start, end) (stream seconds) goes to
// [t + start - C, t + end - C), boundaries not yet reached pushed out (see placeCue), and is
// re-placed at the frame whose capture time crosses one of its boundaries.

import { CueBook } from "./captions.js";
import { joinClock } from "./clocksync.js";
import { CaptionTracks } from "./captiontracks.js";
import { FrameStats } from "./framestats.js";
import { median } from "./playout.js";
import { SOURCES } from "./syncwire.js";
import { ABS_CAPTURE_TIME } from "./whep.js";
import { wsUrl } from "./wsurl.js";

// Cue placement per presented frame (cuetrack.js), exported here as before.
export { GUARD_S, placeCue } from "./cuetrack.js";

// For the page's own connection: asks Chromium to negotiate abs-capture-time on a transceiver
// (it does not by default), before the SDP that negotiates it is made.
export { negotiateAbsCaptureTime } from "./whep.js";

// The viewer page's names for where a capture time came from (proto/sync.md).
export const [SOURCE_ABS, SOURCE_SENDER_REPORT, SOURCE_ARRIVAL] = SOURCES;

export const NTP_EPOCH_UNIX_MS = 2_208_988_800_000; // 1900-01-01 to 1970-01-01
// Every WebRTC video codec's RTP clock (RFC 7741 VP8, RFC 6184 H.264, VP9, AV1).
export const VIDEO_RTP_HZ = 90_000;
// A sample this far off the capture line learnt so far starts a new one.
const DISCONTINUITY_NS = 5_000_000n;
// Frames whose estimated capture times are smoothed together (about a second of video).
const SMOOTH_FRAMES = 31;
const REJOIN_MS = 60_000; // as the viewer page: a browser clock drifts, the join is renewed
const POLL_MS = 500;
// Frames without abs-capture-time before it is declared missing (a few frames may precede the
// first source report).
const ABS_GRACE_FRAMES = 15;

// Signed 32-bit RTP timestamp difference a - b, wrap-safe.
export function rtpDiff(a, b) {
  return ((a - b) | 0);
}

// Capture times seen in getSynchronizationSources(), keyed by RTP timestamp. Chromium rounds
// captureTimestamp to the millisecond; capture time and RTP time run together (both come from the
// publisher's capture clock), so a frame's capture time is the median over recent samples of
// each one's time moved by the RTP clock, which takes the rounding out.
export class CaptureLog {
  constructor(size = 64) {
    this.size = size;
    this.samples = []; // {rtp, captureNs (BigInt house ns)}
    this.lastOffsetMs = null; // senderCaptureTimeOffset of the latest sample, when sent
  }

  // Adds Chromium's synchronization sources (an array); returns true if any carried a capture time.
  addSources(sources) {
    let any = false;
    for (const s of sources ?? []) {
      if (s.captureTimestamp === undefined || s.captureTimestamp === null
          || s.rtpTimestamp === undefined) continue;
      any = true;
      this.lastOffsetMs = s.senderCaptureTimeOffset ?? null;
      if (this.samples.some((x) => x.rtp === s.rtpTimestamp)) continue;
      const captureNs = absCaptureNs(s);
      const expected = this.captureOf(s.rtpTimestamp);
      // Off the line by more than rounding: the capture timeline jumped (a new publisher, a
      // reset RTP clock); what was learnt of the old one no longer applies.
      if (expected !== null && (expected - captureNs > DISCONTINUITY_NS
          || captureNs - expected > DISCONTINUITY_NS)) this.samples = [];
      this.samples.push({ rtp: s.rtpTimestamp, captureNs });
      if (this.samples.length > this.size) this.samples.shift();
    }
    return any;
  }

  // House ns of the frame with RTP timestamp `rtp`, or null without a sample within one second.
  captureOf(rtp) {
    const estimates = [];
    for (const s of this.samples) {
      const d = rtpDiff(rtp, s.rtp);
      if (Math.abs(d) <= VIDEO_RTP_HZ) estimates.push(s.captureNs + BigInt(Math.round((d * 1e9) / VIDEO_RTP_HZ)));
    }
    if (estimates.length === 0) return null;
    estimates.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    return estimates[estimates.length >> 1];
  }
}

// House ns from a synchronization source's captureTimestamp (ms since 1900). The capture
// system's own clock is the one cues are on (publishers join the house clock), so
// senderCaptureTimeOffset, which would move it onto the last sender's clock, is not added.
export function absCaptureNs(source) {
  return BigInt(Math.round((source.captureTimestamp - NTP_EPOCH_UNIX_MS) * 1e6));
}

// House ns of an instant on the page's performance clock (ms), given house - browser offset.
export function perfToHouseNs(perfMs, offsetNs, timeOrigin = globalThis.performance.timeOrigin) {
  return BigInt(Math.round((timeOrigin + perfMs) * 1e6)) + offsetNs;
}

// Why abs-capture-time is not there, as precisely as the receiver lets us say.
export function absMissingReason(receiver) {
  let negotiated = null;
  try {
    const exts = receiver.getParameters().headerExtensions;
    if (Array.isArray(exts)) negotiated = exts.some((e) => e.uri === ABS_CAPTURE_TIME);
  } catch (_) {
    // no parameters to read: say what we can
  }
  if (negotiated === false) {
    return "abs-capture-time not negotiated on this connection (the receiver's header extensions lack it)";
  }
  if (negotiated === true) {
    return "abs-capture-time negotiated but absent from the received frames (the SFU does not forward it)";
  }
  return "the browser reports no abs-capture-time for this receiver";
}

// attach({video, receiver, sidecarUrl, stream, lang, token}) -> {stats, track, book, detach}
//   video: the <video> playing the stream; receiver: the RTCRtpReceiver of its video track
//   (without one, frames are placed by arrival); sidecarUrl: the service's base URL (default:
//   the page's); token: sent as Bearer on caption requests, only when given.
// `stats` is live (read it any time); `track` is the TextTrack the cues are on; `detach()`
// stops everything and takes the cues off.
export function attach({ video, receiver, sidecarUrl, stream, lang = "en", token, pollMs = POLL_MS,
  label = "captions" } = {}) {
  if (!video || typeof video.requestVideoFrameCallback !== "function") {
    throw new TypeError("attach: video must be an HTMLVideoElement with requestVideoFrameCallback");
  }
  if (!stream) throw new TypeError("attach: stream is required");
  const base = new URL(sidecarUrl ?? globalThis.location.href).href;
  const book = new CueBook();
  // The VTTCues on one showing track, placed per presented frame (captiontracks.js).
  const captions = new CaptionTracks({ video, lang, label: () => label });
  const { track } = captions.track(lang);
  const captureLog = new CaptureLog();
  const offsets = []; // recent (media time - estimated capture stream time), seconds
  let since = 0;
  let stopped = false;
  let frameHandle = null;
  let pollTimer = null;
  let rejoinTimer = null;
  let clock = null;
  let absFramesMissing = 0;

  // What every player counts of its frames (framestats.js), and what attach() adds.
  const stats = Object.assign(new FrameStats(), {
    stream, lang, fallbackReason: null,
    captionFeed: new URL(`/api/streams/${encodeURIComponent(stream)}/captions`, base).href,
    captionFeedError: null,
    clock: { state: "joining", offsetNs: null, errorNs: null, rttNs: null, error: null },
    epochNs: null,
    cuesLoaded: 0, replacements: 0,
    lastMediaTime: null, relationS: null,
    senderCaptureTimeOffsetMs: null, // shown, not applied: see absCaptureNs
    captionErrorMs: null, // median, as the viewer page reports it
  });

  async function rejoin() {
    try {
      clock = await joinClock(wsUrl("/api/clock/ws", base));
      Object.assign(stats.clock, { state: "joined", offsetNs: clock.offsetNs, errorNs: clock.errorNs,
        rttNs: clock.rttNs, error: null });
    } catch (err) {
      // Keep the last good join; without any, the browser clock stands in (offset 0).
      Object.assign(stats.clock, { state: clock === null ? "failed" : "joined (renewal failed)",
        error: String(err.message ?? err) });
    }
  }

  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  async function poll() {
    try {
      for (;;) {
        const url = new URL(`/api/streams/${encodeURIComponent(stream)}/captions`, base);
        url.searchParams.set("since", String(since));
        url.searchParams.set("lang", lang);
        const resp = await fetch(url, { headers, cache: "no-store" });
        if (!resp.ok) throw new Error(`caption feed ${resp.status}`);
        const text = await resp.text();
        if (stopped) return; // detached while the request was out: leave the track alone
        const doc = JSON.parse(text);
        // JSON.parse rounds an epoch in ns (past 2^53) to a few hundred ns; the text is exact.
        const epoch = /"epoch_ns"\s*:\s*(\d+)/.exec(text);
        if (epoch !== null && stats.epochNs === null) {
          book.setEpoch(BigInt(epoch[1]));
          stats.epochNs = book.epochNs;
        }
        for (const c of doc.cues) {
          if (c.lang !== lang) continue;
          book.apply(c.retracted ? { type: "cue_retract", id: c.id } : { type: "cue", ...c });
          syncCue(c.id, true);
        }
        stats.captionFeedError = null;
        if (doc.next === since || doc.cues.length === 0) break;
        since = doc.next;
      }
      stats.cuesLoaded = book.cues.size;
    } catch (err) {
      stats.captionFeedError = String(err.message ?? err);
    }
    if (!stopped) pollTimer = setTimeout(poll, pollMs);
  }

  function syncCue(id, force = false) {
    captions.syncBook(id, book.cues.get(id), force);
    stats.replacements = captions.replacements;
  }

  // The capture time (BigInt house ns) of the frame rVFC reports, and where it came from.
  function captureOf(now, meta) {
    if (receiver && captureLog.addSources(receiver.getSynchronizationSources())) absFramesMissing = 0;
    else absFramesMissing++;
    if (meta.rtpTimestamp !== undefined) {
      const ns = captureLog.captureOf(meta.rtpTimestamp);
      if (ns !== null) return { ns, source: SOURCE_ABS, estimated: false, reason: null };
    }
    const reason = !receiver
      ? "no RTCRtpReceiver given: abs-capture-time cannot be read"
      : meta.rtpTimestamp === undefined
        ? "requestVideoFrameCallback gives no rtpTimestamp: frames cannot be matched to abs-capture-time"
        : absFramesMissing < ABS_GRACE_FRAMES ? null : absMissingReason(receiver);
    if (reason === null) return null; // still waiting for the first source report
    const offsetNs = clock === null ? 0n : clock.offsetNs;
    if (typeof meta.captureTime === "number" && meta.captureTime > 0) {
      return { ns: perfToHouseNs(meta.captureTime, offsetNs), source: SOURCE_SENDER_REPORT, estimated: true,
        reason: `${reason}; placing by requestVideoFrameCallback captureTime (RTCP sender reports)` };
    }
    const arrival = typeof meta.receiveTime === "number" && meta.receiveTime > 0
      ? meta.receiveTime : now;
    return { ns: perfToHouseNs(arrival, offsetNs), source: SOURCE_ARRIVAL, estimated: true,
      reason: `${reason}; the browser gives no capture time either, placing by arrival` };
  }

  function onFrame(now, meta) {
    if (stopped) return;
    frameHandle = video.requestVideoFrameCallback(onFrame);
    const found = captureOf(now, meta);
    if (found === null) {
      stats.frame();
      return;
    }
    stats.fallbackReason = found.reason;
    stats.lastMediaTime = meta.mediaTime;
    stats.senderCaptureTimeOffsetMs = captureLog.lastOffsetMs;
    let streamS = book.streamSeconds(found.ns);
    let cues = [];
    if (streamS !== null) { // else no epoch yet: nothing to place against
      if (found.estimated) {
        // An estimate jitters from frame to frame with the network; the frames' own media
        // times (from their RTP timestamps) do not: the median offset of recent frames carries it.
        offsets.push(meta.mediaTime - streamS);
        if (offsets.length > SMOOTH_FRAMES) offsets.shift();
        streamS = meta.mediaTime - median(offsets);
      } else {
        offsets.length = 0;
      }
      const t = video.currentTime;
      stats.relationS = t - streamS;
      cues = captions.placeBook(streamS, t, book.cues, lang);
      stats.replacements = captions.replacements;
    }
    // Caption timing as the viewer page reports it: capture time of the first frame showing
    // each cue minus the cue's start.
    stats.frame({ captureNs: found.ns, source: found.source, estimated: found.estimated, streamS, cues });
    stats.captionErrorMs = stats.captionErrorMedianMs();
    // Bounded memory, as the viewer page; their VTTCues leave at the next frame's placing.
    if (streamS !== null && stats.presented % 300 === 0) book.prune(streamS);
  }

  rejoin();
  rejoinTimer = setInterval(rejoin, REJOIN_MS);
  poll();
  frameHandle = video.requestVideoFrameCallback(onFrame);

  function detach() {
    stopped = true;
    clearTimeout(pollTimer);
    clearInterval(rejoinTimer);
    if (frameHandle !== null) video.cancelVideoFrameCallback(frameHandle);
    captions.clear(); // its track stays on the element, disabled
  }

  return { stats, track, book, detach };
}
