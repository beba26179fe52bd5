// The operator dashboard's state, pure: the probe's `hello` and `tick` messages in, the time
// series, thresholds and texts the page draws out. No DOM, no network, no clock.

export const MAX_POINTS = 300; // five minutes of one-second ticks per plot
export const MAX_EVENTS = 40;
export const GOOD_MS = 10;
export const FAIR_MS = 30;

// One time-series plot per entry: the columns it draws from a stream's series, and the
// thresholds (from the alert rules the probe announced) drawn across it.
export const STREAM_PLOTS = [
  {
    id: "jitter", title: "Jitter", unit: "ms",
    series: [
      { key: "rfc_video", label: "RFC 3550 video", color: "#4fc3f7" },
      { key: "rfc_audio", label: "RFC 3550 audio", color: "#81c784" },
      { key: "frame_rms_video", label: "frame interval (RMS)", color: "#ffb74d" },
      { key: "viewer_jitter_video", label: "viewers (max RR)", color: "#ba68c8" },
    ],
    thresholds: (rules) => [
      { value: GOOD_MS, label: "good", color: "#66bb6a" },
      { value: FAIR_MS, label: "fair", color: "#ffa726" },
      { value: rules.frame_jitter?.high, label: "frame jitter alert", color: "#ef5350" },
    ],
  },
  {
    id: "skew", title: "A/V skew (+ audio leads)", unit: "ms",
    series: [
      { key: "publisher_skew", label: "publisher capture", color: "#4fc3f7" },
      { key: "viewer_skew", label: "viewers (median)", color: "#81c784" },
      { key: "viewer_skew_worst", label: "worst viewer", color: "#ef9a9a" },
    ],
    thresholds: (rules) => [
      { value: rules.lip_sync_atsc?.high, label: "ATSC +15", color: "#ffa726" },
      { value: rules.lip_sync_atsc?.low, label: "ATSC -45", color: "#ffa726" },
      { value: rules.lip_sync_detectable?.high, label: "BT.1359 +45", color: "#ef5350" },
      { value: rules.lip_sync_detectable?.low, label: "BT.1359 -125", color: "#ef5350" },
    ],
  },
  {
    id: "caption_lag", title: "Captions and dub against the voice (+ after it)", unit: "ms",
    series: [
      { key: "caption_lag_worst", label: "captions, worst language (median of last 10 cues)", color: "#ef9a9a" },
      { key: "caption_lag_best", label: "captions, best language", color: "#81c784" },
      { key: "dub_lag", label: "dub behind its source (median of last 3)", color: "#4fc3f7" },
    ],
    thresholds: (rules) => [
      { value: rules.caption_lag?.high, label: "+300", color: "#ef5350" },
      { value: rules.caption_lag?.low, label: "-300", color: "#ef5350" },
      { value: rules.caption_lag_bt1359?.high, label: "BT.1359 +45", color: "#ffa726" },
      { value: rules.caption_lag_bt1359?.low, label: "BT.1359 -125", color: "#ffa726" },
    ],
  },
  {
    id: "drift", title: "Publisher clock drift", unit: "ppm",
    series: [
      { key: "drift_video", label: "video", color: "#4fc3f7" },
      { key: "drift_audio", label: "audio", color: "#81c784" },
    ],
    thresholds: () => [{ value: 0, label: "", color: "#555" }],
  },
  {
    id: "bursts", title: "Burstiness (kurtosis of frame gaps)", unit: "",
    series: [{ key: "kurtosis_video", label: "video", color: "#ffb74d" }],
    thresholds: (rules) => [
      { value: rules.bursty_delivery?.high, label: "bursty", color: "#ef5350" },
    ],
  },
];

export const CLOCK_PLOT = {
  id: "clock", title: "House clock", unit: "µs",
  series: [
    { key: "offset_us", label: "offset from host", color: "#4fc3f7" },
    { key: "error_us", label: "error bound", color: "#ffb74d" },
  ],
  thresholds: () => [],
};

