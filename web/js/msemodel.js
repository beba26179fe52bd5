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

// A frame more than this away from where the caption timeline puts it is resynced.
export const DRIFT_S = 0.2;
// A segment starting this much off the previous one's end is a break in the timeline.
export const DISCONTINUITY_S = 0.8;

// Walks the segment index in order; says which init and media segments to append, and where a
// resync must come first.
export class SegmentPlan {
  // startBehind: how many closed segments behind the newest to start playing from.
  constructor({ startBehind = 1 } = {}) {
    this.startBehind = startBehind;
    this.next = null; // media sequence number of the next segment to append
    this.expectedStart = null; // stream time where the next segment should start
    this.initVersion = null;
  }

  // index: the service's index.json. Returns actions in order:
  //   {type: "init", url, version}
  //   {type: "segment", segment, resync: null | {reason, jumpS}}
  plan(index) {
    const segments = index.segments ?? [];
    if (index.init === null || segments.length === 0) return [];
    const actions = [];
    let todo;
    if (this.next === null) {
      todo = segments.slice(Math.max(0, segments.length - 1 - this.startBehind));
    } else {
      todo = segments.filter((s) => s.sequence >= this.next);
    }
    for (const segment of todo) {
      let resync = null;
      if (this.next !== null && segment.sequence !== this.next) {
        // The window slid past segments never fetched (a stalled network, a backgrounded tab).
        resync = { reason: "window", jumpS: segment.start_s - this.expectedStart };
      } else if (this.expectedStart !== null) {
        const jumpS = segment.start_s - this.expectedStart;
        if (segment.discontinuity) resync = { reason: "discontinuity", jumpS };
        else if (Math.abs(jumpS) > DISCONTINUITY_S) resync = { reason: "jump", jumpS };
      }
      if (segment.init !== this.initVersion) {
        actions.push({ type: "init", url: index.init, version: segment.init });
        this.initVersion = segment.init;
      }
      actions.push({ type: "segment", segment, resync });
      this.next = segment.sequence + 1;
      this.expectedStart = segment.start_s + segment.duration_s;
    }
    return actions;
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

// Resync counter and caption timing as the stats panel shows them.
export class PlayerStats {
  constructor() {
    this.resyncs = 0;
    this.lastCorrection = null; // {reason, jumpS | correctionS, atS}
    this.restarts = 0; // new MediaSources after the SourceBuffer refused an append
    this.lastError = null;
    this.segments = 0;
    this.seeks = { "live-edge": 0, hole: 0 };
    this.captionErrorsMs = [];
    this.seenCues = new Set();
  }

  resync(correction) {
    this.resyncs++;
    this.lastCorrection = correction;
  }

  // A frame at stream time `frameS` shown with `cues` active: the first frame of each cue
  // gives its caption error (frame capture time minus cue start). Returns the new errors (s).
  frame(frameS, cues, keep = 500) {
    const errors = [];
    for (const cue of cues) {
      if (this.seenCues.has(cue.id)) continue;
      this.seenCues.add(cue.id);
      errors.push(frameS - cue.start);
      this.captionErrorsMs.push((frameS - cue.start) * 1000);
      if (this.captionErrorsMs.length > keep) this.captionErrorsMs.shift();
    }
    if (this.seenCues.size > 4 * keep) this.seenCues = new Set([...this.seenCues].slice(-keep));
    return errors;
  }

  captionErrorP95Ms() {
    const sorted = this.captionErrorsMs.map(Math.abs).sort((a, b) => a - b);
    return sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil(0.95 * sorted.length) - 1)] : null;
  }
}
