// Clock join (proto/clock.md): the browser learns house time with four-timestamp exchanges.
// Pure arithmetic (ClockJoin, sampleOf) plus a WebSocket transport (joinClock); no DOM here.
//
// All times are BigInt nanoseconds: an epoch-ns value (~1.8e18) does not fit a JS number
// exactly. Frames are msgpack (web/js/msgpack.js decodes 64-bit integers as BigInt), so nothing
// is rounded on the way; the server answers in the kind it received.

import { decode, encode } from "./msgpack.js";

export const DEFAULT_WINDOW = 16;

export class ClockSyncError extends Error {}

const big = (v) => (typeof v === "bigint" ? v : BigInt(v));

// floor(a / 2) for BigInt (BigInt division truncates toward zero; the spec floors, like Python).
function floorHalf(v) {
  const q = v / 2n;
  return v < 0n && q * 2n !== v ? q - 1n : q;
}

// The browser's clock in ns: performance.timeOrigin + performance.now(), monotonic in a page.
// timeOrigin in whole microseconds stays exact as a number (~1.8e15 < 2^53).
export function browserNowNs(perf = globalThis.performance) {
  return BigInt(Math.round(perf.timeOrigin * 1000)) * 1000n + BigInt(Math.round(perf.now() * 1e6));
}

// offset = floor(((t2 - t1) + (t3 - t4)) / 2) (house - client); rtt = (t4 - t1) - (t3 - t2).
export function sampleOf(t1, t2, t3, t4) {
  [t1, t2, t3, t4] = [t1, t2, t3, t4].map(big);
  return { t1, t2, t3, t4, offsetNs: floorHalf(t2 - t1 + (t3 - t4)), rttNs: t4 - t1 - (t3 - t2) };
}

export function request(t1) {
  return { type: "clock_req", t1: big(t1) };
}

// Validates a decoded clock_resp map; returns BigInt fields.
export function parseResponse(msg) {
  if (msg === null || typeof msg !== "object" || msg.type !== "clock_resp") {
    throw new ClockSyncError(`expected clock_resp, got ${JSON.stringify(msg?.type)}`);
  }
  const out = { type: "clock_resp" };
  for (const k of ["t1", "t2", "t3"]) {
    const v = msg[k];
    if (typeof v === "bigint") out[k] = v;
    else if (Number.isSafeInteger(v)) out[k] = BigInt(v);
    else throw new ClockSyncError(`clock_resp.${k} must be an integer`);
  }
  return out;
}

// Sliding window of exchanges; the least-RTT one (earliest on ties) gives the estimate.
export class ClockJoin {
  constructor(window = DEFAULT_WINDOW) {
    this.window = window;
    this.samples = [];
    this.rejected = 0;
  }

  response(resp, t4) {
    const s = sampleOf(resp.t1, resp.t2, resp.t3, t4);
    if (s.rttNs < 0n || s.t3 < s.t2 || s.t4 < s.t1) {
      this.rejected += 1; // impossible timestamps: a clock stepped or the reply is forged
      return null;
    }
    this.samples.push(s);
    if (this.samples.length > this.window) this.samples.shift();
    return s;
  }

  best() {
    let best = null;
    for (const s of this.samples) if (best === null || s.rttNs < best.rttNs) best = s;
    return best;
  }

  // { type: "clock_report", offset_ns, error_ns: ceil(rtt / 2), rtt_ns } or null.
  report() {
    const b = this.best();
    if (b === null) return null;
    return { type: "clock_report", offset_ns: b.offsetNs, error_ns: (b.rttNs + 1n) / 2n, rtt_ns: b.rttNs };
  }
}

// A clock join over a channel the caller holds (the viewer's `sync` DataChannel): requests go
// out through `send` in rounds of `rounds`, `spacingMs` apart, and the caller feeds each reply
// to `join.response`. A busy page or machine delays every exchange of a round (an error of
// 29 ms was seen with a core kept busy), so more rounds follow, up to `maxExchanges`, until
// the least-delay exchange bounds the error within `targetErrorNs`. Returns the report (null
// when nothing came back), which the caller sends so the service knows this client's offset.
export async function joinInRounds(send, join, { rounds = 8, spacingMs = 20, settleMs = 200,
  maxExchanges = 48, targetErrorNs = 5_000_000n, now = browserNowNs,
  sleep = (ms) => new Promise((done) => setTimeout(done, ms)) } = {}) {
  for (let sent = 0; sent < maxExchanges;) {
    for (let i = 0; i < rounds && sent < maxExchanges; i++, sent++) {
      send(request(now()));
      await sleep(spacingMs);
    }
    await sleep(settleMs); // the last replies
    const report = join.report();
    if (report !== null && report.error_ns <= targetErrorNs) return report;
  }
  return join.report();
}

// Runs `samples` exchanges over a WebSocket at `url`, sends the report, and returns
// { offsetNs, errorNs, rttNs, houseNowNs() }. Every wait is bounded by `timeoutMs`.
export async function joinClock(url, { samples = 16, intervalMs = 20, timeoutMs = 5000, now = browserNowNs,
  WebSocketImpl = globalThis.WebSocket } = {}) {
  const ws = new WebSocketImpl(url);
  ws.binaryType = "arraybuffer";
  const join = new ClockJoin(samples);
  const pending = [];
  const failures = [];
  ws.onmessage = (ev) => {
    const t4 = now(); // first thing: the receive stamp
    const waiter = pending.shift();
    if (!waiter) return;
    try {
      const bytes = ev.data instanceof ArrayBuffer ? new Uint8Array(ev.data) : null;
      if (bytes === null) throw new ClockSyncError("expected a binary frame");
      waiter.resolve({ resp: parseResponse(decode(bytes)), t4 });
    } catch (err) {
      waiter.reject(err);
    }
  };
  const closed = new Promise((_, reject) => {
    ws.onclose = (ev) => reject(new ClockSyncError(`clock socket closed (${ev.code})`));
    ws.onerror = () => reject(new ClockSyncError("clock socket error"));
  });
  closed.catch((err) => failures.push(err));
  const within = (p) => {
    let timer;
    const expiry = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new ClockSyncError("clock join timed out")), timeoutMs);
    });
    return Promise.race([p, closed, expiry]).finally(() => clearTimeout(timer));
  };
  try {
    await within(new Promise((resolve) => { ws.onopen = resolve; }));
    for (let i = 0; i < samples; i++) {
      const answer = new Promise((resolve, reject) => pending.push({ resolve, reject }));
      ws.send(encode(request(now())));
      const { resp, t4 } = await within(answer);
      join.response(resp, t4);
      if (intervalMs > 0) await new Promise((r) => setTimeout(r, intervalMs));
    }
    const report = join.report();
    if (report === null) throw new ClockSyncError("no usable exchange");
    ws.send(encode(report));
    const offsetNs = report.offset_ns;
    return {
      offsetNs,
      errorNs: report.error_ns,
      rttNs: report.rtt_ns,
      samples: join.samples.length,
      houseNowNs: () => now() + offsetNs,
    };
  } finally {
    ws.onclose = null;
    ws.close();
  }
}
