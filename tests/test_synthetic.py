from __future__ import annotations

import fractions

import numpy as np
from aiortc.codecs import get_decoder, get_encoder
from aiortc.codecs.vpx import vp8_depayload
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from sfu_sidecar.synthetic import (
    AUDIO_RATE,
    BeepAudioTrack,
    FlashVideoTrack,
    Timeline,
    decode_frame_number,
    is_flash,
)


def test_flash_schedule() -> None:
    assert is_flash(fractions.Fraction(0))
    assert is_flash(fractions.Fraction(3, 30))  # 0.0999...: still inside
    assert not is_flash(fractions.Fraction(3, 10))
    assert is_flash(fractions.Fraction(61, 30) - fractions.Fraction(1, 30))


async def test_frame_numbers_survive_vp8_and_capture_times_are_exact() -> None:
    timeline = Timeline(start_house_ns=1_000_000_000_000, start_monotonic=0.0)  # no pacing waits
    track = FlashVideoTrack(timeline)
    codec = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000)
    encoder, decoder = get_encoder(codec), get_decoder(codec)
    for _ in range(45):
        frame = await track.recv()
        payloads, _ts = encoder.encode(frame, force_keyframe=False)
        data = b"".join(vp8_depayload(p) for p in payloads)
        decoded = decoder.decode(JitterFrame(data=data, timestamp=0))
        assert len(decoded) == 1
        luma = decoded[0].to_ndarray(format="yuv420p")[: track.height]
        n = track.frame_index - 1
        assert decode_frame_number(luma) == n
        # Flash frames are bright, the others dark.
        assert (luma[100:, :].mean() > 150) == is_flash(fractions.Fraction(n, track.fps))
    assert track.capture_log[30] == 1_000_000_000_000 + 1_000_000_000
    assert track.capture_log[1] == 1_000_000_000_000 + 33_333_333


async def test_beep_is_on_the_same_timeline() -> None:
    track = BeepAudioTrack(Timeline(0, 0.0))
    frames = [await track.recv() for _ in range(60)]  # 1.2 s
    energy = [float(np.abs(f.to_ndarray()).mean()) for f in frames]
    beeping = [i for i, e in enumerate(energy) if e > 1000]
    # 100 ms = 5 frames of 20 ms at the start of each second: frames 0-4 and 50-54.
    assert beeping == [0, 1, 2, 3, 4, 50, 51, 52, 53, 54]
    assert frames[50].pts == AUDIO_RATE
