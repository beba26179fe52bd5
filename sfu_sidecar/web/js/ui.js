// DOM updates only; no network, no timing logic.

const $ = (id) => document.getElementById(id);

export function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

export function showFrameInfo({ streamS, source, mapped, presented, lostBatches }) {
  $("stream-time").textContent = streamS === null ? "–" : streamS.toFixed(3);
  $("source").textContent = source ?? "–";
  $("mapped").textContent = presented ? `${((100 * mapped) / presented).toFixed(1)} %` : "–";
  $("lost").textContent = String(lostBatches);
}

// The playback toggle keeps the page's other parameters; the MSE rows show in MSE mode only.
export function showMode(mode, params, stream) {
  $("mode").textContent = mode;
  $("stream-name").textContent = stream;
  $("title").textContent = stream;
  document.title = `${stream} · live`;
  for (const [id, value] of [["mode-webrtc", null], ["mode-mse", "mse"]]) {
    const next = new URLSearchParams(params);
    if (value === null) next.delete("mode");
    else next.set("mode", value);
    $(id).href = `?${next}`;
  }
  for (const el of document.querySelectorAll(".mse")) el.hidden = mode !== "mse";
}

export function showMseStats(s) {
  const last = s.lastCorrection;
  const moved = last === null ? "" : ` (${last.reason} ${((last.jumpS ?? last.correctionS) * 1000).toFixed(0)} ms at ${last.atS.toFixed(2)} s)`;
  $("resyncs").textContent = `${s.resyncs}${moved}`;
  $("buffer").textContent = s.bufferAheadS === null ? "–" : `${s.bufferAheadS.toFixed(2)} s`;
  $("caption-error").textContent = s.captionErrorP95Ms === null ? "–" : `${s.captionErrorP95Ms.toFixed(1)} ms (${s.cuesShown} cues)`;
  $("stream-time").textContent = s.streamS === null ? "–" : s.streamS.toFixed(3);
}

// A <select> filled with `options` ({value, label}) and `selected` chosen, or with one
// `fallback` entry when there are none.
export function fillSelect(select, { options, selected }, fallback) {
  select.replaceChildren(...(options.length ? options : [{ value: "", label: fallback }]).map((o) => {
    const option = document.createElement("option");
    option.value = o.value;
    option.textContent = o.label;
    return option;
  }));
  select.value = options.length ? selected : "";
}
