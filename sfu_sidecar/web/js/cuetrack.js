// Cues on a TextTrack of a <video>, shown exactly while the frames captured in their interval
// are on screen: the browser renders them (natively, accessibly), this module decides where on
// the video.currentTime timeline they sit, anew for each presented frame. Used by the viewer
// page (WebRTC and MSE playback) and by attach() for players the page did not make.

// How far past currentTime a cue boundary not yet reached is kept (seconds): far enough that
// currentTime running on between two frames never crosses it.
export const GUARD_S = 0.5;

// Where a cue goes on the video.currentTime timeline, decided for the frame being presented.
//
// The browser re-evaluates cues at moments of its own (a timer, timeupdate), and for a
// MediaStream currentTime runs on with the wall clock between frames. So cues are placed anew
// for each presented frame, relative to currentTime `t` as read in that frame's
// requestVideoFrameCallback (cue changes made there apply before the frame is painted): a cue is
// active now exactly when the frame's capture stream time `frameS` is in [start, end); a
// boundary still ahead is put `guardS` further out, so it is crossed at the frame whose capture
// time reaches it, when this is called again. Returns [startTime, endTime].
export function placeCue(cue, frameS, t, guardS = GUARD_S) {
  if (frameS < cue.start) {
    const start = t + guardS + (cue.start - frameS);
    return [start, start + (cue.end - cue.start)];
  }
  const start = t - (frameS - cue.start);
  if (frameS < cue.end) return [start, t + guardS + (cue.end - frameS)];
  return [start, t - (frameS - cue.end)];
}

// Word times travel as WebVTT cue timestamp tags in a cue's text ("Good <00:00:04.400>evening"),
// in stream time like the cue. The browser styles the words before and after a timestamp with
// ::cue(:past) and ::cue(:future), comparing it with currentTime when it renders the cue; so the
// text handed to the VTTCue has each timestamp rewritten for the frame being presented: a word
// whose stream time the frame's capture time has reached gets a time just behind currentTime
// (past), any other one a time `guardS` ahead (future, until the next frame decides again).

const TIMESTAMP_TAG = /<(\d[^>]*)(>|$)/g;

// Seconds of a WebVTT timestamp ("hh:mm:ss.ttt" or "mm:ss.ttt"), or null.
export function parseTimestamp(value) {
  const m = /^(?:(\d+):)?(\d{2}):(\d{2})\.(\d{3})$/.exec(value);
  if (m === null) return null;
  const hours = m[1] === undefined ? 0 : Number(m[1]);
  const minutes = Number(m[2]);
  const seconds = Number(m[3]);
  if (minutes > 59 || seconds > 59) return null;
  return hours * 3600 + minutes * 60 + seconds + Number(m[4]) / 1000;
}

export function formatTimestamp(seconds) {
  const ms = Math.max(0, Math.round(seconds * 1000));
  const pad = (n, w) => String(n).padStart(w, "0");
  return `${pad(Math.floor(ms / 3600000), 2)}:${pad(Math.floor(ms / 60000) % 60, 2)}:`
    + `${pad(Math.floor(ms / 1000) % 60, 2)}.${pad(ms % 1000, 3)}`;
}

// The stream times of the word timestamps in `text`, in order (tags that are no timestamp are
// left out, as the browser leaves them).
export function wordTimes(text) {
  const out = [];
  for (const m of (text ?? "").matchAll(TIMESTAMP_TAG)) {
    const s = parseTimestamp(m[1]);
    if (s !== null) out.push(s);
  }
  return out;
}

// `text` as the VTTCue shows it for the frame captured at stream time `frameS`, presented at
// currentTime `t`: {text, said}, `said` the number of timestamps the frame has reached.
export function wordsForFrame(text, frameS, t, guardS = GUARD_S) {
  let said = 0;
  const past = formatTimestamp(Math.max(0, t - 0.001));
  const future = formatTimestamp(t + guardS);
  const shown = text.replace(TIMESTAMP_TAG, (whole, value, close) => {
    const s = parseTimestamp(value);
    if (s === null) return whole;
    if (s <= frameS) said++;
    return `<${s <= frameS ? past : future}${close}`;
  });
  return { text: shown, said };
}

// Whether a placed cue already has the state the presented frame asks for and keeps it until
// the next frame: each write makes the browser re-evaluate the track, so cues are left alone
// while they are right (a cue moves when the frame-to-capture relation crosses its boundary).
export function placedWell(vtt, shouldBeActive, ended, t, guardS = GUARD_S) {
  const isActive = vtt.startTime <= t && t < vtt.endTime;
  if (isActive !== shouldBeActive) return false;
  if (isActive) return vtt.endTime - t >= guardS / 2;
  if (ended) return vtt.endTime <= t;
  return vtt.startTime - t >= guardS / 2;
}

// A WebVTT cue settings list ("line:10% position:20%,line-left align:start") as VTTCue
// properties, parsed as WebVTT does: an unknown setting or a bad value is skipped, the rest apply.
export function cueSettings(text) {
  const out = {};
  const pct = (v) => (/^\d+(\.\d+)?%$/.test(v) ? Number(v.slice(0, -1)) : null);
  for (const token of (text ?? "").split(/[ \t\n]+/)) {
    const colon = token.indexOf(":");
    if (colon <= 0 || colon === token.length - 1) continue;
    const name = token.slice(0, colon);
    const value = token.slice(colon + 1);
    if (name === "vertical" && (value === "rl" || value === "lr")) out.vertical = value;
    else if (name === "line") {
      const [pos, align] = value.split(",");
      if (align !== undefined && !["start", "center", "end"].includes(align)) continue;
      const percent = pct(pos);
      if (percent !== null && percent <= 100) {
        out.line = percent;
        out.snapToLines = false;
      } else if (/^-?\d+(\.\d+)?$/.test(pos)) {
        out.line = Number(pos);
        out.snapToLines = true;
      } else continue;
      out.lineAlign = align ?? "start";
    } else if (name === "position") {
      const [pos, align] = value.split(",");
      const percent = pct(pos);
      if (percent === null || percent > 100) continue;
      if (align !== undefined && !["line-left", "center", "line-right"].includes(align)) continue;
      out.position = percent;
      out.positionAlign = align ?? "auto";
    } else if (name === "size") {
      const percent = pct(value);
      if (percent !== null && percent <= 100) out.size = percent;
    } else if (name === "align" && ["start", "center", "end", "left", "right"].includes(value)) {
      out.align = value;
    }
  }
  return out;
}

