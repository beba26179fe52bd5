"""The VP9 payload descriptor against packets built by hand per RFC 9628 §4.2; what GStreamer's
own packetizer writes is read in ``tests/segments/test_vp9.py``."""

from __future__ import annotations

import pytest

from sfu_sidecar.relay.packet import is_keyframe_start
from sfu_sidecar.relay.vp9 import Vp9Descriptor, Vp9DescriptorError, vp9_keyframe_start

# The first byte's flags: I, P, L, F, B, E, V.
PID, PRED, LAYERS, FLEX, BEGIN, END, SS = 0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02
PAYLOAD = b"\x82\x49\x83\x42"  # a VP9 keyframe's first bytes (frame marker, sync code)


def test_non_flexible_keyframe_with_picture_id_layers_and_scalability_structure() -> None:
    ss = bytes([(1 << 5) | 0x10 | 0x08,  # N_S=1 (two spatial layers), Y, G
                0x01, 0x40, 0x00, 0xB4,  # 320x180
                0x02, 0x80, 0x01, 0x68,  # 640x360
                0x01,  # N_G = 1
                (0 << 5) | (1 << 2), 0x01])  # TID 0, R=1, one P_DIFF
    packet = bytes([PID | LAYERS | BEGIN | SS, 0x80 | 0x12, 0x34,  # 15-bit PictureID
                    (0 << 5) | (0 << 1), 0x07]) + ss + PAYLOAD  # TID 0 SID 0, TL0PICIDX
    d = Vp9Descriptor.parse(packet)
    assert d.size == len(packet) - len(PAYLOAD)
    assert d.start and not d.end and not d.inter and d.spatial_id == 0
    assert d.resolutions == ((320, 180), (640, 360))
    assert (d.picture_id, d.picture_id_bits) == (0x1234, 15)
    assert vp9_keyframe_start(packet) and is_keyframe_start("vp9", packet)


def test_flexible_inter_frame_with_reference_indices() -> None:
    # F=1, P=1: three P_DIFF bytes, the N bit set on all but the last.
    packet = bytes([PID | PRED | LAYERS | FLEX | BEGIN | END, 0x05, (2 << 5) | (1 << 1),
                    0x03, 0x05, 0x04]) + b"x"
    d = Vp9Descriptor.parse(packet)
    assert d.size == 6 and d.inter and d.start and d.end and d.spatial_id == 1
    assert (d.picture_id, d.picture_id_bits) == (5, 7)
    assert not vp9_keyframe_start(packet)


def test_an_upper_spatial_layer_is_no_place_to_start() -> None:
    # Not predicted, but spatial layer 1.
    packet = bytes([LAYERS | FLEX | BEGIN, (0 << 5) | (1 << 1)]) + PAYLOAD
    assert not Vp9Descriptor.parse(packet).inter
    assert not vp9_keyframe_start(packet)


def test_continuation_packet_is_no_start() -> None:
    assert not vp9_keyframe_start(bytes([PID, 0x01]) + b"rest of a keyframe")


@pytest.mark.parametrize("packet", [
    b"",
    bytes([PID]),  # PictureID missing
    bytes([PID, 0x80]),  # extended PictureID missing
    bytes([LAYERS]),  # layer indices missing
    bytes([LAYERS, 0x00]),  # TL0PICIDX missing (non-flexible)
    bytes([PRED | FLEX, 0x03, 0x03, 0x03]),  # a fourth reference index announced
    bytes([SS, 0x10, 0x01]),  # resolutions cut short
    bytes([SS, 0x08, 0x02, 0x04]),  # the second picture of the group missing
])
def test_truncated_or_malformed_descriptors_are_refused(packet: bytes) -> None:
    with pytest.raises(Vp9DescriptorError):
        Vp9Descriptor.parse(packet)
    assert not vp9_keyframe_start(packet)


def test_every_prefix_of_a_descriptor_is_refused_or_read_alike() -> None:
    packet = bytes([PID | PRED | LAYERS | FLEX | BEGIN | SS, 0x85, 0x01, 0x02, 0x81, 0x02,
                    0x10, 0x00, 0x10, 0x00, 0x10]) + PAYLOAD
    whole = Vp9Descriptor.parse(packet)
    for cut in range(len(packet)):
        try:
            part = Vp9Descriptor.parse(packet[:cut])
        except Vp9DescriptorError:
            continue
        assert part == whole and cut >= whole.size
