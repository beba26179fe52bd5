"""Streams: the publisher slot, keyframe requests routed to the live publisher, the registry."""

from __future__ import annotations

import time

import pytest

from sfu_sidecar.config import load_settings
from sfu_sidecar.exceptions import Conflict, NotFound
from sfu_sidecar.relay.forwarder import OutputConfig, ViewerOutput
from sfu_sidecar.relay.peersessions import PublisherSession
from sfu_sidecar.relay.sdp import CodecInfo
from sfu_sidecar.relay.streams import Streams

VP8 = CodecInfo(96, "vp8", 90000, None, {})
S = 1_000_000_000


def publisher(streams: Streams, name: str) -> PublisherSession:
    return PublisherSession(streams.get_or_create(name), load_settings({}), time.time_ns, [])


async def test_a_viewers_keyframe_request_goes_to_the_live_publishers_callable() -> None:
    streams = Streams()
    stream = streams.get_or_create("cam")
    asked: list[str] = []
    session = publisher(streams, "cam")
    stream.claim_publisher(session, asked.append)
    fw = stream.forwarder("video", VP8)
    output = ViewerOutput("v1", "video", OutputConfig(ssrc=1, payload_type=96),
                          seq_base=0, ts_base=0)
    fw.add_output(output)
    stream.keyframe_requested(output, 10 * S)
    assert asked == ["video"]
    stream.keyframe_requested(output, 10 * S + 1)  # within the throttle interval
    assert asked == ["video"]
    stream.publisher_closed(session)
    stream.keyframe_requested(output, 20 * S)  # nobody to ask once the publisher left
    assert asked == ["video"]
    await session.pc.close()


async def test_a_components_keyframe_request_shares_the_viewers_throttle() -> None:
    streams = Streams()
    stream = streams.get_or_create("cam")
    asked: list[str] = []
    assert not stream.keyframe_wanted("video", 10 * S)  # no video track yet
    stream.claim_publisher(publisher(streams, "cam"), asked.append)
    fw = stream.forwarder("video", VP8)
    output = ViewerOutput("v1", "video", OutputConfig(ssrc=1, payload_type=96),
                          seq_base=0, ts_base=0)
    fw.add_output(output)
    assert stream.keyframe_wanted("video", 10 * S)
    stream.keyframe_requested(output, 10 * S + 1)  # a viewer's PLI right after: throttled
    assert not stream.keyframe_wanted("video", 10 * S + 2)
    assert asked == ["video"]
    assert stream.keyframe_wanted("video", 11 * S)
    assert asked == ["video", "video"]


async def test_one_publisher_at_a_time_and_an_empty_stream_is_dropped() -> None:
    streams = Streams()
    stream = streams.get_or_create("cam")
    first, second = publisher(streams, "cam"), publisher(streams, "cam")
    stream.claim_publisher(first, lambda kind: None)
    with pytest.raises(Conflict):
        stream.claim_publisher(second, lambda kind: None)
    stream.publisher_closed(first)
    assert streams.by_name == {}
    with pytest.raises(NotFound):
        streams.get("cam")
    for session in (first, second):
        await session.pc.close()
