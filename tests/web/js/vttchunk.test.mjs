// Caption chunks into stream-time cues: timestamp map, ids, merging and retraction per chunk.
import { test } from "node:test";
import assert from "node:assert/strict";

import { ChunkedCues, mapOffset, parseChunk, parseTimestamp, VttError } from "../../../sfu_sidecar/web/js/vttchunk.js";

const CHUNK = `WEBVTT
X-TIMESTAMP-MAP=MPEGTS:540000,LOCAL:00:00:06.000
X-STREAM-EPOCH-NS=1700000000000000000

c1
00:00:05.500 --> 00:00:07.000 line:90%
hello
world

c2
00:00:07.250 --> 00:00:08.000
again
`;

test("timestamps", () => {
  assert.equal(parseTimestamp("00:00:05.500"), 5.5);
  assert.equal(parseTimestamp("01:02.003"), 62.003);
  assert.equal(parseTimestamp("27:00:00.000"), 97200);
  assert.throws(() => parseTimestamp("5.5"), VttError);
});

test("a chunk with the identity map: cue times are stream times, ids kept", () => {
  const { offset, cues } = parseChunk(CHUNK, 6);
  assert.equal(offset, 0);
  assert.deepEqual(cues, [
    { id: "c1", start: 5.5, end: 7, text: "hello\nworld", settings: "line:90%" },
    { id: "c2", start: 7.25, end: 8, text: "again", settings: "" },
  ]);
});

test("cue settings after the end time are kept, and a change of them is a change of the cue", () => {
  const placed = CHUNK.replace("00:00:07.000 line:90%", "00:00:07.000 line:0  align:start");
  const { cues } = parseChunk(placed, 6);
  assert.equal(cues[0].settings, "line:0 align:start");
  assert.equal(cues[0].end, 7);
  const chunked = new ChunkedCues();
  chunked.merge(0, parseChunk(CHUNK, 6).cues);
  assert.deepEqual(chunked.merge(0, cues).added, ["c1"]);
});

test("a map to other media times moves the cues", () => {
  const shifted = CHUNK.replace("MPEGTS:540000", "MPEGTS:900000"); // 10 s for cue time 6 s
  const { offset, cues } = parseChunk(shifted, 10);
  assert.equal(offset, 4);
  assert.equal(cues[0].start, 9.5);
});

test("the 33-bit MPEGTS wrap is undone near the chunk's time", () => {
  const wrapS = 2 ** 33 / 90000;
  const local = 100000; // past one wrap (~95443.7 s)
  const mpegts = Math.round(((local % wrapS) * 90000));
  const header = `WEBVTT\nX-TIMESTAMP-MAP=MPEGTS:${mpegts},LOCAL:27:46:40.000`;
  assert.ok(Math.abs(mapOffset(header, local)) < 1e-3);
});

test("not WebVTT, or a map without its fields, is an error", () => {
  assert.throws(() => parseChunk("hello"), VttError);
  assert.throws(() => parseChunk("WEBVTT\nX-TIMESTAMP-MAP=LOCAL:00:00:00.000\n"), VttError);
});

test("cues without ids get one from times and text; NOTE blocks are skipped", () => {
  const { cues } = parseChunk("WEBVTT\n\nNOTE a note\n\n00:00:01.000 --> 00:00:02.000\nx\n");
  assert.deepEqual(cues, [{ id: "1.000-2.000-x", start: 1, end: 2, text: "x", settings: "" }]);
});

test("merging: a newer copy of a chunk retracts what it no longer holds", () => {
  const book = new ChunkedCues();
  const a = { id: "a", start: 1, end: 3, text: "a" };
  const b = { id: "b", start: 2, end: 2.5, text: "b" };
  assert.deepEqual(book.merge(0, [a, b]), { added: ["a", "b"], removed: [] });
  assert.deepEqual(book.merge(1, [a]), { added: [], removed: [] }); // a crosses into chunk 1
  assert.deepEqual(book.merge(0, [a, { ...b, text: "B" }]), { added: ["b"], removed: [] });
  assert.deepEqual(book.merge(0, []), { added: [], removed: ["b"] }); // a is still in chunk 1
  assert.deepEqual([...book.cues.keys()], ["a"]);
  assert.deepEqual(book.merge(1, []), { added: [], removed: ["a"] });
});

test("prune forgets old chunks and their cues", () => {
  const book = new ChunkedCues();
  book.merge(0, [{ id: "a", start: 1, end: 2, text: "a" }]);
  book.merge(20, [{ id: "z", start: 41, end: 42, text: "z" }]);
  assert.deepEqual(book.prune(40, 2, 30), ["a"]);
  assert.deepEqual([...book.cues.keys()], ["z"]);
});

test("live push: a cue before its chunk shows it, kept by a stale copy, retracted live", () => {
  const book = new ChunkedCues();
  const cue = { id: "p", start: 4.0001, end: 5.2, text: "pushed", settings: "line:10%" };
  assert.equal(book.push(cue), true);
  assert.deepEqual(book.cues.get("p"), { ...cue, start: 4 });
  assert.equal(book.push({ ...cue }), false); // the same again: no change
  // A copy of its chunk fetched before it was ingested does not take it away...
  assert.deepEqual(book.merge(2, []), { added: [], removed: [] });
  // ...one that holds it takes it over, and a later copy without it retracts it.
  assert.deepEqual(book.merge(2, [{ ...cue, start: 4 }]), { added: [], removed: [] });
  assert.deepEqual(book.merge(2, []), { added: [], removed: ["p"] });
  book.push({ id: "q", start: 6, end: 7, text: "q" });
  assert.equal(book.retract("q"), true);
  assert.equal(book.retract("q"), false);
  assert.equal(book.cues.size, 0);
});

test("a chunk asked for before a live change does not undo it (a barge-in's cut, a retraction)", () => {
  const book = new ChunkedCues();
  const full = { id: "c", start: 5, end: 7, text: "the rain <00:00:06.000>moves east", settings: "" };
  book.merge(2, [full]);
  const askedAt = book.version; // a poll of chunk 2 goes out...
  const cut = { ...full, end: 5.92, text: "the rain" };
  assert.equal(book.push(cut), true); // ...the cut arrives live while it is on its way...
  // ...and the chunk's answer, written before the cut, leaves the cut alone.
  assert.deepEqual(book.merge(2, [full], askedAt), { added: [], removed: [] });
  assert.deepEqual(book.cues.get("c"), cut);
  // A chunk asked for after the cut carries it: taken as it is.
  assert.deepEqual(book.merge(2, [cut], book.version), { added: [], removed: [] });
  assert.deepEqual(book.merge(2, [{ ...cut, text: "the" }], book.version), { added: ["c"], removed: [] });
  // A retraction pushed while an older copy was on its way is not brought back by it.
  const before = book.version;
  assert.equal(book.retract("c"), true);
  assert.deepEqual(book.merge(2, [cut], before), { added: [], removed: [] });
  assert.equal(book.cues.has("c"), false);
});

test("prune forgets pushed cues that ended long ago", () => {
  const book = new ChunkedCues();
  book.push({ id: "old", start: 1, end: 2, text: "old" });
  book.push({ id: "new", start: 50, end: 51, text: "new" });
  assert.deepEqual(book.prune(40, 2, 30), ["old"]);
  assert.deepEqual([...book.cues.keys()], ["new"]);
});
