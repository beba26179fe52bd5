// The product's MSE player: live segments from index.json into one SourceBuffer, captions from
// chunk-{n}.vtt as VTTCues on the video's text tracks, one timeline for both (stream time plus
// the shift the player keeps between them). Decisions live in msemodel.js; this module does them.
//
// Low latency (`lowLatency`): the segment being made is fetched at once and its response read
// as the service writes it (chunked transfer, a part every `part_duration_s`), each piece
// appended as it arrives, and playback kept `lagS` behind the buffered edge; otherwise the
// player starts one closed segment behind the newest and appends whole closed segments.

import {
  added, concat, DriftGuard, driftOf, mimeOf, playheadFix, PlayerStats, ranges, seekTarget, SegmentPlan,
  trimRange,
} from "./msemodel.js";
import { CaptionTracks } from "./captiontracks.js";

const POLL_MS = 250; // index polls: a new segment is appended within this of being listed
const CAPTION_POLL_MS = 500; // live chunks are fetched again this often
const TICK_MS = 250;
const STREAM_AGAIN = 4; // a streamed segment that ended is followed at once, this many times a poll

export class MsePlayerError extends Error {}
// The SourceBuffer refused an append: the media element is in error until it gets a new source.
export class SourceBufferError extends MsePlayerError {}

export class MsePlayer {
  // video: the <video>; stream: its name; token: view token (Bearer) or undefined;
  // lang: the caption language shown first; onStatus(text, isError).
  constructor({
    video, stream, token, lang = null, base = window.location.href, onStatus = () => {},
    lowLatency = false, lagS = null, mayPlay = () => true, play = null,
  }) {
    this.video = video;
    this.stream = stream;
    this.token = token;
    this.media = new URL(`/streams/${encodeURIComponent(stream)}/media/`, base);
    this.onStatus = onStatus;
    this.mayPlay = mayPlay; // false while the viewer has paused: the player does not resume then
    // Starts playback. The page passes its controls' play, which meets a refusal of sound by
    // the browser's autoplay policy by playing muted with the unmute control in view; alone,
    // a refused play would leave the picture paused with no word why.
    this.play = play ?? (() => this.video.play().catch(() => {}));
    // True while playback is held on a segment's first frame until `lag()` is buffered past it
    // (see streamSegment): whoever keeps the picture playing must not resume it meanwhile.
    this.holding = false;
    this.lowLatency = lowLatency;
    this.lagS = lagS; // behind the buffered edge in low latency; from the part length when null
    this.plan = new SegmentPlan({ open: lowLatency });
    this.drift = new DriftGuard();
    this.stats = new PlayerStats();
    // Two timelines meet here. `shift`: media time = stream time + shift, fixed for the
    // player's life (captions and frames are placed with it). `offset`: the SourceBuffer's
    // timestampOffset, media time = container time + offset. The service writes stream time
    // into the containers, so the two agree; a drift resync moves `offset` until the bytes land
    // where the index (stream time) says, and leaves `shift` alone.
    this.shift = 0;
    this.offset = 0;
    this.index = null;
    this.buffer = null;
    // Captions from chunk-{n}.vtt and the live push, placed per presented frame.
    this.captions = new CaptionTracks({
      video, lang, base: new URL(`/captions/${encodeURIComponent(stream)}/`, base),
      headers: () => this.headers(), stats: this.stats,
    });
    this.timers = [];
    this.stopped = false;
    this.busy = false;
    this.frameListeners = []; // called with each presented frame's record
    this.appending = null; // the URL of the segment being appended, named when one is refused
    this.resumeAt = null; // the sequence number to go on from should that append be refused
  }

  headers() {
    return this.token ? { Authorization: `Bearer ${this.token}` } : {};
  }

  async fetchOk(url, what) {
    const resp = await fetch(url, { headers: this.headers(), cache: "no-store" });
    if (!resp.ok) {
      let reason = `${resp.status}`;
      try {
        reason = `${resp.status}: ${(await resp.json()).error}`;
      } catch {
        /* not JSON: the status says enough */
      }
      throw new MsePlayerError(`${what}: ${reason}`);
    }
    return resp;
  }

