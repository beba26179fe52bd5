// WHEP viewer transport (draft-ietf-wish-whep): one recvonly audio + video session and the
// `sync` DataChannel. No DOM here; the page wires tracks and messages to the UI.

export async function gatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return;
  await new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs); // send what we have rather than wait forever
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

// Parses `Link: <stun:...>; rel="ice-server"; username="u"; credential="c"` headers.
export function parseIceServerLinks(header) {
  if (!header) return [];
  const servers = [];
  for (const part of header.split(/,(?=\s*<)/)) {
    const url = /<([^>]+)>/.exec(part)?.[1];
    if (!url || !/rel="?ice-server"?/.test(part)) continue;
    const server = { urls: url };
    const user = /username="([^"]*)"/.exec(part)?.[1];
    const cred = /credential="([^"]*)"/.exec(part)?.[1];
    if (user !== undefined) server.username = user;
    if (cred !== undefined) server.credential = cred;
    servers.push(server);
  }
  return servers;
}

export const ABS_CAPTURE_TIME = "http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time";

// Chromium lists abs-capture-time as "stopped" by default; asking for it makes the relay write
// house capture times into every packet, which getSynchronizationSources() then reports.
// A publisher asks with direction "sendonly": Chromium then stamps what it sends.
export function negotiateAbsCaptureTime(transceiver, direction = "recvonly") {
  if (typeof transceiver.getHeaderExtensionsToNegotiate !== "function") return false;
  const exts = transceiver.getHeaderExtensionsToNegotiate();
  if (!exts.some((e) => e.uri === ABS_CAPTURE_TIME)) return false;
  transceiver.setHeaderExtensionsToNegotiate(
    exts.map((e) => (e.uri === ABS_CAPTURE_TIME ? { uri: e.uri, direction } : e)),
  );
  return true;
}

export class WhepSession {
  constructor(pc, resourceUrl, token) {
    this.pc = pc;
    this.resourceUrl = resourceUrl;
    this.token = token;
  }

  // Whether the server still holds this session: a trickle PATCH carrying only
  // end-of-candidates (RFC 8840), which changes nothing, is answered 2xx while the session
  // lives and 404 once the server lost it (restarted, or its worker died). null when that
  // cannot be told (no resource URL, no answer, any other status).
  async exists() {
    if (!this.resourceUrl) return null;
    const sdp = this.pc.localDescription?.sdp ?? "";
    const ufrag = /^a=ice-ufrag:(\S+)/m.exec(sdp)?.[1];
    const pwd = /^a=ice-pwd:(\S+)/m.exec(sdp)?.[1];
    const mid = this.pc.getTransceivers()[0]?.mid ?? "0";
    if (!ufrag || !pwd) return null;
    const headers = { "Content-Type": "application/trickle-ice-sdpfrag" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    try {
      const resp = await fetch(this.resourceUrl, {
        method: "PATCH",
        headers,
        body: `a=ice-ufrag:${ufrag}\r\na=ice-pwd:${pwd}\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n` +
          `a=mid:${mid}\r\na=end-of-candidates\r\n`,
      });
      if (resp.status === 404) return false;
      return resp.ok ? true : null;
    } catch (_) {
      return null; // no answer: the network, not necessarily the session
    }
  }

  async close() {
    this.pc.close();
    if (!this.resourceUrl) return;
    const headers = this.token ? { Authorization: `Bearer ${this.token}` } : {};
    try {
      await fetch(this.resourceUrl, { method: "DELETE", headers });
    } catch (_) {
      // the server may be gone already; the peer connection is closed either way
    }
  }
}

// Connects to `endpoint` (e.g. /whep/demo). `onTrack(event)` and `onSyncChannel(channel)` are
// called as they arrive. The viewer offers the DataChannel (an answer cannot add one).
export async function connectWhep(endpoint, { token, onTrack, onSyncChannel, iceTimeoutMs = 2000 } = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  let iceServers = [];
  try {
    const probe = await fetch(endpoint, { method: "OPTIONS", headers });
    iceServers = parseIceServerLinks(probe.headers.get("Link"));
  } catch (_) {
    // OPTIONS is optional (RFC 9725 §4.4); go without STUN/TURN
  }
  const pc = new RTCPeerConnection({ iceServers, bundlePolicy: "max-bundle" });
  for (const kind of ["audio", "video"]) {
    negotiateAbsCaptureTime(pc.addTransceiver(kind, { direction: "recvonly" }));
  }
  if (onTrack) pc.addEventListener("track", onTrack);
  const sync = pc.createDataChannel("sync", { ordered: false, maxRetransmits: 0 });
  sync.binaryType = "arraybuffer";
  if (onSyncChannel) onSyncChannel(sync);
  await pc.setLocalDescription(await pc.createOffer());
  await gatheringComplete(pc, iceTimeoutMs);
  const resp = await fetch(endpoint, {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/sdp" },
    body: pc.localDescription.sdp,
  });
  const body = await resp.text();
  if (resp.status !== 201) {
    pc.close();
    let reason = body;
    try {
      reason = JSON.parse(body).error ?? body;
    } catch (_) {
      // not JSON: keep the text
    }
    throw Object.assign(new Error(`WHEP ${resp.status}: ${reason}`), { status: resp.status });
  }
  const location = resp.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: body });
  const base = new URL(endpoint, globalThis.location?.href ?? "http://localhost/");
  return new WhepSession(pc, location ? new URL(location, base).href : null, token);
}
