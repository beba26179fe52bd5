"""Opus RTP payloads to mono 16-bit PCM at 48 kHz, with libopus through PyAV.

Decoding only: nothing is re-encoded and the payloads are not changed (the relay forwards the
same bytes). A payload libopus refuses is counted and skipped, never raised: it is a remote
fault, and one bad packet must not stop the speech that follows it.
"""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt

# RFC 7587 section 4.1: Opus's RTP clock runs at 48 kHz whatever bandwidth was coded, so the
# decoder always outputs 48 kHz and its sample count matches the RTP timestamp step.
SAMPLE_RATE = 48_000
# libopus's algorithmic delay at 48 kHz in its VoIP and audio modes (OPUS_GET_LOOKAHEAD:
# 2.5 ms + 4 ms of delay compensation), which is what browsers' WebRTC encoders run. Ogg Opus
# carries it as pre-skip (RFC 7845); RTP carries nothing, so the speech in a decoded packet was
# captured this many samples before the packet's own timestamp says. Measured through PyAV's
# libopus: a chirp comes out 310 samples late (tests/speech/test_decode.py).
ENCODER_LOOKAHEAD = 312
# A payload of one or two bytes is a TOC byte without a coded frame: libopus's encoder makes
# them for DTX silence, and WebRTC sends the first one to say DTX began. There is no audio in
# it (a decoder would conceal a lost packet in its place).
DTX_MAX_BYTES = 2


class OpusDecoder:
    """Opus RTP payloads -> mono int16 PCM at 48 kHz (PyAV, libopus).

    Never re-encodes; never touches anything it is given. One decoder per RTP stream: Opus
    decoding carries state from packet to packet.
    """

    def __init__(self, lookahead_samples: int = ENCODER_LOOKAHEAD) -> None:
        self.sample_rate = SAMPLE_RATE
        self.lookahead_samples = lookahead_samples
        self.refused = 0  # payloads libopus would not decode
        self.decoded = 0  # payloads that produced samples
        self._ctx = av.CodecContext.create("libopus", "r")
        self._ctx.sample_rate = SAMPLE_RATE
        # libopus mixes a stereo stream down itself when asked for one channel (opus_decode on
        # a mono decoder), cheaper than decoding both channels and averaging them here.
        self._ctx.layout = "mono"

    @property
    def delay_ns(self) -> int:
        """How much later than captured the decoded samples come out: give the detector
        ``first_sample_ns = packet_capture_ns - delay_ns``."""
        return self.lookahead_samples * 1_000_000_000 // self.sample_rate

    def decode(self, payload: bytes) -> npt.NDArray[np.int16] | None:
        """Samples of one payload; an empty array for DTX or an empty payload, ``None`` (and
        ``refused`` counted) for one the decoder refused."""
        if len(payload) <= DTX_MAX_BYTES:
            # Never hand libav an empty packet: that is its end-of-stream signal, after which
            # the decoder takes no more input.
            return np.zeros(0, dtype=np.int16)
        try:
            frames = self._ctx.decode(av.Packet(bytes(payload)))
        except av.FFmpegError:
            self.refused += 1
            return None
        blocks = [_mono_int16(frame) for frame in frames]
        self.decoded += 1
        if not blocks:
            return np.zeros(0, dtype=np.int16)
        return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def _mono_int16(frame: av.AudioFrame) -> npt.NDArray[np.int16]:
    data: npt.NDArray[np.generic] = np.asarray(frame.to_ndarray())
    channels = len(frame.layout.channels)
    # Packed formats come as one row of interleaved samples, planar ones as a row per channel.
    planar = bool(frame.format.is_planar)
    samples = data.reshape(channels, -1) if planar else data.reshape(-1, channels).T
    out: npt.NDArray[np.int16]
    if samples.dtype.kind == "f":
        mono = samples.astype(np.float64).mean(axis=0) * 32768.0
        out = np.clip(np.rint(mono), -32768, 32767).astype(np.int16)
    elif channels == 1:
        out = samples[0].astype(np.int16, copy=False)
    else:
        out = (samples.astype(np.int32).sum(axis=0) // channels).astype(np.int16)
    return out