  async start() {
    this.onStatus(`stream "${this.stream}": waiting for live segments…`);
    // Retry until the service has an init segment and one closed segment (a keyframe and a
    // target duration after the first request).
    for (;;) {
      if (this.stopped) return;
      try {
        const index = await (await this.fetchOk(new URL("index.json", this.media), "segment index")).json();
        const open = this.lowLatency ? index.open ?? null : null;
        if (index.init !== null && (index.segments.length > 0 || open !== null)) {
          this.index = index;
          break;
        }
      } catch (err) {
        this.onStatus(String(err.message ?? err), true);
      }
      await sleep(POLL_MS * 2);
    }
    await this.open();
    for (const lang of this.index.languages ?? []) this.captions.track(lang);
    this.onStatus(`stream "${this.stream}": MSE, ${this.mime}`);
    const { segments, open } = this.index;
    const first = this.lowLatency && open ? open : segments[Math.max(0, segments.length - 2)];
    this.captions.listen();
    await this.pollCaptions(first.start_s);
    this.timers.push(setInterval(() => this.tick(), TICK_MS));
    this.timers.push(setInterval(() => this.pollCaptions(), CAPTION_POLL_MS));
    this.video.addEventListener("waiting", () => this.fixPlayhead(true));
    this.video.requestVideoFrameCallback((now, meta) => this.onFrame(now, meta));
    // The first segments, then the index polls (a streamed segment lasts until it closes, so
    // the timers above run meanwhile).
    this.busy = true;
    try {
      await this.stepOrRecover(this.index);
    } finally {
      this.busy = false;
    }
    this.poll();
    this.timers.push(setInterval(() => this.poll(), POLL_MS));
  }

  // A new MediaSource with one SourceBuffer for the index's container and codecs; the plan
  // starts over (one closed segment behind the newest).
  async open() {
    const mime = mimeOf(this.index);
    if (!MediaSource.isTypeSupported(mime)) throw new MsePlayerError(`this browser cannot play ${mime}`);
    this.mediaSource = new MediaSource();
    this.video.src = URL.createObjectURL(this.mediaSource);
    await new Promise((done) => this.mediaSource.addEventListener("sourceopen", done, { once: true }));
    this.buffer = this.mediaSource.addSourceBuffer(mime);
    this.buffer.mode = "segments"; // the bytes' own timestamps place the media
    this.buffer.timestampOffset = this.offset;
    this.mime = mime;
    this.plan = new SegmentPlan({ open: this.lowLatency });
    this.appended = 0;
  }

  // The SourceBuffer refused what it was given (a corrupt segment, a decoder error): the media
  // element is in error and takes nothing more, so playback starts over on a new MediaSource
  // from the live edge, keeping the captions and the timeline. Counted, with the reason.
  async recover(err) {
    this.stats.restarts++;
    this.stats.lastError = String(err.message ?? err);
    this.onStatus(`stream "${this.stream}": playback restarted after: ${this.stats.lastError}`, true);
    URL.revokeObjectURL(this.video.src);
    const { streaming } = this.plan;
    const next = this.resumeAt ?? this.plan.next;
    await this.open();
    // On from the segment after the refused one (the plan had handed out those after it too):
    // nothing shown is shown again, and the break that leaves is bridged by the first append's
    // seek, not counted as a resync. A refused init is retried with its segment. A refused
    // segment that was being streamed is passed over once it is listed as closed.
    this.plan.next = next;
    this.plan.expectedStart = null;
    if (streaming !== null) this.plan.streaming = { ...streaming, complete: true };
  }

  stop() {
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    this.captions.close();
  }

  async poll() {
    if (this.busy || this.stopped) return;
    this.busy = true;
    try {
      let index = await (await this.fetchOk(new URL("index.json", this.media), "segment index")).json();
      this.index = index;
      for (const lang of index.languages ?? []) this.captions.track(lang);
      // A streamed segment that ended is followed by the next one at once (the service opens
      // it at the keyframe that closed this one), not at the next poll.
      for (let i = 0; i < STREAM_AGAIN && await this.stepOrRecover(index) && !this.stopped; i++) {
        index = await (await this.fetchOk(new URL("index.json", this.media), "segment index")).json();
        this.index = index;
      }
      await this.trim();
    } catch (err) {
      this.onStatus(String(err.message ?? err), true);
    } finally {
      this.busy = false;
    }
  }

