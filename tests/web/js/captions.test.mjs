import assert from "node:assert/strict";
import { test } from "node:test";

import { CueBook } from "../../../sfu_sidecar/web/js/captions.js";

const epoch = 1_700_000_000_000_000_000n;

test("a cue shows exactly while frames captured in its interval show", () => {
  const book = new CueBook();
  book.apply({ type: "epoch", stream: "s", epoch_ns: epoch });
  book.apply({ type: "cue", stream: "s", lang: "en", id: "a", start: 2.0, end: 3.0, text: "hi", final: true });
  const at = (s) => book.activeAt(book.streamSeconds(epoch + BigInt(Math.round(s * 1e9))));
  assert.deepEqual(at(1.999).map((c) => c.id), []);
  assert.deepEqual(at(2.0).map((c) => c.id), ["a"]);
  assert.deepEqual(at(2.999).map((c) => c.id), ["a"]);
  assert.deepEqual(at(3.0).map((c) => c.id), []); // end is exclusive
});

test("a cue keeps the settings the relay sent, none when it sent none", () => {
  const book = new CueBook();
  book.apply({ type: "cue", id: "a", start: 1, end: 2, text: "x", settings: "line:0" });
  book.apply({ type: "cue", id: "b", start: 1, end: 2, text: "y" });
  assert.equal(book.cues.get("a").settings, "line:0");
  assert.equal(book.cues.get("b").settings, "");
});

test("updates replace by id, retractions remove, order is by start", () => {
  const book = new CueBook();
  book.setEpoch(0n);
  book.apply({ type: "cue", id: "b", start: 1, end: 5, text: "interim", final: false });
  book.apply({ type: "cue", id: "a", start: 0.5, end: 4, text: "first" });
  book.apply({ type: "cue", id: "b", start: 1, end: 5, text: "final", final: true });
  assert.deepEqual(book.activeAt(2).map((c) => c.text), ["first", "final"]);
  assert.equal(book.apply({ type: "cue_retract", id: "a" }), true);
  assert.deepEqual(book.activeAt(2).map((c) => c.id), ["b"]);
  assert.equal(book.apply({ type: "cue_retract", id: "zz" }), false);
});

test("no epoch means no stream time, and zero-length cues are refused", () => {
  const book = new CueBook();
  assert.equal(book.streamSeconds(5n), null);
  assert.deepEqual(book.activeAt(null), []);
  assert.equal(book.apply({ type: "cue", id: "z", start: 1, end: 1, text: "x" }), false);
});

test("prune keeps memory bounded", () => {
  const book = new CueBook();
  for (let i = 0; i < 100; i++) book.apply({ type: "cue", id: `c${i}`, start: i, end: i + 1, text: "t" });
  book.prune(100, 10);
  assert.equal(book.cues.size, 11);
});
