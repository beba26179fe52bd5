// Pure logic of the publisher page: the codec order handed to setCodecPreferences, caption
// ingest bodies in exact house ns, outgoing bitrate from getStats reports, server reasons.
// No DOM, no network, no clock read here: every time is an argument.

export const VIDEO_CODECS = { vp8: "video/VP8", vp9: "video/VP9", h264: "video/H264" };

// Longest cue the ingest accepts (sfu_sidecar/captions/model.py MAX_CUE_MS).
export const MAX_CUE_S = 3600;

// Cue ids the ingest accepts (model.py CUE_ID_RE); "auto-" is the server's own prefix.
const CUE_ID = /^[A-Za-z0-9._~:@+-]{1,128}$/;

export class InputError extends Error {}

function fmtpOf(codec) {
  const out = {};
  for (const part of (codec.sdpFmtpLine ?? "").split(";")) {
    const [key, value] = part.split("=").map((s) => s.trim());
    if (key) out[key.toLowerCase()] = value ?? "";
  }
  return out;
}

// The relay forwards H.264 only in packetization-mode 1 (relay/sdp.py), and its answerer
// (aiortc) speaks constrained baseline and baseline: those profiles first, so the answer picks
// one any viewer can decode.
function h264Rank(codec) {
  const profile = (fmtpOf(codec)["profile-level-id"] ?? "").toLowerCase().slice(0, 4);
  if (profile === "42e0") return 0;
  if (profile === "4200") return 1;
  return 2;
}

// `capabilities`: RTCRtpSender.getCapabilities("video").codecs. Returns the list for
// setCodecPreferences that offers `choice` ("vp8" | "vp9" | "h264") and nothing else but its
// retransmission (RTX): the offer then cannot end up with another codec.
export function preferredCodecs(capabilities, choice) {
  const mime = VIDEO_CODECS[choice];
  if (mime === undefined) {
    throw new InputError(`unknown codec ${JSON.stringify(choice)}; use vp8, vp9 or h264`);
  }
  let chosen = capabilities.filter((c) => c.mimeType.toLowerCase() === mime.toLowerCase());
  if (choice === "h264") {
    chosen = chosen.filter((c) => fmtpOf(c)["packetization-mode"] === "1");
    chosen = chosen.map((c, i) => [h264Rank(c), i, c]).sort((a, b) => a[0] - b[0] || a[1] - b[1])
      .map(([, , c]) => c);
  }
  // VP9 in profile 0 (8-bit 4:2:0) only, which the relay forwards (relay/sdp.py): every VP9
  // decoder has it, where profiles 1-3 are optional.
  if (choice === "vp9") chosen = chosen.filter((c) => (fmtpOf(c)["profile-id"] ?? "0") === "0");
  if (chosen.length === 0) {
    throw new InputError(`this browser cannot send ${mime.slice(6)}` +
      (choice === "h264" ? " in packetization-mode 1" : choice === "vp9" ? " in profile 0" : ""));
  }
  const rtx = capabilities.filter((c) => c.mimeType.toLowerCase() === "video/rtx");
  return [...chosen, ...rtx];
}

// Seconds typed in the duration field -> BigInt ns, whole milliseconds (the store keeps ms).
export function durationNs(text) {
  const s = Number(String(text).trim());
  if (String(text).trim() === "" || !Number.isFinite(s) || s <= 0 || s > MAX_CUE_S) {
    throw new InputError(`duration must be a number of seconds above 0 and at most ${MAX_CUE_S}`);
  }
  const ms = Math.round(s * 1000);
  if (ms < 1) throw new InputError("duration must be at least 1 ms");
  return BigInt(ms) * 1_000_000n;
}

// One cue from `startNs` (BigInt house ns) lasting `lengthNs`, as the JSON body of
// POST /api/streams/{stream}/captions. The times are written as integer literals from their
// BigInt digits: JSON.stringify cannot write a BigInt, and a Number would round an epoch-ns
// value by up to 128 ns.
export function cueBody({ startNs, lengthNs, text, lang = "en", id }) {
  if (typeof startNs !== "bigint" || typeof lengthNs !== "bigint") {
    throw new TypeError("startNs and lengthNs must be BigInt ns");
  }
  if (lengthNs <= 0n) throw new InputError("a cue must last longer than 0");
  const trimmed = String(text ?? "").trim();
  if (trimmed === "") throw new InputError("type a caption first");
  const cueId = id ?? `page-${startNs}`;
  if (!CUE_ID.test(cueId) || cueId.startsWith("auto-")) throw new InputError(`bad cue id ${cueId}`);
  const cue = `{"id":${JSON.stringify(cueId)},"start":${startNs},"end":${startNs + lengthNs},` +
    `"text":${JSON.stringify(trimmed)}}`;
  return `{"timebase":"house_ns","lang":${JSON.stringify(lang)},"cues":[${cue}]}`;
}

// The server's reason from an error response: its JSON {"error"} or the text as it came.
export function serverReason(status, bodyText) {
  let reason = String(bodyText ?? "").trim();
  try {
    const doc = JSON.parse(reason);
    if (doc && typeof doc.error === "string") reason = doc.error;
  } catch (_) {
    // not JSON: keep the text
  }
  return reason === "" ? `HTTP ${status}` : `${status}: ${reason}`;
}

// Outgoing bitrate per kind from successive getStats() reports (outbound-rtp bytesSent, and
// the report's timestamp in ms). A kind with several outbound streams (simulcast) is summed.
export class BitrateMeter {
  constructor() {
    this.last = new Map(); // kind -> {bytes, ms}
  }

  // `reports`: iterable of stats objects. Returns {kind: bits per second | null} for every
  // kind seen; null until a second report gives an interval.
  update(reports) {
    const totals = new Map();
    for (const r of reports) {
      if (r.type !== "outbound-rtp" || typeof r.bytesSent !== "number") continue;
      const kind = r.kind ?? r.mediaType;
      const t = totals.get(kind) ?? { bytes: 0, ms: 0 };
      t.bytes += r.bytesSent;
      t.ms = Math.max(t.ms, r.timestamp);
      totals.set(kind, t);
    }
    const out = {};
    for (const [kind, now] of totals) {
      const before = this.last.get(kind);
      const spanMs = before === undefined ? 0 : now.ms - before.ms;
      // A counter that went back (a new sender) or no time passed: no rate this round.
      out[kind] = spanMs > 0 && now.bytes >= before.bytes ? ((now.bytes - before.bytes) * 8000) / spanMs : null;
      this.last.set(kind, now);
    }
    return out;
  }
}

export function formatBitrate(bps) {
  if (bps === null || bps === undefined) return "–";
  if (bps >= 1e6) return `${(bps / 1e6).toFixed(2)} Mbit/s`;
  return `${(bps / 1e3).toFixed(0)} kbit/s`;
}

// The codec each kind is being sent with, from one getStats() report: {kind: "video/VP8", ...}.
export function sentCodecs(reports) {
  const all = [...reports];
  const codecs = new Map(all.filter((r) => r.type === "codec").map((r) => [r.id, r.mimeType]));
  const out = {};
  for (const r of all) {
    if (r.type !== "outbound-rtp" || !codecs.has(r.codecId)) continue;
    out[r.kind ?? r.mediaType] = codecs.get(r.codecId);
  }
  return out;
}
