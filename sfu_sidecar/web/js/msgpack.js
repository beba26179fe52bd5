// Minimal msgpack (https://github.com/msgpack/msgpack/blob/master/spec.md) for the sync
// channel's control maps. No build step, no dependency.
//
// Encoding picks the smallest form the way msgpack-python does (unsigned forms for
// non-negative integers, str8 for short text, float64 for floats), so the JS and Python
// codecs produce the same bytes for the same map. JS numbers cannot say "float" for 3.0,
// so callers pass floats wrapped with `f64(x)`; BigInt values encode as integers.
// Decoding returns integers as Number when they are safe integers, BigInt otherwise.

export class MsgpackError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind; // "truncated" | "bad" | "trailing"
  }
}

export class F64 {
  constructor(value) {
    this.value = value;
  }
}
export const f64 = (value) => new F64(value);

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder("utf-8", { fatal: true });

class Writer {
  constructor() {
    this.bytes = [];
  }
  u8(v) {
    this.bytes.push(v & 0xff);
  }
  uint(v, n) {
    // v: BigInt, n bytes big-endian
    for (let i = n - 1; i >= 0; i--) this.bytes.push(Number((v >> BigInt(8 * i)) & 0xffn));
  }
  raw(arr) {
    for (const b of arr) this.bytes.push(b);
  }
  result() {
    return Uint8Array.from(this.bytes);
  }
}

function encodeInt(w, value) {
  const v = BigInt(value);
  if (v >= 0n) {
    if (v < 0x80n) w.u8(Number(v));
    else if (v <= 0xffn) { w.u8(0xcc); w.uint(v, 1); }
    else if (v <= 0xffffn) { w.u8(0xcd); w.uint(v, 2); }
    else if (v <= 0xffffffffn) { w.u8(0xce); w.uint(v, 4); }
    else if (v <= 0xffffffffffffffffn) { w.u8(0xcf); w.uint(v, 8); }
    else throw new RangeError("integer above 2**64 - 1");
  } else {
    const tc = (n) => (v + (1n << BigInt(8 * n))) ; // two's complement over n bytes
    if (v >= -32n) w.u8(Number(tc(1)));
    else if (v >= -0x80n) { w.u8(0xd0); w.uint(tc(1), 1); }
    else if (v >= -0x8000n) { w.u8(0xd1); w.uint(tc(2), 2); }
    else if (v >= -0x80000000n) { w.u8(0xd2); w.uint(tc(4), 4); }
    else if (v >= -(1n << 63n)) { w.u8(0xd3); w.uint(tc(8), 8); }
    else throw new RangeError("integer below -2**63");
  }
}

function encodeStr(w, s) {
  const b = textEncoder.encode(s);
  const n = b.length;
  if (n < 32) w.u8(0xa0 | n);
  else if (n <= 0xff) { w.u8(0xd9); w.u8(n); }
  else if (n <= 0xffff) { w.u8(0xda); w.uint(BigInt(n), 2); }
  else { w.u8(0xdb); w.uint(BigInt(n), 4); }
  w.raw(b);
}

function encodeValue(w, v) {
  if (v === null || v === undefined) w.u8(0xc0);
  else if (v === true) w.u8(0xc3);
  else if (v === false) w.u8(0xc2);
  else if (v instanceof F64) {
    const dv = new DataView(new ArrayBuffer(8));
    dv.setFloat64(0, v.value);
    w.u8(0xcb);
    w.raw(new Uint8Array(dv.buffer));
  } else if (typeof v === "bigint") encodeInt(w, v);
  else if (typeof v === "number") {
    if (Number.isInteger(v)) encodeInt(w, v);
    else encodeValue(w, f64(v));
  } else if (typeof v === "string") encodeStr(w, v);
  else if (v instanceof Uint8Array) {
    const n = v.length;
    if (n <= 0xff) { w.u8(0xc4); w.u8(n); }
    else if (n <= 0xffff) { w.u8(0xc5); w.uint(BigInt(n), 2); }
    else { w.u8(0xc6); w.uint(BigInt(n), 4); }
    w.raw(v);
  } else if (Array.isArray(v)) {
    const n = v.length;
    if (n < 16) w.u8(0x90 | n);
    else if (n <= 0xffff) { w.u8(0xdc); w.uint(BigInt(n), 2); }
    else { w.u8(0xdd); w.uint(BigInt(n), 4); }
    for (const item of v) encodeValue(w, item);
  } else if (typeof v === "object") {
    const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
    const n = entries.length;
    if (n < 16) w.u8(0x80 | n);
    else if (n <= 0xffff) { w.u8(0xde); w.uint(BigInt(n), 2); }
    else { w.u8(0xdf); w.uint(BigInt(n), 4); }
    for (const [k, item] of entries) {
      encodeValue(w, k);
      encodeValue(w, item);
    }
  } else throw new TypeError(`cannot encode ${typeof v}`);
}

