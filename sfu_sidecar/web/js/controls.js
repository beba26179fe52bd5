// The viewer page's player controls: sound (with the browser's autoplay policy), volume, play
// and pause, captions on/off and their language, picture-in-picture, fullscreen, the live
// badge with the latency behind live, and the message over the picture when the stream is not
// playing. DOM only: the page tells it what happens on the network (state, latency, languages)
// and hears back the viewer's choices (onLanguage, onCaptions, onPlay).

import {
  actionForKey, formatLatency, LatencyMeter, pickLanguage, Preferences, VOLUME_STEP,
} from "./playermodel.js";

const $ = (id) => document.getElementById(id);

// How often the controls check that a picture the viewer did not pause is playing (a browser
// that refused sound left it paused; a live source that stalled may need a nudge).
const KEEP_PLAYING_MS = 250;

function localStorageOrNull() {
  try {
    return window.localStorage;
  } catch {
    return null; // storage disabled: choices last for this visit only
  }
}

export class ViewerControls {
  constructor({ video, player = $("player"), storage = localStorageOrNull() }) {
    this.video = video;
    this.player = player;
    this.prefs = new Preferences(storage);
    this.latency = new LatencyMeter();
    this.userPaused = false;
    // Whether the player lets playback resume now (the MSE player holds the picture on a frame
    // while it buffers after a break); the page sets it.
    this.mayResume = () => true;
    this.soundBlocked = false; // the browser refused to play with sound until a user gesture
    this.frames = 0; // frames presented, in either playback mode
    this.state = "connecting"; // as the page last said (playermodel.js Liveness)
    this.languages = [];
    this.onLanguage = () => {};
    this.onCaptions = () => {};
    this.el = {
      play: $("play"), mute: $("mute"), unmute: $("unmute"), volume: $("volume"),
      live: $("live"), latency: $("latency"), cc: $("cc"), lang: $("lang"), pip: $("pip"),
      fullscreen: $("fullscreen"), overlay: $("overlay"), overlayText: $("overlay-text"),
    };
    video.volume = this.prefs.get("volume");
    video.muted = this.prefs.get("muted");
    this.bind();
    this.render();
    setInterval(() => this.keepPlaying(), KEEP_PLAYING_MS);
  }

  bind() {
    const { el, video } = this;
    el.play.addEventListener("click", () => this.togglePlay());
    el.mute.addEventListener("click", () => this.toggleMute());
    el.unmute.addEventListener("click", () => this.setMuted(false));
    el.volume.addEventListener("input", () => this.setVolume(Number(el.volume.value)));
    el.cc.addEventListener("click", () => this.toggleCaptions());
    el.lang.addEventListener("change", () => this.selectLanguage(el.lang.value));
    el.fullscreen.addEventListener("click", () => this.toggleFullscreen());
    el.pip.hidden = !(document.pictureInPictureEnabled && video.requestPictureInPicture);
    el.pip.addEventListener("click", () => this.togglePictureInPicture());
    video.addEventListener("click", () => this.togglePlay());
    for (const event of ["play", "pause", "volumechange"]) video.addEventListener(event, () => this.render());
    document.addEventListener("fullscreenchange", () => this.render());
    video.addEventListener("enterpictureinpicture", () => this.render());
    video.addEventListener("leavepictureinpicture", () => this.render());
    // A caption track added by the player (a new language) takes the viewer's choice at once.
    video.textTracks.addEventListener("addtrack", () => this.applyCaptionModes());
    document.addEventListener("keydown", (event) => {
      const action = actionForKey(event);
      if (action === null) return;
      event.preventDefault();
      this.act(action);
    });
  }

  act(action) {
    switch (action) {
      case "playPause": return this.togglePlay();
      case "mute": return this.toggleMute();
      case "fullscreen": return this.toggleFullscreen();
      case "captions": return this.toggleCaptions();
      case "volumeUp": return this.setVolume(this.video.volume + VOLUME_STEP);
      case "volumeDown": return this.setVolume(this.video.volume - VOLUME_STEP);
      default: return undefined;
    }
  }

  // Starts playback as the viewer left it: with sound if they had it and the browser allows
  // it; otherwise muted, with the unmute button in view (one click brings the sound).
  async play() {
    if (this.userPaused) return;
    try {
      await this.video.play();
    } catch (err) {
      if (err?.name !== "NotAllowedError" || this.video.muted) return;
      this.soundBlocked = true;
      this.video.muted = true; // not remembered: the viewer did not ask for silence
      this.render();
      await this.video.play().catch(() => {});
    }
  }

  keepPlaying() {
    const v = this.video;
    if (!this.userPaused && v.paused && v.readyState >= 2 && !v.ended && this.mayResume()) this.play();
  }

