// The MSE player's decisions, pure: which segment to fetch next, when the media timeline breaks
// or drifts off the caption timeline, and where to put the playhead. No DOM, no network; the
// player (mse.js) does what these say. All times are seconds.
//
// Timelines: a segment's index entry gives its start in stream time (capture time minus the
// stream epoch, the captions' timeline). The bytes carry their own timestamps, which the service
// writes as stream time too. The SourceBuffer adds its timestampOffset, so a frame at container
// time c plays at media time c + offset; the player keeps media time = stream time + shift,
// where cues and frames are placed. Resync moves the offset when the bytes stop agreeing with
// the index, so that stays true.

import { FrameStats } from "./framestats.js";

// A frame more than this away from where the caption timeline puts it is resynced.
export const DRIFT_S = 0.2;
// A segment starting this much off the previous one's end is a break in the timeline.
export const DISCONTINUITY_S = 0.8;

// Walks the segment index in order; says which init and media segments to append, and where a
// resync must come first. With `open` (low latency) it goes on to the segment being made, which
// the player streams part by part as the service makes it (chunked transfer) instead of
// waiting for it to close; that segment is then not appended again once listed as closed.
export class SegmentPlan {
  // startBehind: how many closed segments behind the newest to start playing from (without
  // `open`; with it, playback starts on the segment being made).
  constructor({ startBehind = 1, open = false } = {}) {
    this.startBehind = startBehind;
    this.open = open;
    this.next = null; // media sequence number of the next segment to append
    this.expectedStart = null; // stream time where the next segment should start
    this.initVersion = null;
    this.streaming = null; // {segment, complete}: the open segment handed out to stream
  }

  // index: the service's index.json. Returns actions in order:
  //   {type: "init", url, version}
  //   {type: "segment", segment, resync: null | {reason, jumpS}, open: false | true}
  plan(index) {
    const segments = index.segments ?? [];
    const open = this.open ? index.open ?? null : null;
    if (index.init === null || (segments.length === 0 && open === null)) return [];
    if (this.streaming !== null && !this.settle(segments)) return [];
    const actions = [];
    let todo;
    if (this.next === null && this.streaming === null && this.expectedStart === null) {
      todo = open !== null ? [] : segments.slice(Math.max(0, segments.length - 1 - this.startBehind));
    } else {
      todo = segments.filter((s) => this.next === null || s.sequence >= this.next);
    }
    for (const segment of todo) {
      const resync = this.resyncFor(segment, this.next !== null && segment.sequence !== this.next);
      this.initFor(actions, index, segment);
      actions.push({ type: "segment", segment, resync, open: false });
      this.next = segment.sequence + 1;
      this.expectedStart = segment.start_s + segment.duration_s;
    }
    const last = todo.length ? todo[todo.length - 1] : null;
    if (open !== null && (last === null || open.start_s > last.start_s)) {
      const resync = this.resyncFor(open, false);
      this.initFor(actions, index, open);
      actions.push({ type: "segment", segment: open, resync, open: true });
      this.streaming = { segment: open, complete: false };
    }
    return actions;
  }

  // The player streamed the open segment to its end (`complete`), or lost it part-way.
  streamed(complete) {
    if (this.streaming !== null) this.streaming.complete = complete;
  }

  // Once the streamed segment is listed as closed, the plan goes on after it (or, when its
  // stream broke off, with it, appended whole). False while it is not listed yet.
  settle(segments) {
    const { segment, complete } = this.streaming;
    const closed = segments.find((s) => s.number === segment.number);
    if (closed !== undefined) {
      this.streaming = null;
      this.next = complete ? closed.sequence + 1 : closed.sequence;
      this.expectedStart = complete ? closed.start_s + closed.duration_s : closed.start_s;
      return true;
    }
    const later = segments.find((s) => s.start_s > segment.start_s);
    if (later === undefined) return false;
    // It never closed (the service dropped it): on from the next one, bridged by a seek.
    this.streaming = null;
    this.next = later.sequence;
    this.expectedStart = null;
    return true;
  }

  resyncFor(segment, slid) {
    if (slid) {
      // The window slid past segments never fetched (a stalled network, a backgrounded tab).
      return { reason: "window", jumpS: segment.start_s - this.expectedStart };
    }
    if (this.expectedStart === null) return null;
    const jumpS = segment.start_s - this.expectedStart;
    if (segment.discontinuity) return { reason: "discontinuity", jumpS };
    if (Math.abs(jumpS) > DISCONTINUITY_S) return { reason: "jump", jumpS };
    return null;
  }

  initFor(actions, index, segment) {
    if (segment.init !== this.initVersion) {
      actions.push({ type: "init", url: index.init, version: segment.init });
      this.initVersion = segment.init;
    }
  }
}

// TimeRanges -> [[start, end], ...] (plain arrays, so tests need no DOM).
export function ranges(timeRanges) {
  const out = [];
  for (let i = 0; i < timeRanges.length; i++) out.push([timeRanges.start(i), timeRanges.end(i)]);
  return out;
}

