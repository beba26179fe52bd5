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

// --- Capture choices ---------------------------------------------------------------------

// The resolutions offered, as getUserMedia asks for them (ideal: a camera that cannot reach
// one gives its nearest rather than refusing).
export const RESOLUTIONS = {
  "360p": { width: 640, height: 360 },
  "540p": { width: 960, height: 540 },
  "720p": { width: 1280, height: 720 },
  "1080p": { width: 1920, height: 1080 },
};
export const FRAME_RATE = 30;

// Video constraints for getUserMedia / applyConstraints: `resolution` a key of RESOLUTIONS,
// `deviceId` the chosen camera ("" or undefined: the browser's default).
export function videoConstraints(resolution, deviceId) {
  const size = RESOLUTIONS[resolution];
  if (size === undefined) throw new InputError(`unknown resolution ${JSON.stringify(resolution)}`);
  const out = { width: { ideal: size.width }, height: { ideal: size.height }, frameRate: { ideal: FRAME_RATE } };
  if (deviceId) out.deviceId = { exact: deviceId };
  return out;
}

export function audioConstraints(deviceId) {
  return deviceId ? { deviceId: { exact: deviceId } } : true;
}

const DEVICE_NOUN = { videoinput: "camera", audioinput: "microphone" };

// The options of a device select from enumerateDevices() output: [{value, label}] of `kind`
// ("videoinput" | "audioinput"), and the value to select: `current` while it is still there,
// else the first. Labels are empty before permission is given: those get "camera 1" etc.
export function deviceChoices(devices, kind, current) {
  const options = [];
  for (const d of devices) {
    if (d.kind !== kind || options.some((o) => o.value === d.deviceId)) continue;
    const label = String(d.label ?? "").trim() || `${DEVICE_NOUN[kind] ?? kind} ${options.length + 1}`;
    options.push({ value: d.deviceId, label });
  }
  const selected = options.some((o) => o.value === current) ? current : (options[0]?.value ?? "");
  return { options, selected };
}

// The level of one block of samples (an AnalyserNode's getFloatTimeDomainData, -1..1) as
// 0..1 on a decibel scale: RMS from -60 dBFS (0) to 0 dBFS (1), which is how a level meter
// reads (a speaking voice sits in its upper half, silence at 0).
export const METER_FLOOR_DB = -60;
export function levelFromSamples(samples) {
  if (samples.length === 0) return 0;
  let sum = 0;
  for (const s of samples) sum += s * s;
  const rms = Math.sqrt(sum / samples.length);
  if (rms <= 0) return 0;
  const db = 20 * Math.log10(rms);
  return Math.min(1, Math.max(0, (db - METER_FLOOR_DB) / -METER_FLOOR_DB));
}

// RTCRtpSender.getParameters() output with the first encoding's maxBitrate set to `bps`
// (null or 0: no limit, the encoder's own choice). Returns the object to setParameters with.
export function withMaxBitrate(params, bps) {
  const encodings = (params.encodings?.length ? params.encodings : [{}]).map((e) => ({ ...e }));
  if (bps) {
    if (!Number.isFinite(bps) || bps < 1) throw new InputError(`bad bitrate ${bps}`);
    encodings[0].maxBitrate = Math.round(bps);
  } else {
    delete encodings[0].maxBitrate;
  }
  return { ...params, encodings };
}

// --- What went wrong, in words a broadcaster can act on ------------------------------------

// A getUserMedia / getDisplayMedia / applyConstraints refusal (a DOMException's name).
export function captureErrorMessage(err, source = "camera") {
  const what = source === "screen" ? "screen sharing"
    : source === "microphone" ? "the microphone"
      : source === "video" ? "the camera" : "the camera or microphone";
  const name = err?.name ?? "";
  const detail = err?.message ? ` (${err.message})` : "";
  switch (name) {
    case "NotAllowedError":
    case "SecurityError":
      return source === "screen"
        ? "screen sharing was not allowed: choose a screen or window to share and press Start again"
        : `permission to use ${what} was denied: allow it in the browser's site settings, then press Start again`;
    case "NotFoundError":
      return `no ${source === "microphone" ? "microphone" : source === "video" ? "camera" : "camera or microphone"} ` +
        "was found: connect one and choose it above";
    case "NotReadableError":
    case "AbortError":
      return `${what} is busy or could not be started: close other applications using it and try again${detail}`;
    case "OverconstrainedError":
      return err.constraint === "deviceId"
        ? `the chosen device is no longer there: choose another one above`
        : `${what} cannot capture what was asked (${err.constraint ?? "constraints"}): choose a lower resolution`;
    default:
      return `${what} not available: ${err?.message ?? err}`;
  }
}