  togglePlay() {
    if (this.video.paused) {
      this.userPaused = false;
      this.play();
    } else {
      this.userPaused = true;
      this.video.pause();
    }
    this.render();
  }

  setMuted(muted) {
    this.video.muted = muted;
    if (!muted) {
      this.soundBlocked = false;
      if (this.video.volume === 0) this.video.volume = 0.5;
      // The click that unmutes is the user gesture the browser waited for.
      if (this.video.paused && !this.userPaused && this.mayResume()) this.video.play().catch(() => {});
    }
    this.prefs.set({ muted, volume: this.video.volume });
    this.render();
  }

  toggleMute() {
    this.setMuted(!this.video.muted);
  }

  setVolume(volume) {
    const v = Math.min(1, Math.max(0, volume));
    this.video.volume = v;
    if (v > 0 && this.video.muted) this.setMuted(false);
    else if (v === 0 && !this.video.muted) this.setMuted(true);
    else this.prefs.set({ volume: v });
    this.render();
  }

  toggleCaptions() {
    this.prefs.set({ captions: !this.prefs.get("captions") });
    this.applyCaptionModes();
    this.onCaptions(this.prefs.get("captions"));
    this.render();
  }

  selectLanguage(lang) {
    this.prefs.set({ lang });
    this.onLanguage(lang);
    this.applyCaptionModes();
    this.render();
  }

  // The language to show: the viewer's remembered one when the stream has it, else the first
  // of the browser's languages it has, else the first the stream offered.
  shownLanguage() {
    return pickLanguage(this.languages, this.prefs.get("lang"), navigator.languages ?? []);
  }

  // The stream's caption languages as the player finds them.
  setLanguages(langs) {
    if (langs.length === this.languages.length && langs.every((l, i) => l === this.languages[i])) return;
    const before = this.shownLanguage();
    this.languages = [...langs];
    const select = this.el.lang;
    select.replaceChildren(...langs.map((l) => new Option(l, l)));
    const shown = this.shownLanguage();
    if (shown !== null) select.value = shown;
    if (shown !== before && shown !== null) this.onLanguage(shown);
    this.applyCaptionModes();
    this.render();
  }

  // Every caption track of the video: the chosen language showing while captions are on, the
  // rest hidden (hidden tracks still keep their active cues, which the page's stats read).
  applyCaptionModes() {
    // Offline, the last frame stays on screen: its caption would be a line nobody is saying.
    const on = this.prefs.get("captions") && this.state !== "offline";
    const shown = this.shownLanguage();
    for (const track of this.video.textTracks) {
      const mode = on && (shown === null || track.language === shown) ? "showing" : "hidden";
      if (track.mode !== mode) track.mode = mode;
    }
  }

  async toggleFullscreen() {
    try {
      if (document.fullscreenElement) await document.exitFullscreen();
      else await this.player.requestFullscreen();
    } catch {
      /* refused (no user gesture, or an iframe without allowfullscreen): nothing changes */
    }
    this.render();
  }

  async togglePictureInPicture() {
    try {
      if (document.pictureInPictureElement) await document.exitPictureInPicture();
      else await this.video.requestPictureInPicture();
    } catch {
      /* refused: the button stays as it was */
    }
    this.render();
  }

  // Each presented frame's latency behind live (capture on the house clock to display), or
  // null where the page cannot know it yet (before its clock join).
  frame(latencyMs, nowMs = performance.now()) {
    this.frames++;
    const shown = latencyMs === null ? this.latency.shown : this.latency.add(latencyMs, nowMs);
    const text = formatLatency(shown);
    if (this.el.latency.textContent !== (text ?? "")) this.el.latency.textContent = text ?? "";
  }

  // Playback state from the page (playermodel.js Liveness): the message over the picture and
  // the live badge.
  showState(state, message) {
    const { overlay, overlayText, live } = this.el;
    const wasOffline = this.state === "offline";
    this.state = state;
    if (wasOffline !== (state === "offline")) this.applyCaptionModes();
    overlay.hidden = state === "live" || !message;
    overlay.dataset.state = state;
    overlayText.textContent = message;
    live.dataset.state = state;
    if (state !== "live") this.latency.reset();
    if (state !== "live") this.el.latency.textContent = "";
  }

