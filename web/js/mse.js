// The product's MSE player: live segments from index.json into one SourceBuffer, captions from
// chunk-{n}.vtt as VTTCues on the video's text tracks, one timeline for both (stream time plus
// the shift the player keeps between them). Decisions live in msemodel.js; this module does them.

import {
  added, driftOf, DRIFT_S, playheadFix, PlayerStats, ranges, seekTarget, SegmentPlan, trimRange,
} from "./msemodel.js";
import { FrameCues } from "./cuetrack.js";
import { ChunkedCues, parseChunk } from "./vttchunk.js";

const POLL_MS = 250; // index polls: a new segment is appended within this of being listed
const CAPTION_POLL_MS = 500; // live chunks are fetched again this often
const TICK_MS = 250;

export class MsePlayerError extends Error {}
// The SourceBuffer refused an append: the media element is in error until it gets a new source.
export class SourceBufferError extends MsePlayerError {}

// The MIME type a SourceBuffer needs for the index's container and RFC 6381 codec strings.
export function mimeOf(index) {
  return `video/${index.container}; codecs="${index.codecs.join(", ")}"`;
}

export class MsePlayer {
  // video: the <video>; stream: its name; token: view token (Bearer) or undefined;
  // lang: the caption language shown first; onStatus(text, isError).
  constructor({ video, stream, token, lang = null, base = window.location.href, onStatus = () => {} }) {
    this.video = video;
    this.stream = stream;
    this.token = token;
    this.lang = lang;
    this.media = new URL(`/streams/${encodeURIComponent(stream)}/media/`, base);
    this.captionBase = new URL(`/captions/${encodeURIComponent(stream)}/`, base);
    this.onStatus = onStatus;
    this.plan = new SegmentPlan();
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
    this.tracks = new Map(); // lang -> {lang, track, cues: ChunkedCues, placer: FrameCues, closed: Set}
    this.timers = [];
    this.stopped = false;
    this.busy = false;
    this.frameListeners = []; // called with each presented frame's record
    this.appending = null; // the URL of the segment being appended, named when one is refused
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
        if (index.init !== null && index.segments.length > 0) {
          this.index = index;
          break;
        }
      } catch (err) {
        this.onStatus(String(err.message ?? err), true);
      }
      await sleep(POLL_MS * 2);
    }
    await this.open();
    for (const lang of this.index.languages ?? []) this.captionTrack(lang);
    this.onStatus(`stream "${this.stream}": MSE, ${this.mime}`);
    await this.pollCaptions(this.index.segments[Math.max(0, this.index.segments.length - 2)].start_s);
    await this.stepOrRecover(this.index);
    this.timers.push(setInterval(() => this.poll(), POLL_MS));
    this.timers.push(setInterval(() => this.tick(), TICK_MS));
    this.timers.push(setInterval(() => this.pollCaptions(), CAPTION_POLL_MS));
    this.video.addEventListener("waiting", () => this.fixPlayhead(true));
    this.video.requestVideoFrameCallback((now, meta) => this.onFrame(now, meta));
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
    this.plan = new SegmentPlan();
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
    const { next } = this.plan;
    await this.open();
    // On from the segment after the refused one: nothing shown is shown again, and the break
    // that leaves is bridged by the first append's seek, not counted as a resync.
    this.plan.next = next;
    this.plan.expectedStart = null;
  }

  stop() {
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
  }

  async poll() {
    if (this.busy || this.stopped) return;
    this.busy = true;
    try {
      const index = await (await this.fetchOk(new URL("index.json", this.media), "segment index")).json();
      this.index = index;
      for (const lang of index.languages ?? []) this.captionTrack(lang);
      await this.stepOrRecover(index);
      // Trimmed here, between appends, so no two SourceBuffer operations overlap.
      const trim = trimRange(ranges(this.buffer.buffered), this.video.currentTime);
      if (trim !== null) await this.remove(trim[0], trim[1]);
    } catch (err) {
      this.onStatus(String(err.message ?? err), true);
    } finally {
      this.busy = false;
    }
  }

  async stepOrRecover(index) {
    try {
      await this.step(index);
    } catch (err) {
      if (!(err instanceof SourceBufferError)) throw err;
      await this.recover(err);
      await this.step(index);
    }
  }

  async step(index) {
    for (const action of this.plan.plan(index)) {
      if (action.type === "init") {
        const data = await (await this.fetchOk(new URL(action.url, this.media), "init segment")).arrayBuffer();
        this.appending = action.url;
        await this.append(data);
        continue;
      }
      const { segment, resync } = action;
      const data = await (await this.fetchOk(new URL(segment.url, this.media), `segment ${segment.number}`)).arrayBuffer();
      this.appending = segment.url;
      if (resync !== null) await this.resync({ ...resync, atS: segment.start_s });
      const before = ranges(this.buffer.buffered);
      await this.append(data);
      const span = added(before, ranges(this.buffer.buffered));
      const drift = driftOf(segment, this.shift, span);
      if (drift !== null && Math.abs(drift) > DRIFT_S) {
        // The bytes' timestamps disagree with the caption timeline: move them onto it.
        await this.remove(span[0], span[1]);
        await this.resync({ reason: "drift", correctionS: -drift, atS: segment.start_s }, this.offset - drift);
        await this.append(data);
      }
      this.stats.segments++;
      this.appended++;
      if (this.appended === 1 || resync !== null) this.seekInto(segment.start_s + this.shift);
    }
    if (this.stats.segments > 0 && this.video.paused) this.video.play().catch(() => {});
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
    const fix = playheadFix(ranges(this.buffer.buffered), this.video.currentTime, {
      maxLagS: 3 * target + 1, targetLagS: 1.5 * target, stalled,
    });
    if (fix === null) return;
    this.stats.seeks[fix.reason]++;
    this.video.currentTime = fix.to;
  }

  tick() {
    if (this.buffer === null || this.stopped) return;
    this.fixPlayhead(this.video.readyState < HTMLMediaElement.HAVE_FUTURE_DATA && !this.video.paused);
    const chunkS = this.index?.caption_chunk_s;
    if (chunkS) {
      const t = this.video.currentTime - this.shift;
      for (const entry of this.tracks.values()) {
        for (const id of entry.cues.prune(t, chunkS)) this.syncCue(entry, id);
      }
    }
  }

  // --- captions -----------------------------------------------------------------------------

  captionTrack(lang) {
    let entry = this.tracks.get(lang);
    if (entry !== undefined) return entry;
    const track = this.video.addTextTrack("captions", lang, lang);
    const first = this.tracks.size === 0;
    track.mode = (this.lang === null ? first : lang === this.lang) ? "showing" : "hidden";
    entry = { lang, track, cues: new ChunkedCues(), placer: new FrameCues(track), closed: new Set() };
    this.tracks.set(lang, entry);
    return entry;
  }

  selectLanguage(lang) {
    this.lang = lang;
    for (const [l, entry] of this.tracks) entry.track.mode = l === lang ? "showing" : "hidden";
  }

  // Fetches the chunks around the playhead: the one playing and the next (live ones again each
  // poll; closed ones once, as they never change).
  async pollCaptions(fromS = null) {
    const chunkS = this.index?.caption_chunk_s;
    if (!chunkS || this.stopped) return;
    const t = Math.max(0, fromS ?? this.video.currentTime - this.shift);
    const first = Math.floor(t / chunkS);
    for (const entry of this.tracks.values()) {
      for (const n of [first, first + 1, first + 2]) {
        if (entry.closed.has(n)) continue;
        try {
          const url = new URL(`${encodeURIComponent(entry.lang)}/chunk-${n}.vtt`, this.captionBase);
          const resp = await fetch(url, { headers: this.headers(), cache: "no-store" });
          if (resp.status === 404) break; // a future chunk: nothing to read yet
          if (!resp.ok) continue;
          const { cues } = parseChunk(await resp.text(), n * chunkS);
          if ((resp.headers.get("Cache-Control") ?? "").includes("immutable")) entry.closed.add(n);
          const { added: changed, removed } = entry.cues.merge(n, cues);
          for (const id of [...changed, ...removed]) this.syncCue(entry, id, true);
        } catch (err) {
          this.stats.captionError = String(err.message ?? err);
        }
      }
    }
  }

  // Makes the VTTCue of `id` match the cue book and the frame being presented (cuetrack.js):
  // a cue is moved under the playhead by the first frame captured in its interval and off it
  // by the first captured after. Left to the browser's own cue timer, a cue placed at its
  // start showed one to two frames late under load (measured). `force` after the cue changed.
  syncCue(entry, id, force = false) {
    entry.placer.sync(id, entry.cues.cues.get(id), force);
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
    const shown = [];
    for (const entry of this.tracks.values()) {
      entry.placer.place(frameS, t);
      entry.placer.syncAll(entry.cues.cues);
      if (entry.track.mode === "showing") shown.push(...entry.placer.active(entry.cues.cues));
    }
    this.stats.frame(frameS, shown);
    this.lastFrame = { frameS, mediaTime: meta.mediaTime, currentTime: t, cues: shown.map((c) => c.id) };
    for (const listener of this.frameListeners) listener(this.lastFrame, meta);
    this.video.requestVideoFrameCallback((n, m) => this.onFrame(n, m));
  }

  // What the stats panel and window.sidecarStats show.
  snapshot() {
    const buffered = this.buffer === null ? [] : ranges(this.buffer.buffered);
    const edge = buffered.length ? buffered[buffered.length - 1][1] : null;
    return {
      mode: "mse",
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
      captionErrorP95Ms: this.stats.captionErrorP95Ms(),
      cuesShown: this.stats.seenCues.size,
      captionError: this.stats.captionError ?? null,
    };
  }
}

function sleep(ms) {
  return new Promise((done) => setTimeout(done, ms));
}