  // True when it streamed a segment being made to its end.
  async stepOrRecover(index) {
    try {
      return await this.step(index);
    } catch (err) {
      if (!(err instanceof SourceBufferError)) throw err;
      await this.recover(err);
      return await this.step(index);
    }
  }

  async step(index) {
    let streamed = false;
    const actions = this.plan.plan(index);
    for (const [i, action] of actions.entries()) {
      if (action.type === "init") {
        const data = await (await this.fetchOk(new URL(action.url, this.media), "init segment")).arrayBuffer();
        this.appending = action.url;
        this.resumeAt = actions[i + 1]?.segment.sequence ?? null; // an init precedes its segment
        await this.append(data);
        continue;
      }
      if (action.open) {
        streamed = await this.streamSegment(action);
        continue;
      }
      const { segment, resync } = action;
      const data = await (await this.fetchOk(new URL(segment.url, this.media), `segment ${segment.number}`)).arrayBuffer();
      this.appending = segment.url;
      this.resumeAt = segment.sequence + 1;
      if (resync !== null) await this.resync({ ...resync, atS: segment.start_s });
      const before = ranges(this.buffer.buffered);
      await this.append(data);
      const span = added(before, ranges(this.buffer.buffered));
      const drift = driftOf(segment, this.shift, span);
      if (this.drift.confirm(drift)) {
        // The bytes' timestamps disagree with the caption timeline: move them onto it.
        await this.remove(span[0], span[1]);
        await this.resync({ reason: "drift", correctionS: -drift, atS: segment.start_s }, this.offset - drift);
        await this.append(data);
      }
      this.stats.segments++;
      this.appended++;
      if (this.appended === 1 || resync !== null) this.seekInto(segment.start_s + this.shift);
    }
    if (this.stats.segments > 0 && this.video.paused && this.mayPlay()) this.play();
    return streamed;
  }

  // The segment being made, read as the service writes it: each piece is appended as it
  // arrives (the SourceBuffer's parser takes a segment across appends), and the drift check
  // is made once its first frames are buffered. True when the response ran to its end (the
  // segment closed); a response cut off leaves the closed segment to be appended whole.
  async streamSegment(action) {
    try {
      return await this.streamSegmentHeld(action);
    } finally {
      this.holding = false; // a hold ends with its segment, however the segment ends
    }
  }