// The span an append added: the parts of `after` not covered by `before`, as [start, end] of
// their union, or null when nothing new is buffered (a repeat append).
export function added(before, after) {
  let start = Infinity;
  let end = -Infinity;
  for (const [a, b] of after) {
    let pieces = [[a, b]];
    for (const [c, d] of before) {
      pieces = pieces.flatMap(([x, y]) => {
        if (d <= x || c >= y) return [[x, y]];
        const out = [];
        if (c > x) out.push([x, c]);
        if (d < y) out.push([d, y]);
        return out;
      });
    }
    for (const [x, y] of pieces) {
      if (y - x <= 1e-3) continue; // rounding at a range's edge is not new media
      start = Math.min(start, x);
      end = Math.max(end, y);
    }
  }
  return start === Infinity ? null : [start, end];
}

// After appending `segment`: how far its media landed from where the caption timeline wants it
// (media start minus stream start plus `shift`). A segment appended next to
// buffered media extends that range, so its added span starts where the previous one ended,
// which is where the segment should start too when both are right.
export function driftOf(segment, shift, span) {
  if (span === null) return null;
  return span[0] - (segment.start_s + shift);
}

// Drift is a property of the bytes' clock, so it shows in every segment from where it starts;
// one segment landing off the index can be something else (one track's tail arriving late and
// filling a hole before it, a stall). A resync needs two in a row that agree.
export class DriftGuard {
  constructor({ agreeS = 0.1 } = {}) {
    this.agreeS = agreeS;
    this.last = null;
  }

  // `drift` of a segment just appended (null: not measured); true when it is to be corrected.
  confirm(drift) {
    if (drift === null) return false;
    if (Math.abs(drift) <= DRIFT_S) {
      this.last = null;
      return false;
    }
    const agreed = this.last !== null && Math.abs(drift - this.last) <= this.agreeS;
    this.last = agreed ? null : drift;
    return agreed;
  }
}

// Where to put the playhead after a resync: the start of the buffered range holding `mediaS`,
// or of the first range after it; null when nothing is buffered there.
export function seekTarget(bufferedRanges, mediaS, epsilonS = 0.001) {
  for (const [a, b] of bufferedRanges) {
    if (mediaS >= a && mediaS < b) return Math.max(mediaS, a) + epsilonS;
    if (a > mediaS) return a + epsilonS;
  }
  return null;
}

// Live-edge following and stall recovery. Returns a media time to seek to, or null.
//  - more than `maxLagS` behind the buffered live edge: jump to `targetLagS` behind it;
//  - stuck in a hole with media buffered ahead within `holeS`: jump to it.
export function playheadFix(bufferedRanges, currentS, { maxLagS, targetLagS, holeS = 5, stalled = false }) {
  if (bufferedRanges.length === 0) return null;
  const edge = bufferedRanges[bufferedRanges.length - 1][1];
  if (edge - currentS > maxLagS) {
    return { reason: "live-edge", to: Math.max(bufferedRanges[bufferedRanges.length - 1][0], edge - targetLagS) };
  }
  const inside = bufferedRanges.some(([a, b]) => currentS >= a && currentS < b - 0.05);
  if (!inside || stalled) {
    const ahead = bufferedRanges.find(([a]) => a > currentS && a - currentS <= holeS);
    if (ahead !== undefined) return { reason: "hole", to: ahead[0] + 0.001 };
  }
  return null;
}

// What to remove behind the playhead to keep the browser's memory bounded: [start, end] or null.
export function trimRange(bufferedRanges, currentS, keepS = 20) {
  if (bufferedRanges.length === 0) return null;
  const start = bufferedRanges[0][0];
  if (currentS - start <= keepS * 1.5) return null; // trim in steps, not every tick
  return [start, currentS - keepS];
}

// The MSE player's counters for the stats panel, beside what every player counts of its frames.
export class PlayerStats extends FrameStats {
  constructor() {
    super();
    this.resyncs = 0;
    this.lastCorrection = null; // {reason, jumpS | correctionS, atS}
    this.restarts = 0; // new MediaSources after the SourceBuffer refused an append
    this.lastError = null;
    this.segments = 0;
    this.streamBreaks = 0; // streamed segments whose response broke off (appended whole later)
    this.livePushed = 0; // cues that came over the live caption push
    this.seeks = { "live-edge": 0, hole: 0 };
  }

  resync(correction) {
    this.resyncs++;
    this.lastCorrection = correction;
  }
}

// The MIME type a SourceBuffer needs for the index's container and RFC 6381 codec strings.
export function mimeOf(index) {
  return `video/${index.container}; codecs="${index.codecs.join(", ")}"`;
}

// One buffer of `pieces` (Uint8Arrays) in order.
export function concat(pieces) {
  const out = new Uint8Array(pieces.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of pieces) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
