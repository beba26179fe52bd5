// The dashboard's model: ticks in, series, thresholds and texts out.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  alertText, binLabels, captionLagRow, captionLagText, DashboardModel, formatBitrate,
  formatBytes, grade, GPU_PLOT, SeriesTable, STREAM_PLOTS, streamRow,
} from "../../../sfu_sidecar/web/js/dashmodel.js";

const RULES = [
  { alert: "frame_jitter", high: 112, low: null },
  { alert: "lip_sync_atsc", high: 15, low: -45 },
  { alert: "lip_sync_detectable", high: 45, low: -125 },
  { alert: "bursty_delivery", high: 3.5, low: null },
  { alert: "gpu_memory", high: 95, low: null },
  { alert: "gpu_fragmentation", high: 0.68, low: null },
];

function tick(second, streams, extra = {}) {
  return {
    type: "tick", t_ns: second * 1e9, streams, alerts: [], events: [],
    clock: { source: "system", state: "freerun", offset_ns: 1500, error_ns: null },
    gpu: { available: false, reason: "x", devices: [], renderers: [] }, ...extra,
  };
}

const LIVE = {
  publisher: true, viewers: 2, bitrate_bps: { video: 1_500_000 },
  tracks: { video: { jitter_ms: 4.2, frame_rms_ms: 130, kurtosis: 5.1, drift_ppm: 12.5 },
    audio: { jitter_ms: 1.1, drift_ppm: 12.4 } },
  publisher_av_skew_ms: 8, viewer_av_skew_ms: { median: -20, min: -60, max: 3 },
  viewer_av_skew_worst_ms: -60, viewer_jitter_ms: { video: 9.5 },
};

test("grades and formats", () => {
  assert.deepEqual([grade(null), grade(9.9), grade(10), grade(30), grade(30.1)],
    [null, "good", "fair", "fair", "poor"]);
  assert.equal(formatBitrate(1_520_000), "1.52 Mbit/s");
  assert.equal(formatBitrate(64_000), "64 kbit/s");
  assert.equal(formatBytes(3 * 2 ** 30), "3.0 GiB");
  assert.equal(formatBytes(5 * 2 ** 20), "5 MiB");
  assert.deepEqual(binLabels([-10, 0, 10]), ["< -10", "-10…0", "0…10", "≥ 10"]);
  assert.equal(alertText({ alert: "frame_jitter", subject: "live", value: 130.4 }),
    "frame_jitter · live · 130");
});

test("a stream's row takes every plotted figure from the tick", () => {
  const row = streamRow(LIVE);
  assert.equal(row.rfc_video, 4.2);
  assert.equal(row.frame_rms_video, 130);
  assert.equal(row.viewer_skew, -20);
  assert.equal(row.viewer_skew_worst, -60);
  assert.equal(row.viewer_jitter_video, 9.5);
  assert.equal(row.drift_audio, 12.4);
  assert.equal(streamRow({ tracks: {} }).rfc_video, null);
  for (const plot of STREAM_PLOTS) for (const s of plot.series) assert.ok(s.key in row, s.key);
});

test("the caption lag plot follows the languages farthest from and nearest to the voice", () => {
  const lags = {
    en: { recent_median: -498.2, matched: 8 },
    de: { recent_median: 151, matched: 8 },
    fr: { recent_median: 2.4, matched: 7 },
    it: { recent_median: null, matched: 1 },
  };
  assert.deepEqual(captionLagRow(lags), { caption_lag_worst: -498.2, caption_lag_best: 2.4 });
  assert.deepEqual(captionLagRow({ en: lags.en }), { caption_lag_worst: -498.2, caption_lag_best: null });
  assert.deepEqual(captionLagRow(undefined), { caption_lag_worst: null, caption_lag_best: null });
  assert.equal(captionLagText(lags), "en -498 ms (8 cues), de +151 ms (8 cues), fr +2 ms (7 cues)");
  assert.equal(streamRow({ tracks: {}, caption_lag_ms: lags }).caption_lag_worst, -498.2);
  const plot = STREAM_PLOTS.find((p) => p.id === "caption_lag");
  const lines = plot.thresholds({ caption_lag: { high: 300, low: -300 },
    caption_lag_bt1359: { high: 45, low: -125 } }).map((x) => x.value);
  assert.deepEqual(lines, [300, -300, 45, -125]);
});

test("series keep the last points and refuse replayed ticks", () => {
  const table = new SeriesTable(["a"], 3);
  for (let t = 1; t <= 5; t++) table.push(t, { a: t * 10 });
  assert.equal(table.push(5, { a: 0 }), false);
  assert.deepEqual(table.data(["a"]), [[3, 4, 5], [30, 40, 50]]);
});

test("hello replays history, ticks extend it, ended streams go", () => {
  const model = new DashboardModel();
  model.hello({ type: "hello", rules: RULES, caption_error_edges_ms: [0, 17],
    history: [tick(1, { live: LIVE }), tick(2, { live: LIVE })] });
  assert.equal(model.ticks, 0);
  assert.equal(model.streams.get("live").table.length, 2);
  const added = model.tick(tick(3, { live: LIVE, other: { tracks: {} } }, {
    alerts: [{ alert: "frame_jitter", subject: "live", value: 130 }],
    events: [{ alert: "frame_jitter", subject: "live", state: "raised", t_ns: 3e9 }],
  }));
  assert.deepEqual(added, ["other"]);
  assert.equal(model.ticks, 1);
  assert.deepEqual(model.alertsFor("live").map((a) => a.alert), ["frame_jitter"]);
  assert.equal(model.events[0].state, "raised");
  model.tick(tick(4, { live: LIVE }));
  assert.deepEqual([...model.streams.keys()], ["live"]);
  assert.deepEqual(model.clock.data(["offset_us"])[1], [1.5, 1.5, 1.5, 1.5]);
});

test("thresholds come from the announced rules", () => {
  const model = new DashboardModel();
  model.hello({ rules: RULES, history: [] });
  const [jitter, skew] = STREAM_PLOTS;
  assert.deepEqual(model.thresholds(jitter).map((x) => x.value), [10, 30, 112]);
  assert.deepEqual(model.thresholds(skew).map((x) => x.value), [15, -45, 45, -125]);
  assert.deepEqual(model.thresholds(GPU_PLOT).map((x) => x.value), [95, 68]);
  // Before the rules arrive, only the fixed grade lines are drawn.
  assert.deepEqual(new DashboardModel().thresholds(jitter).map((x) => x.value), [10, 30]);
});

test("GPU row: busiest device and worst renderer", () => {
  const model = new DashboardModel();
  model.tick(tick(1, {}, { gpu: { available: true, devices: [{ used_pct: 40 }, { used_pct: 96.5 }],
    renderers: [{ fragmentation: 0.2 }, { fragmentation: 0.7 }] } }));
  assert.deepEqual(model.gpu.data(["memory_pct", "fragmentation_pct"]), [[1], [96.5], [70]]);
});
