"""OpusDecoder against libopus's own encoder (through PyAV): samples, delay, downmix, refusals."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from sfu_sidecar.speech.decode import ENCODER_LOOKAHEAD, SAMPLE_RATE, OpusDecoder
from tests.support.speech import opus_packets

RATE = 48_000


def tone(freq: float, seconds: float, amp: float = 0.3, at: int = 0) -> npt.NDArray[np.int16]:
    n = round(seconds * RATE)
    x = np.zeros(n)
    t = np.arange(n - at) / RATE
    x[at:] = amp * 32767 * np.sin(2 * np.pi * freq * t)
    return x.astype(np.int16)


def decode_all(decoder: OpusDecoder, packets: list[bytes]) -> npt.NDArray[np.int16]:
    blocks = [decoder.decode(p) for p in packets]
    assert all(b is not None for b in blocks)
    return np.concatenate([b for b in blocks if b is not None])


def level_at(x: npt.NDArray[np.generic], freq: float) -> float:
    """Amplitude of the sinusoid at ``freq`` in ``x`` (Hann-windowed DFT at that frequency)."""
    w = np.hanning(x.size)
    t = np.arange(x.size) / RATE
    return float(2 * abs(np.sum(x * w * np.exp(-2j * np.pi * freq * t))) / w.sum())


def test_decodes_each_packet_to_48k_mono_int16() -> None:
    decoder = OpusDecoder()
    assert decoder.sample_rate == SAMPLE_RATE == RATE
    packets = opus_packets(tone(440, 1.0))
    for p in packets[:-1]:
        pcm = decoder.decode(p)
        assert pcm is not None
        assert pcm.dtype == np.int16 and pcm.ndim == 1 and pcm.size == 960
    assert decoder.decoded == len(packets) - 1 and decoder.refused == 0


@pytest.mark.parametrize("frame_ms", [10, 20, 40, 60])
def test_packet_durations(frame_ms: int) -> None:
    decoder = OpusDecoder()
    pcm = decoder.decode(opus_packets(tone(440, 0.2), frame_ms=frame_ms)[0])
    assert pcm is not None and pcm.size == RATE * frame_ms // 1000


def test_output_is_the_input_delayed_by_the_encoders_lookahead() -> None:
    onset, length = 20_011, 9600
    # A chirp: its correlation with itself has one peak, where a steady tone's repeats.
    t = np.arange(length) / RATE
    chirp = 0.3 * 32767 * np.sin(2 * np.pi * (200 * t + 9000 * t**2))
    source = np.zeros(RATE, dtype=np.int16)
    source[onset:onset + length] = chirp
    out = decode_all(OpusDecoder(), opus_packets(source)).astype(np.float64)
    lags = np.arange(0, 600)
    corr = [np.dot(out[onset + lag:onset + lag + length], chirp) for lag in lags]
    delay = int(lags[np.argmax(corr)])
    # libopus's lookahead is 312 samples; the codec's phase response moves the peak a little.
    assert ENCODER_LOOKAHEAD - 8 <= delay <= ENCODER_LOOKAHEAD
    assert OpusDecoder().delay_ns == 6_500_000


def test_a_tone_comes_out_at_its_level() -> None:
    out = decode_all(OpusDecoder(), opus_packets(tone(440, 1.0))).astype(np.float64)
    assert level_at(out[9600:38_400], 440) == pytest.approx(0.3 * 32767, rel=0.1)


def test_stereo_is_downmixed() -> None:
    left, right = tone(440, 1.0), tone(1000, 1.0)
    packets = opus_packets(np.stack([left, right]), bitrate=96_000, channels=2)
    decoder = OpusDecoder()
    out = decode_all(decoder, packets).astype(np.float64)
    steady = out[9600:38_400]
    # Each channel at half its level: the mean of the two.
    assert level_at(steady, 440) == pytest.approx(0.15 * 32767, rel=0.1)
    assert level_at(steady, 1000) == pytest.approx(0.15 * 32767, rel=0.1)


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff\xff", b"\x03\x00\x01", b"\xff" * 300])
def test_a_refused_payload_is_none_and_counted(garbage: bytes) -> None:
    decoder = OpusDecoder()
    packets = opus_packets(tone(440, 0.2))
    assert decoder.decode(packets[0]) is not None
    assert decoder.decode(garbage) is None
    assert decoder.refused == 1
    # The stream goes on.
    pcm = decoder.decode(packets[1])
    assert pcm is not None and pcm.size == 960
    assert decoder.decoded == 2


@pytest.mark.parametrize("payload", [b"", b"\xf8", b"\x08", b"\xf8\x00"])
def test_dtx_and_empty_payloads_hold_no_samples(payload: bytes) -> None:
    decoder = OpusDecoder()
    packets = opus_packets(tone(440, 0.2))
    assert decoder.decode(packets[0]) is not None
    pcm = decoder.decode(payload)
    assert pcm is not None and pcm.dtype == np.int16 and pcm.size == 0
    assert decoder.refused == 0
    # An empty payload is not libav's end of stream: decoding goes on.
    after = decoder.decode(packets[1])
    assert after is not None and after.size == 960


def test_the_payload_is_left_as_it_was() -> None:
    packet = opus_packets(tone(440, 0.1))[0]
    given = bytearray(packet)
    OpusDecoder().decode(given)  # type: ignore[arg-type]
    assert bytes(given) == packet
