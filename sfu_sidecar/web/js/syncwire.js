// Codec for the `sync` DataChannel (spec: proto/sync.md), the browser twin of
// sfu_sidecar/sync/wire.py. Pure: bytes in, plain objects out, and back; tested with
// `node --test tests/web/js/` against the same proto/vectors as the Python codec.
//
// Objects use the spec's snake_case field names. 64-bit quantities (capture_ns and every
// integer field of a control map) are BigInt; everything else is a Number.

import { decode as mpDecode, encode as mpEncode, f64, MsgpackError } from "./msgpack.js";

export const VERSION = 1;
export const MessageKind = Object.freeze({ BATCH: 0x01, CONTROL: 0x02 });
export const RecordType = Object.freeze({ ANCHOR: 0x01, FRAME: 0x02, CONTROL: 0x03 });
export const SOURCES = Object.freeze(["abs_capture_time", "sender_report", "arrival"]);
export const GENERATIONS = 16;
export const MAX_MESSAGE = 65535;
const NS = 1_000_000_000n;

export class SyncWireError extends Error {
  // kind: truncated | bad_version | unknown_type | trailing_bytes | bad_field | bad_control | too_large
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.name = "SyncWireError";
    this.kind = kind;
  }
}

// Control schemas, field order = serialisation order after "type" (as in wire.py). A third
// element is the default of an optional field (added by a later version): left out when sent at
// its default, and absent from a decoded message that did not carry it.
export const CONTROL_SCHEMAS = Object.freeze({
  epoch: [["stream", "str"], ["epoch_ns", "int"]],
  cue: [["stream", "str"], ["lang", "str"], ["id", "str"], ["start", "float"], ["end", "float"],
    ["text", "str"], ["final", "bool"], ["settings", "str", ""]],
  cue_retract: [["stream", "str"], ["lang", "str"], ["id", "str"]],
  clock_req: [["t1", "int"]],
  clock_resp: [["t1", "int"], ["t2", "int"], ["t3", "int"]],
  clock_report: [["offset_ns", "int"], ["error_ns", "int"], ["rtt_ns", "int"]],
  telemetry: [["stream", "str"], ["t_ns", "int"], ["presented", "int"], ["mapped", "int"],
    ["lost_batches", "int"]],
  playout: [["stream", "str"], ["t_ns", "int"], ["frames", "int"], ["av_skew_ms", "float"],
    ["captions", "int"], ["caption_error_ms", "float"], ["resyncs", "int"]],
  publisher: [["stream", "str"], ["live", "bool"]],
});

const I64_MIN = -(1n << 63n);
const U64_MAX = (1n << 64n) - 1n;

function checkField(kind, v, name) {
  const bad = (what) => new SyncWireError("bad_control", `${name} must be ${what}`);
  switch (kind) {
    case "str":
      if (typeof v !== "string") throw bad("a string");
      return v;
    case "bool":
      if (typeof v !== "boolean") throw bad("a boolean");
      return v;
    case "float":
      if (typeof v === "bigint") return Number(v);
      if (typeof v !== "number" || !Number.isFinite(v)) throw bad("a finite number");
      return v;
    case "int": {
      if (typeof v === "number" && !Number.isInteger(v)) throw bad("an integer");
      if (typeof v !== "number" && typeof v !== "bigint") throw bad("an integer");
      const big = BigInt(v);
      if (big < I64_MIN || big > U64_MAX) throw bad("in 64-bit range");
      return big;
    }
    default:
      throw new Error(`schema kind ${kind}`);
  }
}

// A decoded msgpack value -> a control message object (unknown keys dropped; unknown types
// kept as sent so a newer peer's additions never cost the records travelling with them).
export function controlFromMap(obj) {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj) || obj instanceof Uint8Array) {
    throw new SyncWireError("bad_control", "control payload is not a map");
  }
  if (typeof obj.type !== "string") throw new SyncWireError("bad_control", "control map without a string 'type'");
  const schema = CONTROL_SCHEMAS[obj.type];
  if (!Object.hasOwn(CONTROL_SCHEMAS, obj.type)) return { ...obj };
  const out = { type: obj.type };
  for (const [name, kind, ...optional] of schema) {
    if (!Object.hasOwn(obj, name)) {
      if (optional.length > 0) continue;
      throw new SyncWireError("bad_control", `${obj.type} without '${name}'`);
    }
    out[name] = checkField(kind, obj[name], name);
  }
  return out;
}