export function encode(value) {
  const w = new Writer();
  encodeValue(w, value);
  return w.result();
}

const MAX_DEPTH = 32;

class Reader {
  constructor(bytes) {
    this.b = bytes;
    this.dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  need(n) {
    if (this.b.length - this.pos < n) throw new MsgpackError("truncated", "msgpack cut short");
  }
  u8() {
    this.need(1);
    return this.b[this.pos++];
  }
  uint(n) {
    this.need(n);
    let v = 0n;
    for (let i = 0; i < n; i++) v = (v << 8n) | BigInt(this.b[this.pos++]);
    return v;
  }
  int(n) {
    const u = this.uint(n);
    const bits = BigInt(8 * n);
    return u >= 1n << (bits - 1n) ? u - (1n << bits) : u;
  }
  bytes(n) {
    this.need(n);
    const out = this.b.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
}

const num = (big) => (big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big);

function decodeStr(r, n) {
  try {
    return textDecoder.decode(r.bytes(n));
  } catch (e) {
    if (e instanceof MsgpackError) throw e;
    throw new MsgpackError("bad", "string is not UTF-8");
  }
}

function decodeMap(r, n, depth) {
  const out = {};
  for (let i = 0; i < n; i++) {
    const k = decodeValue(r, depth + 1);
    if (typeof k !== "string") throw new MsgpackError("bad", "map key is not a string");
    const v = decodeValue(r, depth + 1);
    Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function decodeArray(r, n, depth) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(decodeValue(r, depth + 1));
  return out;
}

function decodeValue(r, depth) {
  if (depth > MAX_DEPTH) throw new MsgpackError("bad", "nested too deep");
  const t = r.u8();
  if (t < 0x80) return t;
  if (t >= 0xe0) return t - 0x100;
  if ((t & 0xf0) === 0x80) return decodeMap(r, t & 0x0f, depth);
  if ((t & 0xf0) === 0x90) return decodeArray(r, t & 0x0f, depth);
  if ((t & 0xe0) === 0xa0) return decodeStr(r, t & 0x1f);
  switch (t) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return r.bytes(Number(r.uint(1))).slice();
    case 0xc5: return r.bytes(Number(r.uint(2))).slice();
    case 0xc6: return r.bytes(Number(r.uint(4))).slice();
    case 0xca: { r.need(4); const v = r.dv.getFloat32(r.pos); r.pos += 4; return v; }
    case 0xcb: { r.need(8); const v = r.dv.getFloat64(r.pos); r.pos += 8; return v; }
    case 0xcc: return num(r.uint(1));
    case 0xcd: return num(r.uint(2));
    case 0xce: return num(r.uint(4));
    case 0xcf: return num(r.uint(8));
    case 0xd0: return num(r.int(1));
    case 0xd1: return num(r.int(2));
    case 0xd2: return num(r.int(4));
    case 0xd3: return num(r.int(8));
    case 0xd9: return decodeStr(r, Number(r.uint(1)));
    case 0xda: return decodeStr(r, Number(r.uint(2)));
    case 0xdb: return decodeStr(r, Number(r.uint(4)));
    case 0xdc: return decodeArray(r, Number(r.uint(2)), depth);
    case 0xdd: return decodeArray(r, Number(r.uint(4)), depth);
    case 0xde: return decodeMap(r, Number(r.uint(2)), depth);
    case 0xdf: return decodeMap(r, Number(r.uint(4)), depth);
    default:
      // ext types and 0xc1 (never used) have no meaning on the sync channel
      throw new MsgpackError("bad", `msgpack type 0x${t.toString(16)} not accepted`);
  }
}

// Decodes exactly one value spanning all of `bytes`.
export function decode(bytes) {
  const r = new Reader(bytes);
  const value = decodeValue(r, 0);
  if (r.pos !== bytes.length) throw new MsgpackError("trailing", "bytes after the msgpack value");
  return value;
}