// The VTTCues of one TextTrack, kept in step with a set of stream-time cues ({id, start, end,
// text, settings}, seconds) and the frame being presented.
export class FrameCues {
  constructor(track, { makeCue = (start, end, text) => new VTTCue(start, end, text) } = {}) {
    this.track = track;
    this.makeCue = makeCue;
    this.vtt = new Map(); // cue id -> VTTCue on the track
    this.placing = null; // the presented frame cues are placed for: {frameS, t}
    this.replacements = 0;
    this.refreshes = 0; // cues put back fresh because the browser's list disagreed
    this.wordMarks = 0; // texts rewritten because the frame on screen reached another word
  }

  // The frame being presented: its capture stream time and currentTime as read for it.
  place(frameS, t) {
    this.placing = { frameS, t };
  }

  // Adds, moves or removes the VTTCue of `id` to match `cue` (undefined: gone) and the frame
  // being presented; `force` after the cue itself changed.
  sync(id, cue, force = false) {
    const existing = this.vtt.get(id);
    const changed = existing !== undefined && cue !== undefined
      && (existing.sidecarText !== cue.text
        || existing.sidecarSettings !== (cue.settings ?? ""));
    if (cue === undefined || changed) {
      if (existing !== undefined) {
        this.track.removeCue(existing);
        this.vtt.delete(id);
      }
      if (cue === undefined) return;
    }
    if (this.placing === null) return; // no frame presented yet: nothing to place against
    const { frameS, t } = this.placing;
    const [start, end] = placeCue(cue, frameS, t);
    const vtt = this.vtt.get(id);
    const timed = wordTimes(cue.text).length > 0;
    if (vtt === undefined) {
      const shown = timed ? wordsForFrame(cue.text, frameS, t) : { text: cue.text, said: 0 };
      const added = this.makeCue(start, end, shown.text);
      added.id = id;
      added.sidecarText = cue.text;
      added.sidecarWords = { said: shown.said, t };
      // Placed where the producer asked (line, position, size, align), as a WebVTT file would.
      added.sidecarSettings = cue.settings ?? "";
      Object.assign(added, cueSettings(added.sidecarSettings));
      this.track.addCue(added);
      this.vtt.set(id, added);
      return;
    }
    if (timed) this.markWords(vtt, cue, frameS, t);
    const shouldBeActive = start <= t && t < end;
    if (!force && placedWell(vtt, shouldBeActive, frameS >= cue.end, t)) {
      if (this.browserAgrees(vtt, shouldBeActive)) return;
      // Placed right, yet the track still lists it the other way: Chromium re-evaluates a
      // moved cue at times of its own, and in MSE playback a cue moved off at its end stayed
      // listed (and shown) for up to 13 frames (measured). A fresh cue in its place is
      // evaluated at once.
      this.track.removeCue(vtt);
      this.vtt.delete(id);
      this.refreshes++;
      this.sync(id, cue);
      return;
    }
    this.replacements++;
    // Widen first, so the cue never has end < start in between.
    if (end > vtt.endTime) {
      vtt.endTime = end;
      vtt.startTime = start;
    } else {
      vtt.startTime = start;
      vtt.endTime = end;
    }
  }

  // Rewrites the shown text when the frame reached another word, or before the future words'
  // times (`guardS` ahead of the last rewrite) could be passed by currentTime.
  markWords(vtt, cue, frameS, t) {
    const shown = wordsForFrame(cue.text, frameS, t);
    const last = vtt.sidecarWords;
    if (last !== undefined && last.said === shown.said && t - last.t < GUARD_S / 2) return;
    vtt.text = shown.text;
    vtt.sidecarWords = { said: shown.said, t };
    this.wordMarks++;
  }

  // Places every cue of `cues` (a Map id -> cue) for the frame, and drops VTTCues of ids gone
  // from it.
  syncAll(cues) {
    for (const [id, cue] of cues) this.sync(id, cue);
    for (const id of [...this.vtt.keys()]) if (!cues.has(id)) this.sync(id, undefined);
  }

  // Whether the browser's list of active cues has `vtt` as the placement says. Without such a
  // list (a track that is disabled, or not a browser's) there is nothing to disagree with.
  browserAgrees(vtt, shouldBeActive) {
    const listed = this.track.activeCues;
    if (listed === undefined || listed === null) return true;
    for (const c of listed) if (c === vtt) return shouldBeActive;
    return !shouldBeActive;
  }

  // The cues of `cues` the track has active now.
  active(cues) {
    const out = [];
    for (const vtt of this.track.activeCues ?? []) {
      const cue = cues.get(vtt.id);
      if (cue !== undefined) out.push(cue);
    }
    return out;
  }

  clear() {
    for (const vtt of this.vtt.values()) this.track.removeCue(vtt);
    this.vtt.clear();
  }
}
