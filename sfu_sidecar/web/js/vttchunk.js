// Caption chunks (chunk-{n}.vtt) read into stream-time cues, and merged per chunk. Pure: no DOM,
// no network. A chunk holds every cue displayed in its interval with full display times; its
// X-TIMESTAMP-MAP (RFC 8216 3.5) says which media time its cue times stand for. The service's
// media timestamps are stream time, so the map is the identity there; it is applied anyway, so
// a chunk from anywhere that states another mapping still lands on the media timeline.

const MPEG_TS_HZ = 90000;
const MPEG_TS_WRAP = 2 ** 33; // a 33-bit PTS wraps every ~26.5 hours of stream time

export class VttError extends Error {}

// "hh:mm:ss.ttt" or "mm:ss.ttt" -> seconds (WebVTT timestamp syntax).
export function parseTimestamp(text) {
  const m = /^(?:(\d+):)?([0-5]\d):([0-5]\d)\.(\d{3})$/.exec(text.trim());
  if (m === null) throw new VttError(`bad timestamp ${JSON.stringify(text)}`);
  const [, h = "0", min, s, ms] = m;
  return Number(h) * 3600 + Number(min) * 60 + Number(s) + Number(ms) / 1000;
}

// Media seconds of cue time 0 in this chunk, per its X-TIMESTAMP-MAP; `nearS` (the chunk's own
// start in stream seconds) picks the wrap of the 33-bit MPEGTS value closest to it.
export function mapOffset(header, nearS = 0) {
  const m = /X-TIMESTAMP-MAP=([^\n]*)/.exec(header);
  if (m === null) return 0;
  const fields = Object.fromEntries(m[1].split(",").map((kv) => {
    const i = kv.indexOf(":");
    return [kv.slice(0, i).trim(), kv.slice(i + 1).trim()];
  }));
  if (fields.MPEGTS === undefined || fields.LOCAL === undefined) {
    throw new VttError("X-TIMESTAMP-MAP needs MPEGTS and LOCAL");
  }
  const local = parseTimestamp(fields.LOCAL);
  let media = Number(fields.MPEGTS) / MPEG_TS_HZ;
  const wrapS = MPEG_TS_WRAP / MPEG_TS_HZ;
  media += Math.round((nearS - media) / wrapS) * wrapS;
  return media - local;
}

// Parses one chunk; cue times come back in media (= stream) seconds. Cues without an id get one
// from their times and text, so the same cue in two chunks is one cue.
export function parseChunk(text, nearS = 0) {
  const body = text.replace(/\r\n?/g, "\n");
  if (!/^(\uFEFF)?WEBVTT([ \t].*)?(\n|$)/.test(body)) throw new VttError("not a WebVTT file");
  const blocks = body.split(/\n{2,}/);
  const offset = mapOffset(blocks[0], nearS);
  const cues = [];
  for (const block of blocks.slice(1)) {
    const lines = block.split("\n").filter((l, i, all) => i < all.length - 1 || l !== "");
    const at = lines.findIndex((l) => l.includes("-->"));
    if (at < 0 || at > 1) continue; // NOTE, STYLE, REGION blocks and stray text
    const [from, rest] = lines[at].split("-->");
    const start = parseTimestamp(from) + offset;
    const [endText, ...settings] = rest.trim().split(/[ \t]+/);
    const end = parseTimestamp(endText) + offset;
    if (!(end > start)) continue;
    const cueText = lines.slice(at + 1).join("\n");
    const id = at === 1 ? lines[0] : `${start.toFixed(3)}-${end.toFixed(3)}-${cueText}`;
    cues.push({ id, start: round3(start), end: round3(end), text: cueText, settings: settings.join(" ") });
  }
  return { offset, cues };
}

function round3(s) {
  return Math.round(s * 1000) / 1000;
}

// Cues of one language from chunks: a newer copy of chunk n replaces what the older one said
// about n's interval, so a cue retracted (or moved out) after the first fetch goes away.
export class ChunkedCues {
  constructor() {
    this.cues = new Map(); // id -> {id, start, end, text}
    this.fromChunk = new Map(); // n -> Set of ids the last copy of chunk n held
    this.pushed = new Set(); // ids that came live (pushed), whichever chunk holds them later
    // Live changes are counted; a chunk asked for before a cue's latest live change holds an
    // older copy of it (merge leaves that cue as the push left it).
    this.version = 0;
    this.changedAt = new Map(); // id -> version of its latest live change
  }

  // A cue pushed live, before any chunk fetch shows it: added or changed. True when it changed.
  push(cue) {
    const live = { ...cue, start: round3(cue.start), end: round3(cue.end), settings: cue.settings ?? "" };
    const old = this.cues.get(live.id);
    this.pushed.add(live.id);
    this.changedAt.set(live.id, ++this.version);
    if (old !== undefined && old.start === live.start && old.end === live.end && old.text === live.text
      && old.settings === live.settings) return false;
    this.cues.set(live.id, live);
    return true;
  }

  // A retraction pushed live. True when the cue was there.
  retract(id) {
    this.pushed.delete(id);
    this.changedAt.set(id, ++this.version);
    for (const ids of this.fromChunk.values()) ids.delete(id);
    return this.cues.delete(id);
  }

  // Chunk n as fetched (its cues) -> {added, removed} ids; `added` includes cues whose times,
  // text or settings changed. `askedAt`: `version` when the chunk was asked for; a cue changed
  // live since then (a barge-in's cut pushed while the chunk was on its way) keeps its live
  // state, which is newer than the chunk's copy.
  merge(n, cues, askedAt = Infinity) {
    const added = [];
    const removed = [];
    const now = new Set();
    const newer = (id) => (this.changedAt.get(id) ?? 0) > askedAt;
    for (const cue of cues) {
      now.add(cue.id);
      if (newer(cue.id)) continue;
      const old = this.cues.get(cue.id);
      if (old === undefined || old.start !== cue.start || old.end !== cue.end || old.text !== cue.text
        || old.settings !== cue.settings) {
        this.cues.set(cue.id, cue);
        added.push(cue.id);
      }
    }
    for (const id of this.fromChunk.get(n) ?? []) {
      if (!now.has(id) && !this._inOtherChunk(id, n) && !newer(id)) {
        this.cues.delete(id);
        removed.push(id);
      }
    }
    this.fromChunk.set(n, now);
    return { added, removed };
  }

  _inOtherChunk(id, n) {
    for (const [k, ids] of this.fromChunk) if (k !== n && ids.has(id)) return true;
    return false;
  }

  // Forgets chunks that ended before stream time `t` minus `keepS` and the cues only they held
  // (bounded memory over a long run); returns the removed ids.
  prune(t, chunkS, keepS = 30) {
    const removed = [];
    for (const [id, at] of this.changedAt) {
      if (at <= this.version - 1000) this.changedAt.delete(id); // long settled (bounded memory)
    }
    for (const id of [...this.pushed]) {
      const cue = this.cues.get(id);
      if (cue !== undefined && cue.end >= t - keepS) continue;
      this.pushed.delete(id);
      if (cue !== undefined && !this._inOtherChunk(id, -1)) {
        this.cues.delete(id);
        removed.push(id);
      }
    }
    for (const n of [...this.fromChunk.keys()]) {
      if ((n + 1) * chunkS >= t - keepS) continue;
      const ids = this.fromChunk.get(n);
      this.fromChunk.delete(n);
      for (const id of ids) {
        if (this.cues.has(id) && !this._inOtherChunk(id, -1)) {
          this.cues.delete(id);
          removed.push(id);
        }
      }
    }
    return removed;
  }
}
