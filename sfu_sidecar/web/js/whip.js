// WHIP publisher transport (RFC 9725): one sendonly transceiver per local track, the chosen video
// codec applied before the offer, abs-capture-time asked for, the resource DELETEd on stop; a
// session's tracks and video bitrate changed without renegotiation, and its link watched for
// a drop (publishcore.Republisher then publishes again). No DOM here.

import { linkHealth, preferredCodecs, serverReason, whipFailure, withMaxBitrate } from "./publishcore.js";
import {
  ABS_CAPTURE_TIME, bearer, iceServersFor, negotiateAbsCaptureTime, postOffer, SessionResource,
} from "./webrtchttp.js";

export class WhipError extends Error {
  constructor(status, reason) {
    super(`WHIP ${reason}`);
    this.status = status;
    this.reason = reason;
  }

  // What a broadcaster is told, and whether publishing again later can help (publishcore).
  get failure() {
    return whipFailure(this.status, this.reason);
  }
}

// {message, retry} of anything publishWhip threw: a refusal by its status; a network error
// (fetch's TypeError) retried; anything else (the browser refusing the answer, say) not.
export function whipErrorFailure(err) {
  if (err instanceof WhipError) return err.failure;
  if (err instanceof TypeError) return whipFailure(null, err.message);
  return { message: String(err?.message ?? err), retry: false };
}

export class WhipSession extends SessionResource {
  // Whether every sent track carries abs-capture-time, as the answer negotiated it.
  get stampsCaptureTime() {
    const transceivers = this.pc.getTransceivers();
    return transceivers.length > 0 && transceivers.every((t) => typeof t.getNegotiatedHeaderExtensions === "function"
      && t.getNegotiatedHeaderExtensions().some((e) => e.uri === ABS_CAPTURE_TIME && e.direction !== "stopped"));
  }

  sender(kind) {
    // By the transceiver's kind: a sender's track may be null (replaced by nothing).
    return this.pc.getTransceivers().find((t) => t.receiver.track?.kind === kind)?.sender ?? null;
  }

  // Sends `track` in place of the one of its kind (another camera or microphone): no
  // renegotiation, the relay sees the same stream go on.
  async replaceTrack(track) {
    const sender = this.sender(track.kind);
    if (sender === null) throw new Error(`this session sends no ${track.kind}`);
    await sender.replaceTrack(track);
  }

  // The video encoder's ceiling in bits per second (null: none), applied while live.
  async setMaxBitrate(bps) {
    const sender = this.sender("video");
    if (sender === null) return;
    await sender.setParameters(withMaxBitrate(sender.getParameters(), bps));
  }

  // Watches the link: onConnected() each time it is up, onDrop(reason) once, when it is lost
  // (failed, or the relay closed its DTLS), stays disconnected over `graceMs`, or does not
  // come up within `connectTimeoutMs`. Returns a function that stops watching.
  watch({ onConnected = () => {}, onDrop = () => {}, graceMs = 1500, connectTimeoutMs = 8000 } = {}) {
    const pc = this.pc;
    const dtls = pc.getSenders().map((s) => s.transport).find(Boolean) ?? null;
    let graceTimer = null;
    let connectTimer = setTimeout(() => drop(`not connected within ${connectTimeoutMs / 1000} s`), connectTimeoutMs);
    let done = false;
    let up = false;
    const drop = (why) => {
      if (done) return;
      stopWatching();
      onDrop(why);
    };
    const check = () => {
      const states = { connection: pc.connectionState, ice: pc.iceConnectionState, dtls: dtls?.state };
      const health = linkHealth(states);
      if (health === "up") {
        clearTimeout(graceTimer);
        graceTimer = null;
        if (connectTimer !== null) {
          clearTimeout(connectTimer);
          connectTimer = null;
        }
        if (!up) onConnected();
        up = true;
      } else if (health === "lost") {
        drop(dtls?.state === "closed" ? "the relay ended the session" : `the connection ${states.connection}`);
      } else if (health === "unsteady" && graceTimer === null) {
        up = false;
        graceTimer = setTimeout(() => drop(`disconnected for over ${graceMs / 1000} s`), graceMs);
      } else if (health !== "unsteady") {
        up = false;
        clearTimeout(graceTimer);
        graceTimer = null;
      }
    };
    const stopWatching = () => {
      done = true;
      clearTimeout(graceTimer);
      clearTimeout(connectTimer);
      pc.removeEventListener("connectionstatechange", check);
      pc.removeEventListener("iceconnectionstatechange", check);
      dtls?.removeEventListener("statechange", check);
    };
    pc.addEventListener("connectionstatechange", check);
    pc.addEventListener("iceconnectionstatechange", check);
    dtls?.addEventListener("statechange", check);
    check();
    return stopWatching;
  }
}

function videoCapabilities() {
  // Chromium checks setCodecPreferences against the sender's capabilities for a sendonly
  // transceiver (older releases against the receiver's): ask the sender first.
  return (globalThis.RTCRtpSender?.getCapabilities?.("video")
    ?? globalThis.RTCRtpReceiver?.getCapabilities?.("video"))?.codecs ?? [];
}

// Publishes `media` (a MediaStream) to `endpoint` (e.g. /whip/live). `codec`: "vp8", "vp9" or "h264";
// `maxBitrate`: the video encoder's ceiling in bits per second (none by default).
// Throws WhipError with the server's status and reason when it answers anything but 201.
export async function publishWhip(endpoint, media, {
  token, codec = "vp8", iceTimeoutMs = 2000, maxBitrate = null,
} = {}) {
  const headers = bearer(token);
  const iceServers = await iceServersFor(endpoint, headers);
  const pc = new RTCPeerConnection({ iceServers, bundlePolicy: "max-bundle" });
  try {
    for (const track of media.getTracks()) {
      const init = { direction: "sendonly", streams: [media] };
      if (track.kind === "video" && maxBitrate) init.sendEncodings = [{ maxBitrate: Math.round(maxBitrate) }];
      const transceiver = pc.addTransceiver(track, init);
      if (track.kind === "video") transceiver.setCodecPreferences(preferredCodecs(videoCapabilities(), codec));
      // Chromium stamps each sent frame's capture time (on its own clock) when asked: the
      // relay then maps capture times from the stamps rather than from sender reports.
      negotiateAbsCaptureTime(transceiver, "sendonly");
    }
    const { status, body, location } = await postOffer(endpoint, pc, headers, { iceTimeoutMs });
    if (status !== 201) throw new WhipError(status, serverReason(status, body));
    if (!location) throw new WhipError(status, "201 without a Location: the session cannot be ended");
    const session = new WhipSession(pc, location, token);
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
