// Captions of a stream for a player that has the frames' stream times: a text track per
// language on the video, each cue placed per presented frame (cuetrack.js) so it shows exactly
// on the frames captured in its interval. The cues come from chunk-{n}.vtt and the live push
// (Server-Sent Events: the MSE player), or from a cue book the page keeps (the viewer page's,
// fed by the `sync` DataChannel: placeBook).

import { FrameCues } from "./cuetrack.js";
import { ChunkedCues, parseChunk } from "./vttchunk.js";

export class CaptionTracks {
  // video: the <video>; lang: the language shown first (null: the first one met);
  // base: the stream's caption URL (/captions/{stream}/); headers(): request headers;
  // stats: counts livePushed and keeps captionError; makeCue: how a VTTCue is made (tests);
  // hidden: new tracks start hidden (the page's controls choose which shows);
  // onLanguages(langs): called with every language once a new one appears; label(lang): the
  // track's label (the language by default).
  constructor({ video, lang = null, base = null, headers = () => ({}), stats = {}, makeCue = undefined,
    hidden = false, onLanguages = () => {}, label = (l) => l }) {
    this.label = label;
    this.makeCue = makeCue;
    this.hidden = hidden;
    this.onLanguages = onLanguages;
    this.video = video;
    this.lang = lang;
    this.base = base;
    this.headers = headers;
    this.stats = stats;
    this.tracks = new Map(); // lang -> {lang, track, cues: ChunkedCues, placer: FrameCues, closed: Set}
    this.live = null; // the live caption push (EventSource), while connected
    this.liveState = "off";
  }

  track(lang) {
    let entry = this.tracks.get(lang);
    if (entry !== undefined) return entry;
    const track = this.video.addTextTrack("captions", this.label(lang), lang);
    const first = this.tracks.size === 0;
    const shows = !this.hidden && (this.lang === null ? first : lang === this.lang);
    track.mode = shows ? "showing" : "hidden";
    const placer = new FrameCues(track, this.makeCue ? { makeCue: this.makeCue } : {});
    entry = { lang, track, cues: new ChunkedCues(), placer, closed: new Set() };
    this.tracks.set(lang, entry);
    this.onLanguages([...this.tracks.keys()]);
    return entry;
  }

  select(lang) {
    this.lang = lang;
    for (const [l, entry] of this.tracks) entry.track.mode = l === lang ? "showing" : "hidden";
  }

  // The live caption push: a cue reaches its track as it is ingested, not at the next chunk
  // poll, which matters once the media is only a part behind the live edge. Chunks stay the
  // record: they fill in what the push missed while it was away (EventSource reconnects by
  // itself) and retract what changed.
  listen(EventSourceClass = globalThis.EventSource) {
    if (EventSourceClass === undefined) return;
    this.live = new EventSourceClass(new URL("live", this.base));
    this.live.addEventListener("open", () => { this.liveState = "open"; });
    this.live.addEventListener("error", () => { this.liveState = "reconnecting"; });
    this.live.addEventListener("cue", (event) => {
      const c = JSON.parse(event.data);
      const entry = this.track(c.lang);
      this.stats.livePushed = (this.stats.livePushed ?? 0) + 1;
      if (entry.cues.push({ id: c.id, start: c.start, end: c.end, text: c.text, settings: c.settings })) {
        this.sync(entry, c.id, true);
      }
    });
    this.live.addEventListener("retract", (event) => {
      const { lang, id } = JSON.parse(event.data);
      const entry = this.tracks.get(lang);
      if (entry !== undefined && entry.cues.retract(id)) this.sync(entry, id, true);
    });
  }

  close() {
    this.live?.close();
    this.live = null;
  }

  // Takes every cue off every track and hides them (a TextTrack cannot be removed from its
  // element).
  clear() {
    this.close();
    for (const entry of this.tracks.values()) {
      entry.placer.clear();
      entry.track.mode = "disabled";
    }
  }