export function packControl(msg) {
  if (!Object.hasOwn(CONTROL_SCHEMAS, msg.type)) return mpEncode(msg);
  const ordered = new Map([["type", msg.type]]);
  for (const [name, kind, ...optional] of CONTROL_SCHEMAS[msg.type]) {
    const v = msg[name];
    if (optional.length > 0 && (v === undefined || v === optional[0])) continue;
    if (kind === "float") ordered.set(name, f64(Number(v)));
    else if (kind === "int") ordered.set(name, BigInt(v));
    else ordered.set(name, v);
  }
  return mpEncode(ordered);
}

export function unpackControl(bytes) {
  let obj;
  try {
    obj = mpDecode(bytes);
  } catch (e) {
    if (!(e instanceof MsgpackError)) throw e;
    const kind = { truncated: "truncated", trailing: "trailing_bytes" }[e.kind] ?? "bad_control";
    throw new SyncWireError(kind, e.message);
  }
  return controlFromMap(obj);
}

// --- anchors and frames -------------------------------------------------------------------

export function signed32(v) {
  v = Number(BigInt.asUintN(32, BigInt(v)));
  return v >= 0x80000000 ? v - 0x100000000 : v;
}

// Floor division for BigInt (BigInt `/` truncates toward zero; Python's // floors).
function floorDiv(a, b) {
  const q = a / b;
  return (a % b !== 0n) && ((a < 0n) !== (b < 0n)) ? q - 1n : q;
}

// House ns of the RTP timestamp anchor.rtp_ts + rtpDelta (rtpDelta signed), rounding half up
// exactly as wire.py does, so both sides agree to the nanosecond.
export function predict(anchor, rtpDelta) {
  const num = BigInt(rtpDelta) * NS * (NS + BigInt(anchor.drift_ppb));
  const den = BigInt(anchor.clock_rate) * NS;
  return anchor.capture_ns + floorDiv(2n * num + den, 2n * den);
}

export function anchorCaptureOf(anchor, rtpTs) {
  return predict(anchor, signed32(rtpTs - anchor.rtp_ts));
}

export function frameRtpTs(frame, anchor) {
  return (anchor.rtp_ts + frame.rtp_delta) >>> 0;
}

export function frameCaptureNs(frame, anchor) {
  return predict(anchor, frame.rtp_delta) + BigInt(frame.residual_ns);
}

function need(dv, offset, size, what) {
  if (dv.byteLength - offset < size) {
    throw new SyncWireError("truncated", `${what} needs ${size} bytes at ${offset}, ${dv.byteLength - offset} left`);
  }
}

function sourceName(flags) {
  const s = SOURCES[flags & 0x03];
  if (s === undefined) throw new SyncWireError("bad_field", `reserved source code ${flags & 3}`);
  return s;
}

function sourceCode(name) {
  const i = SOURCES.indexOf(name);
  if (i < 0) throw new SyncWireError("bad_field", `unknown source ${name}`);
  return i;
}

const ANCHOR_SIZE = 25;
const FRAME_SIZE = 11;
const utf8 = new TextDecoder("utf-8", { fatal: true });
const utf8enc = new TextEncoder();

function parseAnchor(bytes, dv, off) {
  need(dv, off, ANCHOR_SIZE, "anchor");
  const generation = dv.getUint8(off + 2);
  const flags = dv.getUint8(off + 3);
  const clockRate = dv.getUint32(off + 4);
  const midLen = dv.getUint8(off + 24);
  need(dv, off + ANCHOR_SIZE, midLen, "anchor mid");
  if (generation >= GENERATIONS) throw new SyncWireError("bad_field", `generation ${generation} not 0-15`);
  if (clockRate === 0) throw new SyncWireError("bad_field", "clock rate 0");
  const drift = dv.getInt32(off + 20);
  if (drift < -100_000_000 || drift > 100_000_000) throw new SyncWireError("bad_field", `drift ${drift} ppb`);
  let mid;
  try {
    mid = utf8.decode(bytes.subarray(off + ANCHOR_SIZE, off + ANCHOR_SIZE + midLen));
  } catch {
    throw new SyncWireError("bad_field", "mid is not UTF-8");
  }
  const rec = {
    type: "anchor",
    track: dv.getUint8(off + 1),
    generation,
    source: sourceName(flags),
    clock_rate: clockRate,
    rtp_ts: dv.getUint32(off + 8),
    capture_ns: dv.getBigUint64(off + 12),
    drift_ppb: drift,
    mid,
    audio: Boolean(flags & 0x08),
    reset: Boolean(flags & 0x04),
    estimated: Boolean(flags & 0x10),
  };
  return [rec, off + ANCHOR_SIZE + midLen];
}

