// Caption scheduling, pure: which cues show for the frame on screen. Cue times are stream seconds
// (seconds since the stream epoch, house time). The page asks with the *capture* time of the frame
// being presented, so a caption shows exactly while the frames captured in its interval show.

export class CueBook {
  constructor() {
    this.cues = new Map(); // id -> {id, start, end, text, final, lang, settings}
    this.epochNs = null; // BigInt house ns of stream time 0
  }

  setEpoch(epochNs) {
    this.epochNs = BigInt(epochNs);
  }

  // Applies a control message from the sync channel or the JSON API; returns true if it changed
  // what could be on screen.
  apply(msg) {
    switch (msg.type) {
      case "epoch":
        this.setEpoch(msg.epoch_ns);
        return true;
      case "cue": {
        if (!(msg.end > msg.start)) return false;
        this.cues.set(msg.id, {
          id: msg.id, start: Number(msg.start), end: Number(msg.end), text: msg.text,
          final: msg.final !== false, lang: msg.lang, settings: msg.settings ?? "",
        });
        return true;
      }
      case "cue_retract":
        return this.cues.delete(msg.id);
      default:
        return false;
    }
  }

  // Stream seconds of a house-time capture instant (BigInt ns), or null before the epoch is known.
  streamSeconds(captureNs) {
    if (this.epochNs === null || captureNs === null || captureNs === undefined) return null;
    return Number(BigInt(captureNs) - this.epochNs) / 1e9;
  }

  // Cues whose [start, end) holds stream time t, earliest start first (WebVTT cue order).
  activeAt(t) {
    if (t === null) return [];
    const out = [];
    for (const cue of this.cues.values()) if (cue.start <= t && t < cue.end) out.push(cue);
    out.sort((a, b) => a.start - b.start || a.end - b.end);
    return out;
  }

  // Drops cues that ended more than `keepS` seconds before stream time t (bounded memory).
  prune(t, keepS = 30) {
    for (const [id, cue] of this.cues) if (cue.end < t - keepS) this.cues.delete(id);
  }
}
