// DOM updates only; no network, no timing logic.

const $ = (id) => document.getElementById(id);

export function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

export function showCaptions(cues) {
  const el = $("caption");
  const text = cues.map((c) => c.text).join("\n");
  if (el.textContent !== text) el.textContent = text;
  el.hidden = text === "";
}

export function showFrameInfo({ streamS, source, mapped, presented, lostBatches }) {
  $("stream-time").textContent = streamS === null ? "–" : streamS.toFixed(3);
  $("source").textContent = source ?? "–";
  $("mapped").textContent = presented ? `${((100 * mapped) / presented).toFixed(1)} %` : "–";
  $("lost").textContent = String(lostBatches);
}