  // VTTCues moved or put back fresh since the start (cuetrack.js FrameCues), all tracks.
  get replacements() {
    let n = 0;
    for (const entry of this.tracks.values()) n += entry.placer.replacements;
    return n;
  }

  // A cue of the page's book changed (`cue`: its new state, undefined once retracted): its
  // VTTCue follows at once, placed for the frame last presented.
  syncBook(id, cue, force = false) {
    if (cue === undefined) {
      for (const entry of this.tracks.values()) entry.placer.sync(id, undefined, force);
      return;
    }
    this.track(cue.lang ?? this.lang ?? "en").placer.sync(id, cue, force);
  }

  // Fetches the chunks around stream time `t`: the one playing and the next two (live ones
  // again each poll; closed ones once, as they never change).
  async poll(t, chunkS, fetchFn = globalThis.fetch) {
    const first = Math.floor(t / chunkS);
    for (const entry of this.tracks.values()) {
      for (const n of [first, first + 1, first + 2]) {
        if (entry.closed.has(n)) continue;
        try {
          const url = new URL(`${encodeURIComponent(entry.lang)}/chunk-${n}.vtt`, this.base);
          const askedAt = entry.cues.version;
          const resp = await fetchFn(url, { headers: this.headers(), cache: "no-store" });
          if (resp.status === 404) break; // a future chunk: nothing to read yet
          if (!resp.ok) continue;
          const { cues } = parseChunk(await resp.text(), n * chunkS);
          if ((resp.headers.get("Cache-Control") ?? "").includes("immutable")) entry.closed.add(n);
          const { added: changed, removed } = entry.cues.merge(n, cues, askedAt);
          for (const id of [...changed, ...removed]) this.sync(entry, id, true);
        } catch (err) {
          this.stats.captionError = String(err.message ?? err);
        }
      }
    }
  }

  // Cues of chunks behind stream time `t` leave the book (and their tracks).
  prune(t, chunkS) {
    for (const entry of this.tracks.values()) {
      for (const id of entry.cues.prune(t, chunkS)) this.sync(entry, id);
    }
  }

  // Makes the VTTCue of `id` match the cue book and the frame being presented (cuetrack.js):
  // a cue is moved under the playhead by the first frame captured in its interval and off it
  // by the first captured after. Left to the browser's own cue timer, a cue placed at its
  // start showed one to two frames late under load (measured). `force` after the cue changed.
  sync(entry, id, force = false) {
    entry.placer.sync(id, entry.cues.cues.get(id), force);
  }

  // Places every track's cues for the frame at stream time `frameS`, against the video's
  // currentTime `t` as read now; the cues shown on it (of the showing track).
  place(frameS, t) {
    const shown = [];
    for (const entry of this.tracks.values()) {
      entry.placer.place(frameS, t);
      entry.placer.syncAll(entry.cues.cues);
      if (entry.track.mode === "showing") shown.push(...entry.placer.active(entry.cues.cues));
    }
    return shown;
  }

  // Places cues the page keeps itself (`cues`: id -> cue with its lang, as a CueBook holds
  // them) for the frame at stream time `frameS`; the cues shown on it: those of `lang` (or of
  // the language it returns, asked once the tracks exist), or of the showing track when no
  // language is named.
  placeBook(frameS, t, cues, lang = null) {
    const byLang = new Map();
    for (const [id, cue] of cues) {
      const l = cue.lang ?? this.lang ?? "en";
      if (!byLang.has(l)) byLang.set(l, new Map());
      byLang.get(l).set(id, cue);
    }
    for (const l of byLang.keys()) this.track(l);
    const want = typeof lang === "function" ? lang() : lang;
    const shown = [];
    for (const [l, entry] of this.tracks) {
      const mine = byLang.get(l) ?? new Map();
      entry.placer.place(frameS, t);
      entry.placer.syncAll(mine);
      if (want === null ? entry.track.mode === "showing" : l === want) {
        shown.push(...entry.placer.active(mine));
      }
    }
    return shown;
  }
}