  async streamSegmentHeld(action) {
    const { segment, resync } = action;
    let reader;
    try {
      reader = (await this.fetchOk(new URL(segment.url, this.media), `segment ${segment.number}`)).body.getReader();
    } catch (err) {
      this.stats.streamBreaks++;
      this.plan.streamed(false);
      return false;
    }
    this.appending = segment.url;
    this.resumeAt = null; // refused: the plan passes over it once it is listed closed (recover)
    if (resync !== null) await this.resync({ ...resync, atS: segment.start_s });
    const received = [];
    const before = ranges(this.buffer.buffered);
    let placed = false;
    let seekFrom = null; // where playback (re)starts, once `lag()` of media is buffered past it
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (err) {
        this.stats.streamBreaks++;
        this.plan.streamed(false);
        return false;
      }
      if (chunk.done) break;
      received.push(chunk.value);
      await this.append(chunk.value);
      await this.trim(); // a segment streams for its whole duration: trimmed as it goes
      if (!placed) {
        const span = added(before, ranges(this.buffer.buffered));
        if (span === null) continue; // no whole frame parsed yet
        placed = true;
        const drift = driftOf(segment, this.shift, span);
        if (this.drift.confirm(drift)) {
          await this.remove(span[0], span[1]);
          await this.resync({ reason: "drift", correctionS: -drift, atS: segment.start_s }, this.offset - drift);
          await this.append(concat(received));
        }
        this.appended++;
        if (this.appended === 1 || resync !== null) {
          // Held on the first frame until `lag()` is buffered past it: played from the first
          // part alone, the browser showed one frame and then stalled for a second at a break
          // (H.264, new parameters). Seeked at once, so the frame shown meanwhile has its
          // captions (it is presented at the time it is shown for).
          seekFrom = segment.start_s + this.shift;
          this.holding = true;
          this.video.pause();
          this.seekInto(seekFrom);
        }
      }
      if (seekFrom !== null && this.bufferedPast(seekFrom) >= this.lag()) {
        this.seekInto(this.liveTarget(seekFrom));
        seekFrom = null;
        this.holding = false;
      }
      if (seekFrom === null && this.video.paused && this.mayPlay()) this.play();
    }
    if (seekFrom !== null) this.seekInto(this.liveTarget(seekFrom));
    this.stats.segments++;
    this.plan.streamed(true);
    return true;
  }

  // Drops what is far behind the playhead (bounded memory). Called between appends only, so no
  // two SourceBuffer operations overlap.
  async trim() {
    const range = trimRange(ranges(this.buffer.buffered), this.video.currentTime);
    if (range !== null) await this.remove(range[0], range[1]);
  }

  // How far behind the buffered edge low-latency playback stays: two and a half parts (a part
  // arrives as a whole, so the buffer ahead dips by one between them), at least 0.5 s.
  lag() {
    return this.lagS ?? Math.max(0.5, 2.5 * (this.index?.part_duration_s ?? 0.2));
  }

  // Seconds buffered from `mediaS` on, in the range holding it (or the next one).
  bufferedPast(mediaS) {
    const range = ranges(this.buffer.buffered).find(([, b]) => b > mediaS);
    return range === undefined ? 0 : range[1] - Math.max(range[0], mediaS);
  }

  // Where playback starts in a streamed segment: `lag()` behind what is buffered, not before
  // `mediaS` (the segment's start).
  liveTarget(mediaS) {
    const buffered = ranges(this.buffer.buffered);
    if (!buffered.length) return mediaS;
    return Math.max(mediaS, buffered[buffered.length - 1][1] - this.lag());
  }

  // Waits for the SourceBuffer, abort()s, sets timestampOffset and counts the resync; the
  // following append lands on the caption timeline and the caller seeks into it.
  async resync(correction, offset = this.offset) {
    await this.idle();
    if (this.mediaSource.readyState === "open") this.buffer.abort();
    this.offset = offset;
    this.buffer.timestampOffset = offset;
    this.stats.resync(correction);
  }

  seekInto(mediaS) {
    const to = seekTarget(ranges(this.buffer.buffered), mediaS);
    if (to !== null && Math.abs(this.video.currentTime - to) > 0.002) this.video.currentTime = to;
  }

  idle() {
    if (!this.buffer.updating) return Promise.resolve();
    return new Promise((done) => this.buffer.addEventListener("updateend", done, { once: true }));
  }

  async append(data) {
    await this.idle();
    try {
      await this.op(() => this.buffer.appendBuffer(data));
    } catch (err) {
      if (err.name !== "QuotaExceededError") throw err;
      // Full: drop what is behind the playhead, then try once more.
      await this.remove(0, Math.max(0, this.video.currentTime - 2));
      await this.op(() => this.buffer.appendBuffer(data));
    }
  }

  async remove(start, end) {
    if (!(end > start)) return;
    await this.idle();
    await this.op(() => this.buffer.remove(start, end));
  }

  op(start) {
    return new Promise((done, fail) => {
      const ok = () => { off(); done(); };
      const bad = () => {
        off();
        fail(new SourceBufferError(`SourceBuffer error at ${this.appending ?? "init"}: ${this.video.error?.message ?? ""}`));
      };
      const off = () => {
        this.buffer.removeEventListener("updateend", ok);
        this.buffer.removeEventListener("error", bad);
      };
      this.buffer.addEventListener("updateend", ok);
      this.buffer.addEventListener("error", bad);
      try {
        start();
      } catch (err) {
        off();
        fail(err);
      }
    });
  }

  fixPlayhead(stalled = false) {
    if (this.buffer === null || this.index === null) return;
    const target = this.index.target_duration_s;
    // Low latency: back to lag() when more than three parts (at least 0.75 s) beyond it (a
    // stall, a slow start); otherwise beyond three target durations, back to one and a half.
    const lag = this.lag();
    const limits = this.lowLatency
      ? { maxLagS: lag + Math.max(0.75, 3 * (this.index.part_duration_s ?? 0.2)), targetLagS: lag }
      : { maxLagS: 3 * target + 1, targetLagS: 1.5 * target };
    const fix = playheadFix(ranges(this.buffer.buffered), this.video.currentTime, { ...limits, stalled });
    if (fix === null) return;
    this.stats.seeks[fix.reason]++;
    this.video.currentTime = fix.to;
  }

  tick() {
    if (this.buffer === null || this.stopped) return;
    this.fixPlayhead(this.video.readyState < HTMLMediaElement.HAVE_FUTURE_DATA && !this.video.paused);
    const chunkS = this.index?.caption_chunk_s;
    if (chunkS) this.captions.prune(this.video.currentTime - this.shift, chunkS);
  }

  // Fetches the chunks around the playhead (captiontracks.js).
  async pollCaptions(fromS = null) {
    const chunkS = this.index?.caption_chunk_s;
    if (!chunkS || this.stopped) return;
    await this.captions.poll(Math.max(0, fromS ?? this.video.currentTime - this.shift), chunkS);
  }

  // The caption languages the page can choose from, and the choice.
  get tracks() {
    return this.captions.tracks;
  }

  selectLanguage(lang) {
    this.captions.select(lang);
  }

  // Per presented frame: its stream time (its media time minus the shift, which is its capture time
  // minus the epoch); cues are placed for it, and those active give the caption error.
  onFrame(now, meta) {
    if (this.stopped) return;
    const frameS = meta.mediaTime - this.shift;
    // Placed against currentTime as read now: the browser decides which cues are active from
    // it, at once when a cue moves (and placed against the frame's media time instead, cues
    // showed a frame later, measured). Placed against anything else, a cue can stay active past
    // its end for as long as currentTime trails that time.
    const t = this.video.currentTime;
    const shown = this.captions.place(frameS, t);
    const epoch = this.index?.epoch_ns;
    const captureNs = epoch == null ? null : BigInt(epoch) + BigInt(Math.round(frameS * 1e9));
    // The segments are written in stream time, so a frame's capture time is exact, not estimated.
    this.stats.frame({ captureNs, source: "segment", estimated: false, streamS: frameS, cues: shown });
    this.lastFrame = {
      frameS, captureNs, mediaTime: meta.mediaTime, currentTime: t, cues: shown.map((c) => c.id),
    };
    for (const listener of this.frameListeners) listener(this.lastFrame, meta);
    this.video.requestVideoFrameCallback((n, m) => this.onFrame(n, m));
  }

  // What the stats panel and window.sidecarStats show.
  snapshot() {
    const buffered = this.buffer === null ? [] : ranges(this.buffer.buffered);
    const edge = buffered.length ? buffered[buffered.length - 1][1] : null;
    return {
      mode: "mse",
      lowLatency: this.lowLatency,
      liveCaptions: this.captions.liveState,
      livePushed: this.stats.livePushed,
      lagS: this.lowLatency ? this.lag() : null,
      streamBreaks: this.stats.streamBreaks,
      mime: this.mime ?? null,
      resyncs: this.stats.resyncs,
      restarts: this.stats.restarts,
      lastError: this.stats.lastError,
      lastCorrection: this.stats.lastCorrection,
      offsetS: this.offset,
      shiftS: this.shift,
      segments: this.stats.segments,
      seeks: { ...this.stats.seeks },
      bufferAheadS: edge === null ? null : edge - this.video.currentTime,
      streamS: this.lastFrame?.frameS ?? null,
      presented: this.stats.presented,
      captionErrorMedianMs: this.stats.captionErrorMedianMs(),
      captionErrorP95Ms: this.stats.captionErrorP95Ms(),
      cuesShown: this.stats.cuesShown,
      captionError: this.stats.captionError ?? null,
    };
  }
}

function sleep(ms) {
  return new Promise((done) => setTimeout(done, ms));
}
