// WHEP viewer transport (draft-ietf-wish-whep): one recvonly audio + video session and the
// `sync` DataChannel. No DOM here; the page wires tracks and messages to the UI.

import {
  bearer, iceServersFor, negotiateAbsCaptureTime, postOffer, SessionResource,
} from "./webrtchttp.js";

export {
  ABS_CAPTURE_TIME, gatheringComplete, negotiateAbsCaptureTime, parseIceServerLinks,
} from "./webrtchttp.js";

// A viewer's session: its resource (asked whether it lives, ended with a DELETE) and its peer.
export class WhepSession extends SessionResource {}

// Connects to `endpoint` (e.g. /whep/demo). `onTrack(event)` and `onSyncChannel(channel)` are
// called as they arrive. The viewer offers the DataChannel (an answer cannot add one).
export async function connectWhep(endpoint, { token, onTrack, onSyncChannel, iceTimeoutMs = 2000 } = {}) {
  const headers = bearer(token);
  const iceServers = await iceServersFor(endpoint, headers);
  const pc = new RTCPeerConnection({ iceServers, bundlePolicy: "max-bundle" });
  for (const kind of ["audio", "video"]) {
    negotiateAbsCaptureTime(pc.addTransceiver(kind, { direction: "recvonly" }));
  }
  if (onTrack) pc.addEventListener("track", onTrack);
  const sync = pc.createDataChannel("sync", { ordered: false, maxRetransmits: 0 });
  sync.binaryType = "arraybuffer";
  if (onSyncChannel) onSyncChannel(sync);
  const { status, body, location } = await postOffer(endpoint, pc, headers, { iceTimeoutMs });
  if (status !== 201) {
    pc.close();
    let reason = body;
    try {
      reason = JSON.parse(body).error ?? body;
    } catch (_) {
      // not JSON: keep the text
    }
    throw Object.assign(new Error(`WHEP ${status}: ${reason}`), { status });
  }
  await pc.setRemoteDescription({ type: "answer", sdp: body });
  return new WhepSession(pc, location, token);
}