export const GPU_PLOT = {
  id: "gpu", title: "GPU memory and fragmentation", unit: "%",
  series: [
    { key: "memory_pct", label: "memory used (busiest GPU)", color: "#4fc3f7" },
    { key: "fragmentation_pct", label: "fragmentation (worst renderer)", color: "#ef9a9a" },
  ],
  thresholds: (rules) => [
    { value: rules.gpu_memory?.high, label: "memory alert", color: "#ef5350" },
    { value: rules.gpu_fragmentation?.high === undefined ? undefined
      : rules.gpu_fragmentation.high * 100, label: "fragmentation alert", color: "#ffa726" },
  ],
};

const STREAM_KEYS = [...new Set(STREAM_PLOTS.flatMap((p) => p.series.map((s) => s.key)))];

export function grade(ms) {
  if (ms === null || ms === undefined) return null;
  if (ms < GOOD_MS) return "good";
  return ms <= FAIR_MS ? "fair" : "poor";
}

export function formatBitrate(bps) {
  if (bps === null || bps === undefined) return "–";
  if (bps >= 1e6) return `${(bps / 1e6).toFixed(2)} Mbit/s`;
  return `${(bps / 1e3).toFixed(0)} kbit/s`;
}

export function formatBytes(n) {
  if (n === null || n === undefined) return "–";
  const gib = n / 2 ** 30;
  return gib >= 1 ? `${gib.toFixed(1)} GiB` : `${(n / 2 ** 20).toFixed(0)} MiB`;
}

export function formatMs(ms, digits = 1) {
  return ms === null || ms === undefined ? "–" : `${ms.toFixed(digits)} ms`;
}

// Labels of the caption error bins: (-inf, e0), [e0, e1), ... [e_last, inf).
export function binLabels(edges) {
  const labels = [`< ${edges[0]}`];
  for (let i = 1; i < edges.length; i++) labels.push(`${edges[i - 1]}…${edges[i]}`);
  labels.push(`≥ ${edges[edges.length - 1]}`);
  return labels;
}

// Columns of equal length, the first being time in seconds; the oldest point drops off the end.
export class SeriesTable {
  constructor(keys, maxPoints = MAX_POINTS) {
    this.keys = keys;
    this.max = maxPoints;
    this.t = [];
    this.columns = Object.fromEntries(keys.map((k) => [k, []]));
  }

  push(t, row) {
    if (this.t.length && t <= this.t[this.t.length - 1]) return false; // a replayed tick
    this.t.push(t);
    for (const k of this.keys) this.columns[k].push(row[k] ?? null);
    if (this.t.length > this.max) {
      this.t.shift();
      for (const k of this.keys) this.columns[k].shift();
    }
    return true;
  }

  // uPlot's data layout for the given series keys.
  data(keys) {
    return [this.t, ...keys.map((k) => this.columns[k])];
  }

  get length() {
    return this.t.length;
  }
}

// The numbers one tick gives a stream's plots.
export function streamRow(s) {
  const video = s.tracks?.video ?? {};
  const audio = s.tracks?.audio ?? {};
  return {
    rfc_video: video.jitter_ms ?? null,
    rfc_audio: audio.jitter_ms ?? null,
    frame_rms_video: video.frame_rms_ms ?? null,
    viewer_jitter_video: s.viewer_jitter_ms?.video ?? null,
    publisher_skew: s.publisher_av_skew_ms ?? null,
    viewer_skew: s.viewer_av_skew_ms?.median ?? null,
    viewer_skew_worst: s.viewer_av_skew_worst_ms ?? null,
    drift_video: video.drift_ppm ?? null,
    drift_audio: audio.drift_ppm ?? null,
    kurtosis_video: video.kurtosis ?? null,
    ...captionLagRow(s.caption_lag_ms),
    dub_lag: s.dub_lag_ms?.recent_median ?? null,
  };
}

