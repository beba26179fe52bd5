// Stand-ins for the browser objects the players drive, enough to run them in node: a <video>
// with text tracks whose active cues follow currentTime as the browser's do, and VTTCue.

export class FakeTrack {
  constructor(video, label, lang) {
    Object.assign(this, { video, label, language: lang, mode: "disabled", cues: new Set() });
  }

  addCue(c) {
    this.cues.add(c);
  }

  removeCue(c) {
    this.cues.delete(c);
  }

  get activeCues() { // as the browser decides them, from the element's currentTime
    return [...this.cues].filter((c) => c.startTime <= this.video.currentTime
      && this.video.currentTime < c.endTime);
  }
}

export class FakeVideo {
  constructor() {
    Object.assign(this, {
      currentTime: 0, textTracks: [], frame: null, handles: 0, srcObject: null, src: "", paused: true,
      plays: 0, listeners: new Map(),
    });
  }

  addTextTrack(kind, label, lang) {
    const track = new FakeTrack(this, label, lang);
    this.textTracks.push(track);
    return track;
  }

  requestVideoFrameCallback(cb) {
    this.frame = cb;
    return ++this.handles;
  }

  cancelVideoFrameCallback() {
    this.frame = null;
  }

  addEventListener(type, fn) {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), fn]);
  }

  async play() {
    this.plays++;
    this.paused = false;
  }

  // The language of every cue on screen now, in track order.
  showing() {
    return this.textTracks.filter((t) => t.mode === "showing").flatMap((t) => t.activeCues.map((c) => c.text));
  }
}

// VTTCue for as long as `body` runs.
export async function withVttCue(body) {
  const saved = globalThis.VTTCue;
  globalThis.VTTCue = class {
    constructor(s, e, text) {
      Object.assign(this, { startTime: s, endTime: e, text });
    }
  };
  try {
    return await body();
  } finally {
    globalThis.VTTCue = saved;
  }
}
