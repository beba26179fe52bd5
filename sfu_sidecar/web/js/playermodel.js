// What the viewer page's controls decide, without the DOM: the viewer's remembered choices,
// which key does what, how far behind live the picture is, and whether the stream is live,
// stalled or offline. Times are passed in (ms on one monotonic clock); nothing here reads one.

// Keys a live player answers to (the ones YouTube and Twitch use), case-insensitive.
export const KEY_ACTIONS = Object.freeze({
  " ": "playPause", k: "playPause", m: "mute", f: "fullscreen", c: "captions",
  arrowup: "volumeUp", arrowdown: "volumeDown",
});
export const VOLUME_STEP = 0.1;

// The action for a keydown, or null: keys typed into a form control, or with a modifier held
// (browser and system shortcuts), are not the player's.
export function actionForKey({ key, ctrlKey = false, metaKey = false, altKey = false, target = null }) {
  if (ctrlKey || metaKey || altKey || typeof key !== "string") return null;
  const tag = target?.tagName?.toLowerCase?.() ?? "";
  if (tag === "input" || tag === "textarea" || tag === "select" || target?.isContentEditable) {
    return null;
  }
  // Space on a focused button is the button's own click: leave it to the button.
  if (key === " " && tag === "button") return null;
  return KEY_ACTIONS[key.toLowerCase()] ?? null;
}

export const DEFAULT_PREFERENCES = Object.freeze({ muted: false, volume: 1, captions: true, lang: null });

function clampVolume(v) {
  return Number.isFinite(v) ? Math.min(1, Math.max(0, v)) : DEFAULT_PREFERENCES.volume;
}

// The viewer's choices, kept in `storage` (localStorage, or anything with getItem/setItem) so
// the next visit starts as this one ended. A storage that throws (private mode, disabled
// cookies) or holds junk gives the defaults: a preference is never worth a broken page.
export class Preferences {
  constructor(storage, key = "sfu-sidecar.viewer") {
    this.storage = storage;
    this.key = key;
    this.values = { ...DEFAULT_PREFERENCES, ...this.read() };
  }

  read() {
    try {
      const raw = JSON.parse(this.storage?.getItem(this.key) ?? "null");
      if (raw === null || typeof raw !== "object") return {};
      const out = {};
      if (typeof raw.muted === "boolean") out.muted = raw.muted;
      if (typeof raw.volume === "number") out.volume = clampVolume(raw.volume);
      if (typeof raw.captions === "boolean") out.captions = raw.captions;
      if (typeof raw.lang === "string" && raw.lang.length <= 35) out.lang = raw.lang;
      return out;
    } catch {
      return {};
    }
  }

  get(name) {
    return this.values[name];
  }

  set(changes) {
    if ("volume" in changes) changes = { ...changes, volume: clampVolume(changes.volume) };
    this.values = { ...this.values, ...changes };
    try {
      this.storage?.setItem(this.key, JSON.stringify(this.values));
    } catch {
      /* not kept: the page goes on with the choice for this visit */
    }
    return this.values;
  }
}

// The caption language to show of those a stream has (`available`, in the order they came):
// the viewer's choice, else the first of the browser's languages (`browser`, e.g. "en-GB";
// matched whole or by primary subtag), else the first available; null when there is none.
export function pickLanguage(available, chosen, browser) {
  if (chosen !== null && available.includes(chosen)) return chosen;
  const primary = (tag) => tag.toLowerCase().split("-")[0];
  for (const wanted of browser) {
    const exact = available.find((l) => l.toLowerCase() === wanted.toLowerCase());
    if (exact !== undefined) return exact;
    const near = available.find((l) => primary(l) === primary(wanted));
    if (near !== undefined) return near;
  }
  return available[0] ?? null;
}

// "40 ms" / "1.4 s" / "12 s" behind live from the latency in ms; null when unknown. A
// negative figure (a clock join still settling) is shown as live, never as ahead of it.
export function formatLatency(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return null;
  const v = Math.max(0, ms);
  if (v < 1000) return `${Math.round(v)} ms behind live`;
  return v < 10_000 ? `${(v / 1000).toFixed(1)} s behind live` : `${Math.round(v / 1000)} s behind live`;
}

// Latency behind live (ms) of a frame shown at `displayMs` on the page's performance clock
// (whose origin is `timeOrigin`, ms since 1970) that was captured at `captureNs` (BigInt house
// ns), given the page's house - browser clock offset `offsetNs`; null while either is unknown.
export function latencyMs(captureNs, displayMs, offsetNs, timeOrigin) {
  if (captureNs === null || offsetNs === null || offsetNs === undefined) return null;
  const displayNs = BigInt(Math.round((timeOrigin + displayMs) * 1e6)) + offsetNs;
  return Number(displayNs - captureNs) / 1e6;
}

// A live latency figure that does not flicker: the median of the last few frames' latencies,
// refreshed at most every `everyMs`.
export class LatencyMeter {
  constructor({ window = 15, everyMs = 500 } = {}) {
    this.window = window;
    this.everyMs = everyMs;
    this.samples = [];
    this.shown = null;
    this.shownAt = -Infinity;
  }

  add(latencyMs, nowMs) {
    if (!Number.isFinite(latencyMs)) return this.shown;
    this.samples.push(latencyMs);
    if (this.samples.length > this.window) this.samples.shift();
    if (nowMs - this.shownAt >= this.everyMs) {
      const sorted = [...this.samples].sort((a, b) => a - b);
      this.shown = sorted[Math.floor(sorted.length / 2)];
      this.shownAt = nowMs;
    }
    return this.shown;
  }

  reset() {
    this.samples = [];
    this.shown = null;
    this.shownAt = -Infinity;
  }
}

// Whether the viewer is watching a live picture. Frames arriving: "live". No frame for
// `stallMs`: "stalled" until the page has asked the service whether the stream has a
// publisher (`publisherSeen`): none -> "offline", one -> "buffering". "connecting" and
// "error" come from the transport. A frame always brings back "live".
export const STALL_MS = 2000;

export const STATE_MESSAGES = Object.freeze({
  connecting: "Connecting…",
  live: "",
  stalled: "Waiting for video…",
  buffering: "The broadcast is live; waiting for its picture…",
  offline: "This stream is offline. Playback resumes by itself when the broadcaster is back.",
});

export class Liveness {
  constructor({ stallMs = STALL_MS } = {}) {
    this.stallMs = stallMs;
    this.state = "connecting";
    this.detail = null;
    this.lastFrameMs = null;
  }

  frame(nowMs) {
    this.lastFrameMs = nowMs;
    return this.set("live");
  }

  connecting(detail = null) {
    return this.set("connecting", detail);
  }

  error(detail) {
    return this.set("error", detail);
  }

  // Called on a timer: true when the page should ask the service about the publisher.
  tick(nowMs) {
    if (this.state !== "live") return this.state === "stalled";
    if (this.lastFrameMs !== null && nowMs - this.lastFrameMs >= this.stallMs) {
      this.set("stalled");
      return true;
    }
    return false;
  }

  // What the service said while no frame came: is there a publisher on the stream?
  publisherSeen(live) {
    if (this.state === "live" || this.state === "error") return this.state;
    return this.set(live ? "buffering" : "offline");
  }

  set(state, detail = null) {
    this.state = state;
    this.detail = detail;
    return state;
  }

  message() {
    if (this.state === "error") return this.detail ?? "Playback failed.";
    const base = STATE_MESSAGES[this.state] ?? "";
    return this.detail && this.state === "connecting" ? `${base} (${this.detail})` : base;
  }
}