function parseFrame(bytes, dv, off) {
  need(dv, off, FRAME_SIZE, "frame");
  const flags = dv.getUint8(off + 2);
  const rec = {
    type: "frame",
    track: dv.getUint8(off + 1),
    generation: flags >> 4,
    source: sourceName(flags),
    rtp_delta: dv.getInt32(off + 3),
    residual_ns: dv.getInt32(off + 7),
    keyframe: Boolean(flags & 0x04),
    audio: Boolean(flags & 0x08),
  };
  return [rec, off + FRAME_SIZE];
}

function parseControlRecord(bytes, dv, off) {
  need(dv, off, 3, "control record");
  const len = dv.getUint16(off + 1);
  need(dv, off + 3, len, "control payload");
  return [{ type: "control", message: unpackControl(bytes.subarray(off + 3, off + 3 + len)) }, off + 3 + len];
}

const RECORD_PARSERS = { [RecordType.ANCHOR]: parseAnchor, [RecordType.FRAME]: parseFrame, [RecordType.CONTROL]: parseControlRecord };

function toBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new TypeError("expected bytes");
}

// One DataChannel message -> {kind: "batch", seq, records} | {kind: "control", message}.
// Throws SyncWireError on anything malformed, never another error for bad bytes.
export function parseMessage(data) {
  const bytes = toBytes(data);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length > MAX_MESSAGE) throw new SyncWireError("too_large", `${bytes.length} bytes`);
  need(dv, 0, 2, "envelope");
  const version = bytes[0];
  if (version !== VERSION) throw new SyncWireError("bad_version", `version ${version}, expected ${VERSION}`);
  const kind = bytes[1];
  if (kind === MessageKind.CONTROL) return { kind: "control", message: unpackControl(bytes.subarray(2)) };
  if (kind !== MessageKind.BATCH) throw new SyncWireError("unknown_type", `message kind ${kind}`);
  need(dv, 2, 3, "batch header");
  const seq = dv.getUint16(2);
  const count = dv.getUint8(4);
  let off = 5;
  const records = [];
  for (let i = 0; i < count; i++) {
    need(dv, off, 1, "record type");
    const parser = RECORD_PARSERS[bytes[off]];
    if (parser === undefined) throw new SyncWireError("unknown_type", `record type ${bytes[off]} at ${off}`);
    let rec;
    [rec, off] = parser(bytes, dv, off);
    records.push(rec);
  }
  if (off !== bytes.length) throw new SyncWireError("trailing_bytes", `${bytes.length - off} bytes after records`);
  return { kind: "batch", seq, records };
}

function serializeRecord(rec) {
  if (rec.type === "anchor") {
    const mid = utf8enc.encode(rec.mid ?? "");
    const out = new Uint8Array(ANCHOR_SIZE + mid.length);
    const dv = new DataView(out.buffer);
    let flags = sourceCode(rec.source);
    if (rec.reset) flags |= 0x04;
    if (rec.audio) flags |= 0x08;
    if (rec.estimated) flags |= 0x10;
    dv.setUint8(0, RecordType.ANCHOR);
    dv.setUint8(1, rec.track);
    dv.setUint8(2, rec.generation);
    dv.setUint8(3, flags);
    dv.setUint32(4, rec.clock_rate);
    dv.setUint32(8, rec.rtp_ts);
    dv.setBigUint64(12, BigInt(rec.capture_ns));
    dv.setInt32(20, rec.drift_ppb ?? 0);
    dv.setUint8(24, mid.length);
    out.set(mid, ANCHOR_SIZE);
    return out;
  }
  if (rec.type === "frame") {
    const out = new Uint8Array(FRAME_SIZE);
    const dv = new DataView(out.buffer);
    let flags = sourceCode(rec.source) | (rec.generation << 4);
    if (rec.keyframe) flags |= 0x04;
    if (rec.audio) flags |= 0x08;
    dv.setUint8(0, RecordType.FRAME);
    dv.setUint8(1, rec.track);
    dv.setUint8(2, flags);
    dv.setInt32(3, rec.rtp_delta);
    dv.setInt32(7, rec.residual_ns);
    return out;
  }
  if (rec.type === "control") {
    const payload = packControl(rec.message);
    const out = new Uint8Array(3 + payload.length);
    out[0] = RecordType.CONTROL;
    new DataView(out.buffer).setUint16(1, payload.length);
    out.set(payload, 3);
    return out;
  }
  throw new SyncWireError("unknown_type", `record type ${rec.type}`);
}

