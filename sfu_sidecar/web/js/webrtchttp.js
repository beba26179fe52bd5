// What WHIP (RFC 9725) and WHEP share: the ICE servers an endpoint hands out (Link headers of
// its OPTIONS answer), the offer POSTed once gathering is done, abs-capture-time asked for,
// and the session resource the server made: asked whether it still lives, and ended with a
// DELETE before the peer connection closes (so the server ends the session for that reason,
// not because its transport went away). No DOM here.

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


// The STUN/TURN servers `endpoint` offers (an OPTIONS answer's Link headers); none when it
// does not answer OPTIONS (RFC 9725 §4.4 makes it optional).
export async function iceServersFor(endpoint, headers, fetchFn = globalThis.fetch) {
  try {
    const probe = await fetchFn(endpoint, { method: "OPTIONS", headers });
    return parseIceServerLinks(probe.headers.get("Link"));
  } catch (_) {
    return [];
  }
}

// POSTs the peer connection's offer (every candidate in it: no trickle needed on loopback or
// LAN) and returns {status, body, location} with the Location made absolute.
export async function postOffer(endpoint, pc, headers, { iceTimeoutMs = 2000, fetchFn = globalThis.fetch } = {}) {
  await pc.setLocalDescription(await pc.createOffer());
  await gatheringComplete(pc, iceTimeoutMs);
  const resp = await fetchFn(endpoint, {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/sdp" },
    body: pc.localDescription.sdp,
  });
  const location = resp.headers.get("Location");
  const base = new URL(endpoint, globalThis.location?.href ?? "http://localhost/");
  return { status: resp.status, body: await resp.text(), location: location ? new URL(location, base).href : null };
}

export function bearer(token) {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export class SessionResource {
  constructor(pc, resourceUrl, token, { fetchFn = globalThis.fetch } = {}) {
    this.pc = pc;
    this.resourceUrl = resourceUrl;
    this.token = token;
    this.fetch = (...args) => fetchFn(...args); // called bare: a browser's fetch needs no `this`
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
    const headers = { ...bearer(this.token), "Content-Type": "application/trickle-ice-sdpfrag" };
    try {
      const resp = await this.fetch(this.resourceUrl, {
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

  // RFC 9725 §4.2: the client ends the session with a DELETE of its resource, sent before the
  // peer connection closes. Returns the DELETE's status, or null when there is no resource or
  // it could not be sent (or took over `timeoutMs`: a dropped network may answer nothing).
  async close({ timeoutMs = 3000 } = {}) {
    let status = null;
    if (this.resourceUrl) {
      const abort = typeof AbortController === "function" ? new AbortController() : null;
      const timer = abort && setTimeout(() => abort.abort(), timeoutMs);
      try {
        const resp = await this.fetch(this.resourceUrl, {
          method: "DELETE", headers: bearer(this.token), signal: abort?.signal,
        });
        status = resp.status;
      } catch (_) {
        // the server may be gone already; the peer connection is closed either way
      } finally {
        clearTimeout(timer);
      }
    }
    this.pc.close();
    return status;
  }
}
