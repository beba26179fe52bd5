// The operator dashboard page: the probe's push channel in, DOM and uPlot canvases out.
// State and thresholds live in dashmodel.js (pure); the WebSocket in dashpush.js.

import uPlot from "/vendor/uPlot.esm.js";

import {
  alertText, binLabels, captionLagText, CLOCK_PLOT, DashboardModel, formatBitrate, formatBytes,
  formatMs, GPU_PLOT, grade, STREAM_PLOTS,
} from "./dashmodel.js";
import { connectDashboard } from "./dashpush.js";
import { wsUrl } from "./wsurl.js";

const model = new DashboardModel();
const plots = new Map(); // "stream/plot" | "clock" | "gpu" -> uPlot
const $ = (id) => document.getElementById(id);
// Exposed for end-to-end tests and for poking at from the console.
window.sfuDashboard = { model, plots, messages: 0 };

// Each plot's y range always spans these, so threshold lines near the data stay in view and a
// quiet signal does not fill the plot with noise.
const MIN_RANGE = {
  jitter: [0, 35], skew: [-60, 30], caption_lag: [-150, 60], drift: [-10, 10], bursts: [-2, 5], gpu: [0, 100],
  clock: [-1, 1],
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function thresholdLines(plot) {
  return (u) => {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    for (const line of model.thresholds(plot)) {
      const y = Math.round(u.valToPos(line.value, "y", true));
      if (y < top || y > top + height) continue;
      ctx.save();
      ctx.strokeStyle = line.color;
      ctx.fillStyle = line.color;
      ctx.lineWidth = Math.max(1, devicePixelRatio);
      ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(left + width, y);
      ctx.stroke();
      if (line.label) {
        ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
        ctx.textAlign = "right";
        ctx.fillText(line.label, left + width - 4 * devicePixelRatio, y - 3 * devicePixelRatio);
      }
      ctx.restore();
    }
  };
}

function makePlot(plot, container) {
  const [lo, hi] = MIN_RANGE[plot.id] ?? [0, 1];
  const opts = {
    width: Math.max(container.clientWidth, 280),
    height: 170,
    cursor: { drag: { x: false, y: false } },
    legend: { live: false },
    scales: {
      x: { time: true },
      y: {
        range: (u, min, max) => {
          const low = Math.min(lo, min ?? lo);
          const high = Math.max(hi, max ?? hi);
          const pad = (high - low) * 0.08;
          return [low === 0 && min !== null && min >= 0 ? 0 : low - pad, high + pad];
        },
      },
    },
    axes: [
      { stroke: "#aaa", grid: { stroke: "#2a2a2a" }, ticks: { stroke: "#333" } },
      { stroke: "#aaa", grid: { stroke: "#2a2a2a" }, ticks: { stroke: "#333" }, size: 56,
        label: plot.unit, labelSize: 18 },
    ],
    series: [{}, ...plot.series.map((s) => ({ label: s.label, stroke: s.color, width: 1.6,
      spanGaps: false, points: { show: false } }))],
    hooks: { draw: [thresholdLines(plot)] },
  };
  const u = new uPlot(opts, [[], ...plot.series.map(() => [])], container);
  return u;
}

function streamSection(name) {
  const section = el("section", { class: "stream", "data-stream": name });
  section.append(
    el("header", {},
      el("h2", {}, name),
      el("span", { class: "badge", "data-field": "publisher" }, ""),
      el("span", { "data-field": "viewers" }, ""),
      el("span", { "data-field": "bitrate" }, ""),
      el("span", { "data-field": "grades" }, ""),
      el("span", { "data-field": "alerts", class: "stream-alerts" }, "")),
    el("div", { class: "figures", "data-field": "figures" }),
  );
  const grid = el("div", { class: "plots" });
  for (const plot of STREAM_PLOTS) {
    const box = el("figure", { "data-plot": plot.id }, el("figcaption", {}, plot.title));
    const holder = el("div", { class: "plot" });
    box.append(holder);
    grid.append(box);
  }
  const captions = el("figure", { "data-plot": "captions" },
    el("figcaption", {}, "Caption timing error, recent cues (ms)"),
    el("div", { class: "bars", "data-field": "caption-bars" }));
  grid.append(captions);
  section.append(grid);
  $("streams").append(section);
  for (const plot of STREAM_PLOTS) {
    const holder = section.querySelector(`[data-plot="${plot.id}"] .plot`);
    plots.set(`${name}/${plot.id}`, makePlot(plot, holder));
  }
  return section;
}

function set(section, field, text, cls) {
  const node = section.querySelector(`[data-field="${field}"]`);
  if (node.textContent !== text) node.textContent = text;
  if (cls !== undefined) node.className = cls;
}

function renderCaptionBars(section, counts) {
  const box = section.querySelector('[data-field="caption-bars"]');
  const labels = binLabels(model.captionEdges);
  const peak = Math.max(1, ...counts);
  box.replaceChildren(...labels.map((label, i) => el("div", { class: "bar" },
    el("div", { class: "fill", style: `height:${(100 * (counts[i] ?? 0)) / peak}%` }),
    el("span", { class: "count" }, String(counts[i] ?? 0)),
    el("span", { class: "label" }, label))));
}

function renderStream(name, entry) {
  const s = entry.last;
  const section = document.querySelector(`section[data-stream="${CSS.escape(name)}"]`)
    ?? streamSection(name);
  set(section, "publisher", s.publisher ? "publishing" : "no publisher",
    s.publisher ? "badge ok" : "badge off");
  set(section, "viewers", `${s.viewers} viewer${s.viewers === 1 ? "" : "s"}`);
  const rates = Object.entries(s.bitrate_bps ?? {}).map(([k, v]) => `${k} ${formatBitrate(v)}`);
  set(section, "bitrate", rates.join(" · ") || "–");
  const video = s.tracks?.video ?? {};
  const jitterGrade = grade(video.jitter_ms);
  const frameGrade = grade(video.frame_rms_ms);
  set(section, "grades", `jitter ${jitterGrade ?? "–"} · frames ${frameGrade ?? "–"}`,
    `grade ${frameGrade === "poor" || jitterGrade === "poor" ? "poor" : ""}`);
  const alerts = model.alertsFor(name);
  set(section, "alerts", alerts.map((a) => a.alert).join(" · "),
    alerts.length ? "stream-alerts active" : "stream-alerts");
  const clockError = s.clock_error_ms?.max;
  set(section, "figures", [
    `RFC 3550 video ${formatMs(video.jitter_ms)}`,
    `frame interval RMS ${formatMs(video.frame_rms_ms)} (p-p ${formatMs(video.frame_p2p_ms)})`,
    `kurtosis ${video.kurtosis?.toFixed(2) ?? "–"}`,
    `drift ${video.drift_ppm?.toFixed(1) ?? "–"} ppm`,
    `publisher A/V ${formatMs(s.publisher_av_skew_ms)}`,
    `viewers A/V ${formatMs(s.viewer_av_skew_ms?.median)}`,
    `viewer clock join ±${formatMs(clockError, 2)}`,
    `discontinuities ${video.discontinuities ?? 0}`,
    `resyncs ${s.resyncs}`,
    `captions vs voice ${captionLagText(s.caption_lag_ms) || "–"}`,
    ...(s.dub_lag_ms ? [`dub of ${s.dub_lag_ms.source} ${formatMs(s.dub_lag_ms.recent_median, 0)} behind`] : []),
  ].join("   "));
  for (const plot of STREAM_PLOTS) {
    plots.get(`${name}/${plot.id}`).setData(entry.table.data(plot.series.map((x) => x.key)));
  }
  renderCaptionBars(section, s.caption_error_counts ?? []);
}

function renderAlerts() {
  const list = $("alerts");
  list.replaceChildren(...model.alerts.map((a) => el("li", {
    class: "alert", "data-alert": a.alert, "data-subject": a.subject,
    title: `${a.summary}${a.detail ? ` (${a.detail})` : ""}`,
  }, alertText(a))));
  $("no-alerts").hidden = model.alerts.length > 0;
  $("events").replaceChildren(...model.events.slice(0, 12).map((e) => el("li", {
    class: e.state, "data-alert": e.alert, "data-state": e.state,
  }, `${new Date(e.t_ns / 1e6).toLocaleTimeString()} ${e.state} ${e.alert} · ${e.subject}`)));
}

function renderClockAndGpu() {
  const tick = model.last;
  const clock = tick?.clock;
  $("clock-state").textContent = clock
    ? `${clock.source}/${clock.state} · offset ${(clock.offset_ns / 1e3).toFixed(1)} µs · error ${clock.error_ns === null ? "unbounded" : `±${(clock.error_ns / 1e3).toFixed(1)} µs`}`
    : "–";
  const gpu = tick?.gpu;
  if (!gpu) return;
  const devices = gpu.devices.map((d) => `GPU ${d.index} ${d.name}: ${formatBytes(d.used_bytes)} of ${formatBytes(d.total_bytes)} (${d.used_pct.toFixed(1)} %)`);
  const renderers = gpu.renderers.map((r) => `${r.renderer}: fragmentation ${r.fragmentation.toFixed(2)}, reserved/allocated ${r.reserved_ratio?.toFixed(2) ?? "–"}`);
  $("gpu-state").textContent = [
    gpu.available ? devices.join(" · ") : `NVML unavailable: ${gpu.reason}`,
    ...renderers,
  ].join(" · ");
  plots.get("clock").setData(model.clock.data(CLOCK_PLOT.series.map((s) => s.key)));
  const gpuData = model.gpu.data(GPU_PLOT.series.map((s) => s.key));
  // Without a GPU or a reporting renderer an empty plot says nothing the text does not.
  $("gpu-plot").hidden = !gpuData.slice(1).some((col) => col.some((v) => v !== null));
  plots.get("gpu").setData(gpuData);
}

function render() {
  for (const [name, entry] of model.streams) renderStream(name, entry);
  for (const section of document.querySelectorAll("section.stream")) {
    const name = section.dataset.stream;
    if (model.streams.has(name)) continue;
    for (const plot of STREAM_PLOTS) {
      plots.get(`${name}/${plot.id}`)?.destroy();
      plots.delete(`${name}/${plot.id}`);
    }
    section.remove();
  }
  $("no-streams").hidden = model.streams.size > 0;
  renderAlerts();
  renderClockAndGpu();
}

function onMessage(message) {
  window.sfuDashboard.messages++;
  if (message.type === "hello") model.hello(message);
  else if (message.type === "tick") model.tick(message);
  else return;
  render();
}

function resize() {
  for (const u of plots.values()) {
    const width = u.root.parentElement.clientWidth;
    if (width && Math.abs(width - u.width) > 4) u.setSize({ width, height: u.height });
  }
}

plots.set("clock", makePlot(CLOCK_PLOT, $("clock-plot")));
plots.set("gpu", makePlot(GPU_PLOT, $("gpu-plot")));
window.addEventListener("resize", resize);
connectDashboard(wsUrl("/api/dashboard/ws"), {
  onMessage,
  onState: (state) => {
    $("link").textContent = state === "open" ? "live" : "reconnecting…";
    $("link").className = state === "open" ? "badge ok" : "badge off";
  },
});