export function serializeMessage(msg) {
  if (msg.kind === "control") {
    const payload = packControl(msg.message);
    const out = new Uint8Array(2 + payload.length);
    out[0] = VERSION;
    out[1] = MessageKind.CONTROL;
    out.set(payload, 2);
    return out;
  }
  const parts = msg.records.map(serializeRecord);
  const out = new Uint8Array(5 + parts.reduce((n, p) => n + p.length, 0));
  out[0] = VERSION;
  out[1] = MessageKind.BATCH;
  new DataView(out.buffer).setUint16(2, msg.seq);
  out[4] = msg.records.length;
  let off = 5;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

// Viewer-side state: anchors per (track, generation), and the capture time of any RTP
// timestamp a track presents. A frame record wins for its exact timestamp; otherwise the
// newest anchor of the track whose rtp_ts is at or before the timestamp interpolates.
export class SyncState {
  constructor({ maxFramesPerTrack = 512 } = {}) {
    this.anchors = new Map(); // track -> Map(generation -> anchor)
    this.current = new Map(); // track -> newest anchor
    this.frames = new Map(); // track -> Map(rtp_ts -> capture_ns)
    this.maxFrames = maxFramesPerTrack;
    this.lastSeq = null;
    this.lostBatches = 0;
    this.unresolved = 0;
    this.resets = 0; // timelines restarted by a reset anchor after the first
  }

  ingest(msg) {
    if (msg.kind !== "batch") return [msg.message];
    if (this.lastSeq !== null) {
      const gap = (msg.seq - this.lastSeq - 1) & 0xffff;
      if (gap > 0 && gap < 0x8000) this.lostBatches += gap;
    }
    if (this.lastSeq === null || ((msg.seq - this.lastSeq) & 0xffff) < 0x8000) this.lastSeq = msg.seq;
    const controls = [];
    for (const rec of msg.records) {
      if (rec.type === "anchor") {
        // A reset anchor starts a new timeline once; its periodic repeats change nothing.
        const held = this.anchors.get(rec.track)?.get(rec.generation);
        const repeat = held !== undefined && held.rtp_ts === rec.rtp_ts && held.capture_ns === rec.capture_ns;
        if ((rec.reset && !repeat) || !this.anchors.has(rec.track)) {
          if (this.anchors.has(rec.track)) this.resets++;
          this.anchors.set(rec.track, new Map());
          this.frames.set(rec.track, new Map());
        }
        this.anchors.get(rec.track).set(rec.generation, rec);
        this.current.set(rec.track, rec);
      } else if (rec.type === "frame") {
        const anchor = this.anchors.get(rec.track)?.get(rec.generation);
        if (anchor === undefined) {
          this.unresolved++; // its anchor was lost; the next repeat brings it back
          continue;
        }
        const frames = this.frames.get(rec.track);
        frames.set(frameRtpTs(rec, anchor), frameCaptureNs(rec, anchor));
        if (frames.size > this.maxFrames) frames.delete(frames.keys().next().value);
      } else controls.push(rec.message);
    }
    return controls;
  }

  // A new connection: its records start over (track indexes and batch sequence are per
  // connection), so nothing of the old one may map the new one's frames. Counters go on.
  restart() {
    this.anchors.clear();
    this.current.clear();
    this.frames.clear();
    this.lastSeq = null;
  }

  captureOf(track, rtpTs) {
    const exact = this.frames.get(track)?.get(rtpTs >>> 0);
    if (exact !== undefined) return exact;
    const anchor = this.current.get(track);
    return anchor === undefined ? null : anchorCaptureOf(anchor, rtpTs);
  }
}