// The caption languages farthest from and nearest to the voice (median of their last cues).
export function captionLagRow(byLanguage) {
  const lags = Object.values(byLanguage ?? {})
    .map((r) => r.recent_median)
    .filter((v) => typeof v === "number");
  if (!lags.length) return { caption_lag_worst: null, caption_lag_best: null };
  lags.sort((a, b) => Math.abs(a) - Math.abs(b));
  return { caption_lag_worst: lags[lags.length - 1], caption_lag_best: lags.length > 1 ? lags[0] : null };
}

// "en +412 ms (9 cues)" per caption language with a figure.
export function captionLagText(byLanguage) {
  return Object.entries(byLanguage ?? {})
    .filter(([, r]) => typeof r.recent_median === "number")
    .map(([lang, r]) => `${lang} ${r.recent_median >= 0 ? "+" : ""}${Math.round(r.recent_median)} ms (${r.matched} cues)`)
    .join(", ");
}

export function gpuRow(gpu) {
  const devices = gpu?.devices ?? [];
  const renderers = gpu?.renderers ?? [];
  return {
    memory_pct: devices.length ? Math.max(...devices.map((d) => d.used_pct)) : null,
    fragmentation_pct: renderers.length
      ? 100 * Math.max(...renderers.map((r) => r.fragmentation)) : null,
  };
}

export function clockRow(clock) {
  if (!clock) return { offset_us: null, error_us: null };
  return {
    offset_us: clock.offset_ns === null ? null : clock.offset_ns / 1e3,
    error_us: clock.error_ns === null || clock.error_ns === undefined ? null : clock.error_ns / 1e3,
  };
}

export function alertText(alert) {
  const value = typeof alert.value === "number" ? alert.value.toFixed(alert.value >= 100 ? 0 : 2) : "";
  return `${alert.alert} · ${alert.subject}${value ? ` · ${value}` : ""}`;
}

export class DashboardModel {
  constructor(maxPoints = MAX_POINTS) {
    this.maxPoints = maxPoints;
    this.rules = {};
    this.captionEdges = [];
    this.streams = new Map(); // name -> {table, last}
    this.clock = new SeriesTable(CLOCK_PLOT.series.map((s) => s.key), maxPoints);
    this.gpu = new SeriesTable(GPU_PLOT.series.map((s) => s.key), maxPoints);
    this.alerts = [];
    this.events = [];
    this.last = null;
    this.ticks = 0;
  }

  hello(msg) {
    this.rules = Object.fromEntries((msg.rules ?? []).map((r) => [r.alert, r]));
    this.captionEdges = msg.caption_error_edges_ms ?? [];
    for (const tick of msg.history ?? []) this.tick(tick, { replay: true });
  }

  // Applies one tick; returns the names of streams that appeared with it.
  tick(msg, { replay = false } = {}) {
    const t = msg.t_ns / 1e9;
    const added = [];
    for (const [name, s] of Object.entries(msg.streams ?? {})) {
      let entry = this.streams.get(name);
      if (entry === undefined) {
        entry = { table: new SeriesTable(STREAM_KEYS, this.maxPoints), last: null };
        this.streams.set(name, entry);
        added.push(name);
      }
      entry.table.push(t, streamRow(s));
      entry.last = s;
    }
    // A stream the probe no longer reports has ended.
    for (const name of [...this.streams.keys()]) {
      if (!(name in (msg.streams ?? {}))) this.streams.delete(name);
    }
    this.clock.push(t, clockRow(msg.clock));
    this.gpu.push(t, gpuRow(msg.gpu));
    this.alerts = msg.alerts ?? [];
    // On replay the history's events are old news but still the log of what happened.
    this.events = [...[...(msg.events ?? [])].reverse(), ...this.events].slice(0, MAX_EVENTS);
    this.last = msg;
    if (!replay) this.ticks++;
    return added;
  }

  thresholds(plot) {
    return plot.thresholds(this.rules).filter((x) => typeof x.value === "number");
  }

  alertsFor(subject) {
    return this.alerts.filter((a) => a.subject === subject);
  }
}
