// What a player reports of its own playout, pure: it feeds the capture times of what it shows
// and plays and its cues' caption errors, and `report()` returns the `playout` control message
// (proto/sync.md) for the interval since the previous one.

const MAX_SAMPLES = 4096; // a few minutes of frames: bounded if reports stop going out

export function median(values) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

export class PlayoutMeter {
  constructor() {
    this.skewsMs = [];
    this.captionErrorsMs = [];
    this.resyncs = 0;
  }

  // Capture times (BigInt house ns) of the frame on screen and of the audio playing with it;
  // either may be null while its track has no anchor yet. Skew > 0: audio leads the picture.
  frame(videoCaptureNs, audioCaptureNs) {
    if (videoCaptureNs === null || audioCaptureNs === null) return null;
    const skewMs = Number(BigInt(audioCaptureNs) - BigInt(videoCaptureNs)) / 1e6;
    if (this.skewsMs.length < MAX_SAMPLES) this.skewsMs.push(skewMs);
    return skewMs;
  }

  // The caption error (ms) of a cue on the first frame that showed it (FrameStats.frame).
  captionError(errorMs) {
    if (this.captionErrorsMs.length < MAX_SAMPLES) this.captionErrorsMs.push(errorMs);
  }

  resync(count = 1) {
    this.resyncs += count;
  }

  // The report for the interval (t_ns: the page's house-time estimate), and a fresh interval.
  report(stream, tNs) {
    const skew = median(this.skewsMs);
    const errors = this.captionErrorsMs;
    const message = {
      type: "playout", stream, t_ns: BigInt(tNs),
      frames: this.skewsMs.length, av_skew_ms: skew ?? 0,
      captions: errors.length,
      caption_error_ms: errors.length ? errors.reduce((a, b) => a + b, 0) / errors.length : 0,
      resyncs: this.resyncs,
    };
    this.skewsMs = [];
    this.captionErrorsMs = [];
    this.resyncs = 0;
    return message;
  }
}
