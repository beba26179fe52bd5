// What WHIP and WHEP sessions share, against a fake peer connection and a fake server: the ICE
// servers an endpoint offers, the offer POSTed, and the session resource asked and ended.
import assert from "node:assert/strict";
import { test } from "node:test";

import { WhepSession } from "../../../sfu_sidecar/web/js/whep.js";
import { iceServersFor, postOffer, SessionResource } from "../../../sfu_sidecar/web/js/webrtchttp.js";
import { WhipSession } from "../../../sfu_sidecar/web/js/whip.js";

const OFFER = "v=0\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789012345678901\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n";

class FakePeer {
  constructor(log) {
    this.log = log;
    this.iceGatheringState = "complete";
    this.localDescription = null;
  }

  async createOffer() {
    return { type: "offer", sdp: OFFER };
  }

  async setLocalDescription(d) {
    this.localDescription = d;
  }

  getTransceivers() {
    return [{ mid: "0" }];
  }

  close() {
    this.log.push("pc.close");
  }
}

function server(answers) {
  const log = [];
  const fetchFn = async (url, init = {}) => {
    log.push(`${init.method ?? "GET"} ${url}`);
    const answer = answers[init.method ?? "GET"];
    if (answer instanceof Error) throw answer;
    return {
      status: answer?.status ?? 200, ok: (answer?.status ?? 200) < 300,
      headers: new Map(Object.entries(answer?.headers ?? {})), text: async () => answer?.body ?? "",
    };
  };
  return { log, fetchFn };
}

test("the endpoint's ICE servers, and none when it does not answer OPTIONS", async () => {
  const { fetchFn } = server({ OPTIONS: { headers: {
    Link: '<stun:203.0.113.7:3478>; rel="ice-server", <turn:203.0.113.7:3478?transport=udp>; '
      + 'rel="ice-server"; username="u"; credential="p"; credential-type="password"',
  } } });
  assert.deepEqual(await iceServersFor("/whep/s", {}, fetchFn), [
    { urls: "stun:203.0.113.7:3478" },
    { urls: "turn:203.0.113.7:3478?transport=udp", username: "u", credential: "p" },
  ]);
  const down = server({ OPTIONS: new TypeError("failed to fetch") });
  assert.deepEqual(await iceServersFor("/whep/s", {}, down.fetchFn), []);
});

test("the offer is POSTed whole and the Location made absolute", async () => {
  const { log, fetchFn } = server({ POST: { status: 201, body: "v=0 answer", headers: { Location: "/whep/s/1f" } } });
  const pc = new FakePeer([]);
  const answer = await postOffer("http://relay:8080/whep/s", pc, {}, { fetchFn });
  assert.deepEqual(answer, { status: 201, body: "v=0 answer", location: "http://relay:8080/whep/s/1f" });
  assert.deepEqual(log, ["POST http://relay:8080/whep/s"]);
});

test("WHIP and WHEP sessions end the same way: the DELETE first, then the peer connection", async () => {
  for (const Session of [WhipSession, WhepSession]) {
    const { log, fetchFn } = server({ DELETE: { status: 200 } });
    const pc = new FakePeer(log);
    const session = new Session(pc, "http://relay/whip/s/1f", "tok", { fetchFn });
    assert.equal(await session.close(), 200);
    assert.deepEqual(log, ["DELETE http://relay/whip/s/1f", "pc.close"], Session.name);
  }
});

test("a session the server cannot be reached for still closes its peer connection", async () => {
  const { log, fetchFn } = server({ DELETE: new TypeError("network down") });
  const pc = new FakePeer(log);
  assert.equal(await new SessionResource(pc, "http://relay/whep/s/1f", null, { fetchFn }).close(), null);
  assert.deepEqual(log, ["DELETE http://relay/whep/s/1f", "pc.close"]);
  const none = [];
  assert.equal(await new SessionResource(new FakePeer(none), null, null, { fetchFn }).close(), null);
  assert.deepEqual(none, ["pc.close"]);
});

test("whether the server still holds the session: alive, gone, or cannot tell", async () => {
  const ask = async (answer) => {
    const { fetchFn } = server({ PATCH: answer });
    const pc = new FakePeer([]);
    pc.localDescription = { sdp: OFFER };
    return new SessionResource(pc, "http://relay/whep/s/1f", null, { fetchFn }).exists();
  };
  assert.equal(await ask({ status: 204 }), true);
  assert.equal(await ask({ status: 404 }), false);
  assert.equal(await ask({ status: 503 }), null);
  assert.equal(await ask(new TypeError("offline")), null);
});
