// WHIP publisher transport (RFC 9725): one sendonly transceiver per local track, the chosen video
// codec applied before the offer, abs-capture-time asked for, the resource DELETEd on stop.
// No DOM here.

import { preferredCodecs, serverReason } from "./publishcore.js";
import {
  ABS_CAPTURE_TIME, gatheringComplete, negotiateAbsCaptureTime, parseIceServerLinks,
} from "./whep.js";

export class WhipError extends Error {
  constructor(status, reason) {
    super(`WHIP ${reason}`);
    this.status = status;
    this.reason = reason;
  }
}

export class WhipSession {
  constructor(pc, resourceUrl, token) {
    this.pc = pc;
    this.resourceUrl = resourceUrl;
    this.token = token;
  }

  // Whether every sent track carries abs-capture-time, as the answer negotiated it.
  get stampsCaptureTime() {
    const transceivers = this.pc.getTransceivers();
    return transceivers.length > 0 && transceivers.every((t) => typeof t.getNegotiatedHeaderExtensions === "function"
      && t.getNegotiatedHeaderExtensions().some((e) => e.uri === ABS_CAPTURE_TIME && e.direction !== "stopped"));
  }

  // RFC 9725 §4.2: the client ends the session with a DELETE of its resource. Sent before the
  // peer connection closes, so the relay ends the publisher for that reason and not because
  // its transport went away. Returns the DELETE's status, or null when it could not be sent.
  async close() {
    let status = null;
    try {
      const headers = this.token ? { Authorization: `Bearer ${this.token}` } : {};
      status = (await fetch(this.resourceUrl, { method: "DELETE", headers })).status;
    } catch (_) {
      // the server may be gone already; the peer connection is closed either way
    }
    this.pc.close();
    return status;
  }
}

function videoCapabilities() {
  // Chromium checks setCodecPreferences against the sender's capabilities for a sendonly
  // transceiver (older releases against the receiver's): ask the sender first.
  return (globalThis.RTCRtpSender?.getCapabilities?.("video")
    ?? globalThis.RTCRtpReceiver?.getCapabilities?.("video"))?.codecs ?? [];
}

// Publishes `media` (a MediaStream) to `endpoint` (e.g. /whip/live). `codec`: "vp8", "vp9" or "h264".
// Throws WhipError with the server's status and reason when it answers anything but 201.
export async function publishWhip(endpoint, media, { token, codec = "vp8", iceTimeoutMs = 2000 } = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  let iceServers = [];
  try {
    const probe = await fetch(endpoint, { method: "OPTIONS", headers });
    iceServers = parseIceServerLinks(probe.headers.get("Link"));
  } catch (_) {
    // OPTIONS is optional (RFC 9725 §4.4); go without STUN/TURN
  }
  const pc = new RTCPeerConnection({ iceServers, bundlePolicy: "max-bundle" });
  try {
    for (const track of media.getTracks()) {
      const transceiver = pc.addTransceiver(track, { direction: "sendonly", streams: [media] });
      if (track.kind === "video") transceiver.setCodecPreferences(preferredCodecs(videoCapabilities(), codec));
      // Chromium stamps each sent frame's capture time (on its own clock) when asked: the
      // relay then maps capture times from the stamps rather than from sender reports.
      negotiateAbsCaptureTime(transceiver, "sendonly");
    }
    await pc.setLocalDescription(await pc.createOffer());
    // Non-trickle: the offer carries every candidate, so no PATCH is needed on loopback or LAN.
    await gatheringComplete(pc, iceTimeoutMs);
    const resp = await fetch(endpoint, {
      method: "POST",
      headers: { ...headers, "Content-Type": "application/sdp" },
      body: pc.localDescription.sdp,
    });
    const body = await resp.text();
    if (resp.status !== 201) throw new WhipError(resp.status, serverReason(resp.status, body));
    const location = resp.headers.get("Location");
    if (!location) throw new WhipError(resp.status, "201 without a Location: the session cannot be ended");
    const base = new URL(endpoint, globalThis.location?.href ?? "http://localhost/");
    const session = new WhipSession(pc, new URL(location, base).href, token);
    try {
      await pc.setRemoteDescription({ type: "answer", sdp: body });
    } catch (err) {
      await session.close(); // the resource exists: end it rather than leave it to time out
      throw err;
    }
    return session;
  } catch (err) {
    pc.close();
    throw err;
  }
}