  render() {
    const { el, video } = this;
    const paused = video.paused;
    setButton(el.play, paused ? "Play (k)" : "Pause (k)", paused ? "play" : "pause");
    const muted = video.muted || video.volume === 0;
    setButton(el.mute, muted ? "Unmute (m)" : "Mute (m)", muted ? "muted" : "sound");
    el.mute.setAttribute("aria-pressed", String(muted));
    el.unmute.hidden = !muted;
    el.unmute.classList.toggle("blocked", this.soundBlocked);
    el.volume.value = String(video.muted ? 0 : video.volume);
    el.volume.setAttribute("aria-valuetext", `${Math.round((video.muted ? 0 : video.volume) * 100)} %`);
    const captions = this.prefs.get("captions");
    el.cc.setAttribute("aria-pressed", String(captions));
    setButton(el.cc, captions ? "Turn captions off (c)" : "Turn captions on (c)", captions ? "cc-on" : "cc-off");
    el.cc.hidden = this.languages.length === 0;
    el.lang.hidden = this.languages.length < 2 || !captions;
    const full = document.fullscreenElement != null;
    setButton(el.fullscreen, full ? "Exit fullscreen (f)" : "Fullscreen (f)", full ? "fullscreen-exit" : "fullscreen");
    const pip = document.pictureInPictureElement != null;
    setButton(el.pip, pip ? "Exit picture-in-picture" : "Picture-in-picture", "pip");
  }

  // What the page's state looks like to a test or a debugging session.
  snapshot() {
    const v = this.video;
    return {
      paused: v.paused, muted: v.muted, volume: v.volume, soundBlocked: this.soundBlocked,
      captions: this.prefs.get("captions"), lang: this.shownLanguage(), languages: [...this.languages],
      fullscreen: document.fullscreenElement != null, latency: this.el.latency.textContent,
      latencyMs: this.latency.shown, frames: this.frames,
      state: this.el.overlay.dataset.state ?? null, message: this.el.overlayText.textContent,
    };
  }
}

function setButton(button, label, icon) {
  if (button.getAttribute("aria-label") !== label) {
    button.setAttribute("aria-label", label);
    button.title = label;
  }
  if (button.dataset.icon !== icon) {
    button.dataset.icon = icon;
    button.replaceChildren(iconSvg(icon));
  }
}

// Icons as inline SVG paths (24x24), drawn in the text colour; no icon font to load.
const ICONS = {
  play: "M8 5v14l11-7z",
  pause: "M6 5h4v14H6zm8 0h4v14h-4z",
  sound: "M3 9v6h4l5 5V4L7 9H3zm13.5 3A4.5 4.5 0 0 0 14 8v8a4.5 4.5 0 0 0 2.5-4zM14 3.2v2.1a7 7 0 0 1 0 13.4v2.1a9 9 0 0 0 0-17.6z",
  muted: "M3 9v6h4l5 5V4L7 9H3zm13.6 3 2.7-2.7-1.4-1.4-2.7 2.7-2.7-2.7-1.4 1.4 2.7 2.7-2.7 2.7 1.4 1.4 2.7-2.7 2.7 2.7 1.4-1.4z",
  "cc-on": "M19 4H5a2 2 0 0 0-2 2v12a2 2 0 0 0 2 2h14a2 2 0 0 0 2-2V6a2 2 0 0 0-2-2zm-8 7H9.5v-.5h-2v3h2V13H11v1a1 1 0 0 1-1 1H7a1 1 0 0 1-1-1v-4a1 1 0 0 1 1-1h3a1 1 0 0 1 1 1zm7 0h-1.5v-.5h-2v3h2V13H18v1a1 1 0 0 1-1 1h-3a1 1 0 0 1-1-1v-4a1 1 0 0 1 1-1h3a1 1 0 0 1 1 1z",
  "cc-off": "M19 5H5a1 1 0 0 0-1 1v12a1 1 0 0 0 1 1h14a1 1 0 0 0 1-1V6a1 1 0 0 0-1-1zm0-1a2 2 0 0 1 2 2v12a2 2 0 0 1-2 2H5a2 2 0 0 1-2-2V6a2 2 0 0 1 2-2zm-8 7H9.5v-.5h-2v3h2V13H11v1a1 1 0 0 1-1 1H7a1 1 0 0 1-1-1v-4a1 1 0 0 1 1-1h3a1 1 0 0 1 1 1zm7 0h-1.5v-.5h-2v3h2V13H18v1a1 1 0 0 1-1 1h-3a1 1 0 0 1-1-1v-4a1 1 0 0 1 1-1h3a1 1 0 0 1 1 1z",
  fullscreen: "M7 14H5v5h5v-2H7zm-2-4h2V7h3V5H5zm12 7h-3v2h5v-5h-2zM14 5v2h3v3h2V5z",
  "fullscreen-exit": "M5 16h3v3h2v-5H5zm3-8H5v2h5V5H8zm6 11h2v-3h3v-2h-5zm2-11V5h-2v5h5V8z",
  pip: "M19 11h-8v6h8zm4 8V5a2 2 0 0 0-2-2H3a2 2 0 0 0-2 2v14a2 2 0 0 0 2 2h18a2 2 0 0 0 2-2zm-2 0H3V5h18z",
};

function iconSvg(name) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", ICONS[name]);
  path.setAttribute("fill", "currentColor");
  svg.append(path);
  return svg;
}
