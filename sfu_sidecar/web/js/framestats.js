// What every player counts of the frames it presents (the viewer page's WebRTC player, the MSE
// player and attach()): frames presented and mapped to a capture time, where the last capture
// time came from, and each cue's caption error (the stream time of the first frame showing it
// minus the cue's start). Pure: a player feeds it per frame and reads the figures.

// Caption errors kept for the percentiles (minutes of cues), and cue ids remembered so that a
// cue counts once (the oldest forgotten past this; a cue that old is long off screen).
const KEEP_ERRORS = 500;
const KEEP_CUES = 2000;

function percentile(values, q) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

export class FrameStats {
  constructor() {
    this.presented = 0;
    this.mapped = 0;
    this.source = null; // of the last mapped frame: proto/sync.md's names
    this.estimated = null; // whether the last mapped frame's capture time is an estimate
    this.lastCaptureNs = null; // BigInt house ns
    this.lastStreamS = null;
    this.cuesShown = 0;
    this.captionErrorsMs = [];
    this.seenCues = new Set();
  }

  // A presented frame: its capture time (BigInt house ns; null while unknown) and where it came
  // from, its stream time (s; null before the stream's epoch is known) and the cues shown on
  // it. Returns the caption errors (ms) of the cues it shows for the first time.
  frame({ captureNs = null, source = null, estimated = null, streamS = null, cues = [] } = {}) {
    this.presented++;
    if (captureNs !== null) {
      this.mapped++;
      this.source = source;
      this.estimated = estimated;
      this.lastCaptureNs = captureNs;
    }
    this.lastStreamS = streamS;
    const errors = [];
    if (streamS === null) return errors;
    for (const cue of cues) {
      if (this.seenCues.has(cue.id)) continue;
      this.seenCues.add(cue.id);
      if (this.seenCues.size > KEEP_CUES) this.seenCues.delete(this.seenCues.values().next().value);
      this.cuesShown++;
      const errorMs = (streamS - cue.start) * 1000;
      errors.push(errorMs);
      this.captionErrorsMs.push(errorMs);
      if (this.captionErrorsMs.length > KEEP_ERRORS) this.captionErrorsMs.shift();
    }
    return errors;
  }

  // Median caption error (ms, signed: > 0 when cues show late), null before any cue showed.
  captionErrorMedianMs() {
    return percentile(this.captionErrorsMs, 0.5);
  }

  // 95th percentile of the caption error's size (ms).
  captionErrorP95Ms() {
    return percentile(this.captionErrorsMs.map(Math.abs), 0.95);
  }

  // The figures a stats panel or a test reads (plain values, the capture time as a string).
  snapshot() {
    return {
      presented: this.presented, mapped: this.mapped, source: this.source, estimated: this.estimated,
      lastCaptureNs: this.lastCaptureNs === null ? null : String(this.lastCaptureNs),
      lastStreamS: this.lastStreamS, cuesShown: this.cuesShown,
      captionErrorMedianMs: this.captionErrorMedianMs(), captionErrorP95Ms: this.captionErrorP95Ms(),
    };
  }
}
