// Cues on a text track: where a cue sits for a presented frame, and where on the video a
// producer's cue settings put it.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  cueSettings, formatTimestamp, FrameCues, parseTimestamp, wordsForFrame, wordTimes,
} from "../../../sfu_sidecar/web/js/cuetrack.js";

test("cue settings become VTTCue properties as WebVTT parses them", () => {
  assert.deepEqual(cueSettings(""), {});
  assert.deepEqual(cueSettings("line:0 align:start"),
    { line: 0, snapToLines: true, lineAlign: "start", align: "start" });
  assert.deepEqual(cueSettings("line:-2,end position:20%,line-left size:50% vertical:rl"), {
    line: -2, snapToLines: true, lineAlign: "end", position: 20, positionAlign: "line-left",
    size: 50, vertical: "rl",
  });
  assert.deepEqual(cueSettings("line:10.5%"), { line: 10.5, snapToLines: false, lineAlign: "start" });
  // Bad values and unknown settings are skipped; the good ones around them still apply.
  assert.deepEqual(cueSettings("line:abc position:120% size:x align:middle region:r1 size:30%"),
    { size: 30 });
});

// A track and cues as the browser has them, enough for FrameCues.
class Track {
  constructor() {
    this.cues = new Set();
  }

  addCue(c) {
    this.cues.add(c);
  }

  removeCue(c) {
    this.cues.delete(c);
  }
}
const makeCue = (startTime, endTime, text) => ({ startTime, endTime, text });

test("a cue is placed with its settings, and new settings replace the VTTCue", () => {
  const track = new Track();
  const placer = new FrameCues(track, { makeCue });
  placer.place(10, 100);
  placer.sync("a", { id: "a", start: 9.5, end: 11, text: "hi", settings: "line:0 align:start" });
  const [first] = track.cues;
  assert.equal(first.line, 0);
  assert.equal(first.align, "start");
  assert.equal(first.startTime, 99.5);
  placer.sync("a", { id: "a", start: 9.5, end: 11, text: "hi", settings: "line:90%" }, true);
  const [second] = track.cues;
  assert.notEqual(second, first);
  assert.equal(track.cues.size, 1);
  assert.equal(second.line, 90);
  assert.equal(second.snapToLines, false);
  assert.equal(second.align, undefined); // the default the browser's VTTCue keeps
  // The same cue without settings (an older relay) is a change too, to the defaults.
  placer.sync("a", { id: "a", start: 9.5, end: 11, text: "hi" }, true);
  const [third] = track.cues;
  assert.notEqual(third, second);
  assert.equal(third.line, undefined);
});

// A track whose list of active cues is brought up to date only when cues are added or removed,
// or when told to: as Chromium did in MSE playback after a cue's times were moved.
class LaggingTrack extends Track {
  constructor() {
    super();
    this.activeCues = [];
    this.t = 0;
  }

  evaluate() {
    this.activeCues = [...this.cues].filter((c) => c.startTime <= this.t && this.t < c.endTime);
  }

  addCue(c) {
    super.addCue(c);
    this.evaluate();
  }

  removeCue(c) {
    super.removeCue(c);
    this.evaluate();
  }
}

test("a cue the browser still lists as active past its end is put back fresh", () => {
  const track = new LaggingTrack();
  const placer = new FrameCues(track, { makeCue });
  const cue = { id: "a", start: 1, end: 2, text: "hi" };
  const cues = new Map([["a", cue]]);
  // Frames 0.5 s apart on a currentTime that runs with them.
  for (const frameS of [1.0, 1.5]) {
    track.t = 10 + frameS;
    placer.place(frameS, track.t);
    placer.syncAll(cues);
  }
  assert.deepEqual(placer.active(cues), [cue]);
  // Past its end: the VTTCue is moved off, but the lagging list still has it.
  track.t = 12.1;
  placer.place(2.1, track.t);
  placer.syncAll(cues);
  assert.deepEqual(placer.active(cues), [cue]); // the browser's word, not yet re-evaluated
  assert.equal(placer.refreshes, 0);
  // The next frame finds the disagreement and replaces the cue: the list is right at once.
  track.t = 12.2;
  placer.place(2.2, track.t);
  placer.syncAll(cues);
  assert.deepEqual(placer.active(cues), []);
  assert.equal(placer.refreshes, 1);
  assert.equal(track.cues.size, 1);
  // Agreeing again, it is left alone.
  track.t = 12.3;
  placer.place(2.3, track.t);
  placer.syncAll(cues);
  assert.equal(placer.refreshes, 1);
});

test("word timestamps are read as WebVTT reads them and written back", () => {
  assert.deepEqual(wordTimes("a <00:01.200>b <1:00:00.001>c <00:1.2>d <b>e</b> <00:03.000"),
    [1.2, 3600.001, 3]);
  assert.equal(parseTimestamp("12:34"), null);
  assert.equal(parseTimestamp("00:60.000"), null);
  assert.equal(formatTimestamp(3723.456), "01:02:03.456");
  assert.equal(formatTimestamp(-1), "00:00:00.000");
});

test("the words the frame on screen has reached are past, the others future", () => {
  const text = "<v Ann>Good <00:00:04.400>evening <00:00:04.900>all</v>";
  // Captured at 4.5 s, presented at currentTime 100: one word reached.
  const mid = wordsForFrame(text, 4.5, 100);
  assert.equal(mid.said, 1);
  assert.equal(mid.text, "<v Ann>Good <00:01:39.999>evening <00:01:40.500>all</v>");
  assert.equal(wordsForFrame(text, 4.0, 100).said, 0);
  assert.equal(wordsForFrame(text, 4.9, 100).said, 2); // a word starts on its frame
  assert.deepEqual(wordsForFrame("no words", 4, 100), { text: "no words", said: 0 });
});

test("a word-timed cue's text is rewritten as the frames reach its words, not otherwise", () => {
  const track = new Track();
  const placer = new FrameCues(track, { makeCue });
  const cue = { id: "w", start: 4.0, end: 6.0, text: "Good <00:00:04.400>evening" };
  placer.place(4.1, 50);
  placer.sync("w", cue);
  const [vtt] = track.cues;
  assert.equal(vtt.text, "Good <00:00:50.500>evening"); // future, guard ahead
  placer.place(4.2, 50.1);
  placer.sync("w", cue);
  assert.equal(placer.wordMarks, 0); // nothing reached yet, and the guard still ahead
  placer.place(4.4, 50.3);
  placer.sync("w", cue);
  assert.equal(vtt.text, "Good <00:00:50.299>evening");
  assert.equal(placer.wordMarks, 1);
  assert.equal([...track.cues][0], vtt); // the same VTTCue: only its text changed
  // A long word: before currentTime could pass the future times, they are moved on.
  const slow = { id: "s", start: 4.0, end: 9.0, text: "a <00:00:08.000>b" };
  placer.place(4.5, 50.4);
  placer.sync("s", slow);
  placer.place(4.8, 50.7);
  placer.sync("s", slow);
  const s = [...track.cues].find((c) => c.id === "s");
  assert.equal(s.text, "a <00:00:51.200>b");
});
