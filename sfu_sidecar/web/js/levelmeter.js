// A microphone's level while it is captured: the track through a Web Audio analyser, its RMS
// level (publishcore.js levelFromSamples, 0..1) handed to `onLevel` every `intervalMs`.

import { levelFromSamples } from "./publishcore.js";

export class LevelMeter {
  constructor(intervalMs, onLevel, { AudioContextClass = globalThis.AudioContext } = {}) {
    this.intervalMs = intervalMs;
    this.onLevel = onLevel;
    this.AudioContextClass = AudioContextClass;
    this.ctx = null; // one context for the page's life: browsers limit how many there are
    this.analyser = null;
    this.source = null;
    this.timer = null;
  }

  start(track) {
    this.stop();
    if (!track || typeof this.AudioContextClass !== "function") return;
    this.ctx ??= new this.AudioContextClass();
    this.ctx.resume().catch(() => {});
    if (this.analyser === null) {
      this.analyser = this.ctx.createAnalyser();
      this.analyser.fftSize = 2048;
    }
    this.source = this.ctx.createMediaStreamSource(new MediaStream([track]));
    this.source.connect(this.analyser);
    const samples = new Float32Array(this.analyser.fftSize);
    this.timer = setInterval(() => {
      this.analyser.getFloatTimeDomainData(samples);
      this.onLevel(levelFromSamples(samples));
    }, this.intervalMs);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
    this.source?.disconnect();
    this.source = null;
  }
}