// A WHIP POST that failed: `status` the HTTP status (null when no answer came: a network
// error), `reason` the server's words (serverReason). Returns {message, retry}: whether trying
// again later can help. A refused token or offer will be refused again: never retried.
export function whipFailure(status, reason) {
  const words = reason ?? (status ? `HTTP ${status}` : "no answer");
  if (status === 401 || status === 403) return { message: `publish token refused (${words})`, retry: false };
  if (status === 400 || status === 415 || status === 422) {
    return { message: `the relay refused this offer (${words})`, retry: false };
  }
  if (status === 404 || status === 405) return { message: `no WHIP endpoint here (${words})`, retry: false };
  // 409: the stream's old publisher session is still there (it ends when the relay notices
  // it is gone); 408, 425, 429, 5xx: come back later; no answer: the network.
  if (status === null || status === undefined || status === 0 || status === 408 || status === 409
      || status === 425 || status === 429 || status >= 500) {
    return { message: status ? `the relay answered ${words}` : `the relay could not be reached (${words})`, retry: true };
  }
  return { message: `the relay refused to publish (${words})`, retry: false };
}

// --- Staying on air --------------------------------------------------------------------

// Delays between reconnection attempts: `firstMs`, doubling up to `maxMs`; reset() once on air.
export class Backoff {
  constructor({ firstMs = 500, maxMs = 4000 } = {}) {
    this.firstMs = firstMs;
    this.maxMs = maxMs;
    this.reset();
  }

  reset() {
    this.nextMs = this.firstMs;
  }

  next() {
    const ms = this.nextMs;
    this.nextMs = Math.min(this.maxMs, this.nextMs * 2);
    return ms;
  }
}

// How a peer connection's states read for a publisher that wants to stay on air: "up",
// "lost" (gone for good: reconnect now), "unsteady" (may come back: reconnect after a grace),
// or "pending" (still connecting). `dtls` is the DTLS transport's state (the relay ending the
// session closes it), `closedByUs` whether this side closed the connection.
export function linkHealth({ connection, ice, dtls }) {
  if (connection === "failed" || connection === "closed" || ice === "failed" || ice === "closed"
      || dtls === "failed" || dtls === "closed") return "lost";
  if (connection === "disconnected" || ice === "disconnected") return "unsteady";
  if (connection === "connected") return "up";
  return "pending";
}

// Keeps a publication on air: connects, and when the connection is lost connects again on the
// same stream, with backoff, until stop() or a refusal retrying cannot fix. Pure: the network
// is the injected `connect()`, time the injected `sleep(ms)`.
//
// connect(attempt) resolves a session with watch({onConnected, onDrop}) (returns a function
// that stops watching) and close() (ends it, best-effort, never throws), or throws; classify(err)
// says {message, retry} of a throw. onState(state, detail) hears "connecting", "publishing",
// "reconnecting" ({attempt, delayMs, reason}), "failed" ({message}) and "stopped".
export class Republisher {
  constructor({ connect, classify, sleep, onState = () => {}, backoff = new Backoff() }) {
    Object.assign(this, { connect, classify, sleep, onState, backoff });
    this.session = null;
    this.running = false;
    this.attempt = 0;
    this.connects = 0; // sessions that reached "connected"
    this._wake = null;
  }

  // Runs until stopped or refused for good; resolves the final state ("stopped" | "failed").
  async run() {
    this.running = true;
    let reason = null;
    for (;;) {
      if (!this.running) return "stopped";
      this.attempt += 1;
      this.onState(reason === null ? "connecting" : "reconnecting", { attempt: this.attempt, reason });
      let session;
      try {
        session = await this.connect(this.attempt);
      } catch (err) {
        if (!this.running) return "stopped";
        const verdict = this.classify(err);
        if (!verdict.retry) {
          this.running = false;
          this.onState("failed", { message: verdict.message });
          return "failed";
        }
        reason = verdict.message;
        await this._pause(reason);
        continue;
      }
      if (!this.running) {
        await session.close();
        return "stopped";
      }
      this.session = session;
      reason = await this._untilDropped(session);
      this.session = null;
      await session.close(); // best-effort DELETE of the old resource, so the stream is free
      if (!this.running) return "stopped";
      await this._pause(reason);
    }
  }

  _untilDropped(session) {
    return new Promise((resolve) => {
      let unwatch = () => {};
      const done = (why) => {
        unwatch();
        this._wake = null;
        resolve(why);
      };
      this._wake = () => done(null);
      unwatch = session.watch({
        onConnected: () => {
          this.connects += 1;
          this.backoff.reset();
          this.onState("publishing", { attempt: this.attempt });
        },
        onDrop: (why) => done(why),
      });
    });
  }

  async _pause(reason) {
    const delayMs = this.backoff.next();
    this.onState("reconnecting", { attempt: this.attempt, delayMs, reason });
    await Promise.race([this.sleep(delayMs), new Promise((resolve) => { this._wake = resolve; })]);
    this._wake = null;
  }

  // Ends the loop: the current session is closed by run() (awaiting it returns "stopped").
  stop() {
    this.running = false;
    this._wake?.();
  }
}
