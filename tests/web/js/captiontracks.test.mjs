// A player's captions on a fake video element: tracks per language from chunks and the live
// push, each cue shown exactly on the frames of its interval, retractions, language choice.
import assert from "node:assert/strict";
import { test } from "node:test";

import { CaptionTracks } from "../../../sfu_sidecar/web/js/captiontracks.js";

// A text track as the browser keeps it: its active cues are those under the video's
// currentTime, as the browser decides them.
class Track {
  constructor(video, lang) {
    this.video = video;
    this.language = lang;
    this.mode = "disabled";
    this.cues = new Set();
  }

  addCue(c) {
    this.cues.add(c);
  }

  removeCue(c) {
    this.cues.delete(c);
  }

  get activeCues() {
    const t = this.video.currentTime;
    return [...this.cues].filter((c) => c.startTime <= t && t < c.endTime);
  }
}

class Video {
  constructor() {
    this.textTracks = [];
    this.currentTime = 0;
  }

  addTextTrack(kind, label, lang) {
    const track = new Track(this, lang);
    this.textTracks.push(track);
    return track;
  }
}

class Source {
  constructor(url) {
    this.url = String(url);
    this.handlers = {};
    Source.last = this;
  }

  addEventListener(name, handler) {
    this.handlers[name] = handler;
  }

  emit(name, data) {
    this.handlers[name]?.({ data: JSON.stringify(data) });
  }

  close() {
    this.closed = true;
  }
}

const chunk = (cues) => `WEBVTT\nX-TIMESTAMP-MAP=MPEGTS:0,LOCAL:00:00:00.000\n\n${cues}`;
const makeCue = (startTime, endTime, text) => ({ startTime, endTime, text });

function server(chunks) {
  const asked = [];
  const fetchFn = async (url) => {
    const path = new URL(url).pathname;
    asked.push(path);
    const body = chunks[path];
    if (body === undefined) return { status: 404, ok: false, headers: new Map() };
    return {
      status: 200, ok: true, text: async () => body.text,
      headers: new Map([["Cache-Control", body.closed ? "public, immutable" : "no-cache"]]),
    };
  };
  return { asked, fetchFn };
}

function tracks(video, lang = null) {
  const stats = {};
  const captions = new CaptionTracks({
    video, lang, base: new URL("http://sidecar/captions/s/"), stats, makeCue,
  });
  return { captions, stats };
}

test("a cue shows on the frames of its interval and not one frame outside", async () => {
  const video = new Video();
  const { captions } = tracks(video);
  captions.track("en");
  const { fetchFn } = server({
    "/captions/s/en/chunk-0.vtt": { text: chunk("a\n00:00:01.000 --> 00:00:02.000\nhello\n"), closed: true },
  });
  await captions.poll(0.5, 2, fetchFn);
  // currentTime is media time; the stream started 100 s into it.
  const shownAt = (frameS) => {
    video.currentTime = 100 + frameS;
    return captions.place(frameS, video.currentTime).map((c) => c.id);
  };
  assert.deepEqual(shownAt(0.967), []);
  assert.deepEqual(shownAt(1.0), ["a"]);
  assert.deepEqual(shownAt(1.967), ["a"]);
  assert.deepEqual(shownAt(2.0), []);
});

test("closed chunks are fetched once, a future one stops the poll, live ones again", async () => {
  const video = new Video();
  const { captions } = tracks(video);
  captions.track("en");
  const { asked, fetchFn } = server({
    "/captions/s/en/chunk-0.vtt": { text: chunk(""), closed: true },
    "/captions/s/en/chunk-1.vtt": { text: chunk("b\n00:00:02.500 --> 00:00:03.000\nlive\n"), closed: false },
  });
  await captions.poll(0, 2, fetchFn);
  await captions.poll(0, 2, fetchFn);
  assert.deepEqual(asked, [
    "/captions/s/en/chunk-0.vtt", "/captions/s/en/chunk-1.vtt", "/captions/s/en/chunk-2.vtt",
    "/captions/s/en/chunk-1.vtt", "/captions/s/en/chunk-2.vtt",
  ]);
  assert.deepEqual([...captions.tracks.get("en").cues.cues.keys()], ["b"]);
});

test("the live push adds a language's cue at once and takes a retracted one away", () => {
  const video = new Video();
  const { captions, stats } = tracks(video, "de");
  captions.listen(Source);
  assert.equal(Source.last.url, "http://sidecar/captions/s/live");
  Source.last.emit("open", {});
  assert.equal(captions.liveState, "open");
  Source.last.emit("cue", { lang: "en", id: "x", start: 5, end: 6, text: "pushed" });
  Source.last.emit("cue", { lang: "de", id: "y", start: 5, end: 6, text: "gesendet" });
  assert.equal(stats.livePushed, 2);
  // "de" was asked for: it shows, "en" is there to choose.
  assert.deepEqual(video.textTracks.map((t) => [t.language, t.mode]), [["en", "hidden"], ["de", "showing"]]);
  const shownAt = (frameS) => {
    video.currentTime = frameS; // media time is stream time here
    return captions.place(frameS, frameS).map((c) => c.id);
  };
  assert.deepEqual(shownAt(5.5), ["y"]);
  captions.select("en");
  assert.deepEqual(shownAt(5.5), ["x"]);
  Source.last.emit("retract", { lang: "en", id: "x" });
  assert.deepEqual(shownAt(5.6), []);
  assert.equal(video.textTracks[0].cues.size, 0);
  captions.close();
  assert.ok(Source.last.closed);
});

test("a chunk that fails to load is noted and the rest still load", async () => {
  const video = new Video();
  const { captions, stats } = tracks(video);
  captions.track("en");
  const fetchFn = async () => { throw new Error("network down"); };
  await captions.poll(0, 2, fetchFn);
  assert.equal(stats.captionError, "network down");
});

test("a cue book's cues get a track per language; the page names the language it reports", () => {
  const video = new Video();
  const seen = [];
  const captions = new CaptionTracks({
    video, hidden: true, makeCue, onLanguages: (langs) => seen.push(langs),
  });
  const book = new Map([
    ["a", { id: "a", start: 1, end: 2, text: "hello", lang: "en" }],
    ["b", { id: "b", start: 1, end: 2, text: "hallo", lang: "de" }],
    ["c", { id: "c", start: 3, end: 4, text: "no language given" }],
  ]);
  video.currentTime = 1.5;
  let chosen = null;
  const shown = captions.placeBook(1.5, 1.5, book, () => chosen ?? "de");
  assert.deepEqual(shown.map((c) => c.id), ["b"]);
  assert.deepEqual(seen.at(-1), ["en", "de"]);
  assert.ok(video.textTracks.every((t) => t.mode === "hidden")); // the page's controls choose
  chosen = "en";
  assert.deepEqual(captions.placeBook(1.5, 1.5, book, () => chosen).map((c) => c.id), ["a"]);
  video.currentTime = 3.5;
  assert.deepEqual(captions.placeBook(3.5, 3.5, book, "en").map((c) => c.id), ["c"]);
  // A cue gone from the book leaves its track at the next frame.
  book.delete("a");
  video.currentTime = 1.6;
  captions.placeBook(1.6, 1.6, book, "en");
  assert.equal([...video.textTracks[0].cues].some((c) => c.id === "a"), false);
});
