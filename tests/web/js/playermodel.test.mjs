// The viewer controls' decisions: keys, remembered choices, latency text, live/offline state.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  actionForKey, DEFAULT_PREFERENCES, formatLatency, LatencyMeter, Liveness, pickLanguage, Preferences,
  STALL_MS,
} from "../../../sfu_sidecar/web/js/playermodel.js";

class MemoryStorage {
  constructor(items = {}) { this.items = { ...items }; }
  getItem(k) { return k in this.items ? this.items[k] : null; }
  setItem(k, v) { this.items[k] = String(v); }
}

test("the player's keys: space and k, m, f, c, arrows; any case", () => {
  assert.equal(actionForKey({ key: " " }), "playPause");
  assert.equal(actionForKey({ key: "k" }), "playPause");
  assert.equal(actionForKey({ key: "M" }), "mute");
  assert.equal(actionForKey({ key: "f" }), "fullscreen");
  assert.equal(actionForKey({ key: "c" }), "captions");
  assert.equal(actionForKey({ key: "ArrowUp" }), "volumeUp");
  assert.equal(actionForKey({ key: "ArrowDown" }), "volumeDown");
  assert.equal(actionForKey({ key: "x" }), null);
});

test("keys typed into a form control or with a modifier are not the player's", () => {
  for (const tagName of ["INPUT", "TEXTAREA", "SELECT"]) {
    assert.equal(actionForKey({ key: "m", target: { tagName } }), null, tagName);
  }
  assert.equal(actionForKey({ key: "m", target: { tagName: "DIV", isContentEditable: true } }), null);
  assert.equal(actionForKey({ key: "f", ctrlKey: true }), null);
  assert.equal(actionForKey({ key: "c", metaKey: true }), null);
  assert.equal(actionForKey({ key: "k", altKey: true }), null);
  // Space on a button clicks the button; other keys on a button still drive the player.
  assert.equal(actionForKey({ key: " ", target: { tagName: "BUTTON" } }), null);
  assert.equal(actionForKey({ key: "m", target: { tagName: "BUTTON" } }), "mute");
});

test("preferences are remembered across visits", () => {
  const storage = new MemoryStorage();
  const first = new Preferences(storage);
  assert.deepEqual(first.values, DEFAULT_PREFERENCES);
  first.set({ muted: true, volume: 0.4, captions: false, lang: "de" });
  const next = new Preferences(storage);
  assert.deepEqual(next.values, { muted: true, volume: 0.4, captions: false, lang: "de" });
});

test("stored junk, a volume out of range or a storage that throws give the defaults", () => {
  assert.deepEqual(new Preferences(new MemoryStorage({ "sfu-sidecar.viewer": "{not json" })).values,
    DEFAULT_PREFERENCES);
  const odd = new Preferences(new MemoryStorage({
    "sfu-sidecar.viewer": JSON.stringify({ muted: "yes", volume: 7, captions: 1, lang: 5 }),
  }));
  assert.deepEqual(odd.values, { ...DEFAULT_PREFERENCES, volume: 1 });
  const throwing = { getItem() { throw new Error("denied"); }, setItem() { throw new Error("denied"); } };
  const prefs = new Preferences(throwing);
  assert.deepEqual(prefs.values, DEFAULT_PREFERENCES);
  assert.equal(prefs.set({ volume: -1 }).volume, 0); // kept for the visit, clamped
  assert.equal(new Preferences(null).get("captions"), true);
});

test("latency text: ms under a second, tenths under 10 s, whole seconds above, never ahead", () => {
  assert.equal(formatLatency(41.4), "41 ms behind live");
  assert.equal(formatLatency(412), "412 ms behind live");
  assert.equal(formatLatency(2550), "2.5 s behind live");
  assert.equal(formatLatency(12_400), "12 s behind live");
  assert.equal(formatLatency(-30), "0 ms behind live");
  assert.equal(formatLatency(null), null);
  assert.equal(formatLatency(Number.NaN), null);
});

test("the latency shown is the median of recent frames, refreshed at most twice a second", () => {
  const meter = new LatencyMeter({ window: 5, everyMs: 500 });
  assert.equal(meter.add(100, 0), 100);
  assert.equal(meter.add(900, 100), 100); // too soon to change
  meter.add(110, 200);
  meter.add(120, 300);
  assert.equal(meter.add(105, 600), 110); // median of 100, 900, 110, 120, 105
  assert.equal(meter.add(Number.NaN, 700), 110);
  meter.reset();
  assert.equal(meter.shown, null);
});

test("liveness: frames are live; a stall asks about the publisher; none is offline", () => {
  const l = new Liveness();
  assert.equal(l.state, "connecting");
  assert.equal(l.tick(0), false); // nothing to ask before any frame
  l.frame(1000);
  assert.equal(l.state, "live");
  assert.equal(l.tick(1000 + STALL_MS - 1), false);
  assert.equal(l.tick(1000 + STALL_MS), true);
  assert.equal(l.state, "stalled");
  assert.equal(l.tick(1000 + STALL_MS + 500), true); // asked again while stalled
  assert.equal(l.publisherSeen(false), "offline");
  assert.match(l.message(), /offline/);
  assert.equal(l.publisherSeen(true), "buffering");
  l.frame(9000);
  assert.equal(l.state, "live");
  assert.equal(l.message(), "");
});

test("liveness: an answer arriving after frames came back changes nothing; errors stay", () => {
  const l = new Liveness();
  l.frame(0);
  l.tick(STALL_MS);
  l.frame(STALL_MS + 10);
  assert.equal(l.publisherSeen(false), "live");
  l.error("WHEP 401: wrong token for viewing");
  assert.equal(l.publisherSeen(false), "error");
  assert.equal(l.message(), "WHEP 401: wrong token for viewing");
  l.connecting("reconnecting");
  assert.equal(l.message(), "Connecting… (reconnecting)");
});

test("caption language: the viewer's choice, else the browser's languages, else the first", () => {
  assert.equal(pickLanguage(["de", "en"], "en", ["de-DE"]), "en");
  assert.equal(pickLanguage(["de", "en"], "fr", ["en-GB", "de"]), "en"); // primary subtag
  assert.equal(pickLanguage(["de", "pt-BR", "pt"], null, ["pt-BR"]), "pt-BR"); // exact first
  assert.equal(pickLanguage(["de", "es"], null, ["en-US"]), "de");
  assert.equal(pickLanguage([], "en", ["en"]), null);
});
