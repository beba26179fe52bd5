// The viewer page: WHEP media + `sync` records -> capture time of the frame on screen -> captions.

import { CueBook } from "./captions.js";
import { parseMessage, SOURCES, SyncState } from "./syncwire.js";
import * as ui from "./ui.js";
import { connectWhep } from "./whep.js";

const params = new URLSearchParams(window.location.search);
const stream = params.get("stream") ?? "demo";
const token = params.get("token") ?? undefined;

const sync = new SyncState();
const book = new CueBook();
const video = document.getElementById("video");
const stats = { presented: 0, mapped: 0, badMessages: 0 };
// Exposed for the dashboard, debugging and end-to-end tests.
window.sfuViewer = { stream, sync, book, stats, frames: [], frameListeners: [] };

function trackIndexForMid(mid) {
  for (const [track, anchor] of sync.current) if (anchor.mid === mid) return track;
  return null;
}

function onSyncMessage(event) {
  let msg;
  try {
    msg = parseMessage(new Uint8Array(event.data));
  } catch (err) {
    stats.badMessages++; // count and carry on: one bad message must not stop the captions
    console.warn("sync message dropped:", err.message);
    return;
  }
  for (const control of sync.ingest(msg)) book.apply(control);
}

function onFrame(now, meta) {
  stats.presented++;
  const mid = videoTransceiverMid();
  const track = mid === null ? null : trackIndexForMid(mid);
  const captureNs = track === null || meta.rtpTimestamp === undefined
    ? null : sync.captureOf(track, meta.rtpTimestamp);
  if (captureNs !== null) stats.mapped++;
  const streamS = book.streamSeconds(captureNs);
  ui.showCaptions(book.activeAt(streamS));
  const anchor = track === null ? undefined : sync.current.get(track);
  ui.showFrameInfo({
    streamS, source: anchor ? (typeof anchor.source === "number" ? SOURCES[anchor.source] : anchor.source) : null, mapped: stats.mapped,
    presented: stats.presented, lostBatches: sync.lostBatches,
  });
  const record = { rtpTimestamp: meta.rtpTimestamp, captureNs, streamS, mediaTime: meta.mediaTime };
  for (const listener of window.sfuViewer.frameListeners) listener(record, meta);
  if (streamS !== null && stats.presented % 300 === 0) book.prune(streamS);
  video.requestVideoFrameCallback(onFrame);
}

let session = null;
function videoTransceiverMid() {
  const t = session?.pc.getTransceivers().find((x) => x.receiver.track.kind === "video");
  return t?.mid ?? null;
}

async function start() {
  ui.setStatus(`connecting to stream "${stream}"…`);
  const media = new MediaStream();
  video.srcObject = media;
  try {
    session = await connectWhep(`/whep/${encodeURIComponent(stream)}`, {
      token,
      onTrack: (event) => media.addTrack(event.track),
      onSyncChannel: (channel) => channel.addEventListener("message", onSyncMessage),
    });
  } catch (err) {
    ui.setStatus(String(err.message ?? err), true);
    return;
  }
  window.sfuViewer.session = session;
  session.pc.addEventListener("connectionstatechange", () => {
    ui.setStatus(`stream "${stream}": ${session.pc.connectionState}`,
      session.pc.connectionState === "failed");
  });
  video.requestVideoFrameCallback(onFrame);
  video.play().catch(() => ui.setStatus("click the video to start playback"));
}

video.addEventListener("click", () => video.play());
start();
