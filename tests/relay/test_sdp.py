"""Offer checks, negotiated-media summaries, mDNS filtering and trickle fragments."""

from __future__ import annotations

import pytest

from sfu_sidecar.exceptions import BadInput, NotAcceptable, Unprocessable
from sfu_sidecar.relay import sdp

OFFER = "\r\n".join([
    "v=0",
    "o=- 1 2 IN IP4 127.0.0.1",
    "s=-",
    "t=0 0",
    "a=group:BUNDLE 0 1",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111",
    "c=IN IP4 0.0.0.0",
    "a=mid:0",
    "a=sendonly",
    "a=ice-ufrag:abcd",
    "a=ice-pwd:0123456789012345678901",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
    "a=setup:actpass",
    "a=rtcp-mux",
    "a=rtpmap:111 opus/48000/2",
    "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host",
    "a=candidate:2 1 udp 2122260223 6b2a0c1e-1111-4222-8333-944444444444.local 50001 typ host",
    "m=video 9 UDP/TLS/RTP/SAVPF 96 97 102",
    "c=IN IP4 0.0.0.0",
    "a=mid:1",
    "a=sendonly",
    "a=ice-ufrag:abcd",
    "a=ice-pwd:0123456789012345678901",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
    "a=setup:actpass",
    "a=rtcp-mux",
    "a=rtpmap:96 AV1/90000",
    "a=rtpmap:97 VP8/90000",
    "a=rtpmap:102 rtx/90000",
    "a=fmtp:102 apt=97",
    "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=extmap:9 http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time",
    "a=ssrc-group:FID 1111 2222",
    "a=ssrc:1111 cname:pub",
    "a=ssrc:2222 cname:pub",
    "",
])


def test_parse_summarises_media() -> None:
    desc = sdp.parse(OFFER, what="offer")
    audio, video = desc.media
    assert (audio.kind, audio.mid, audio.direction, audio.primary.name) == (
        "audio", "0", "sendonly", "opus"
    )
    assert video.primary.name == "av1"  # first offered; not forwardable
    assert [c.name for c in video.codecs if c.forwardable] == ["vp8"]
    assert video.rtx_for(97) == 102 and video.rtx_for(96) is None
    assert video.extensions[
        "http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time"] == 9
    assert video.rtx_ssrcs == {2222: 1111} and video.cname == "pub"
    assert (desc.ice_ufrag, desc.has_application) == ("abcd", False)
    sdp.check_offer(desc, publishing=True)


def test_check_offer_refusals() -> None:
    with pytest.raises(BadInput, match="a viewer must receive"):
        sdp.check_offer(sdp.parse(OFFER, what="offer"), publishing=False)
    no_codec = OFFER.replace("a=rtpmap:97 VP8/90000", "a=rtpmap:97 AV1/90000")
    with pytest.raises(NotAcceptable, match=r"VP8, VP9 \(profile 0\), H\.264"):
        sdp.check_offer(sdp.parse(no_codec, what="offer"), publishing=True)
    vp9 = OFFER.replace("a=rtpmap:97 VP8/90000", "a=rtpmap:97 VP9/90000")
    assert [c.name for c in sdp.parse(vp9, what="offer").media[1].codecs if c.forwardable] == [
        "vp9"]
    vp9_profile2 = vp9.replace("a=rtpmap:97 VP9/90000",
                               "a=rtpmap:97 VP9/90000\r\na=fmtp:97 profile-id=2")
    with pytest.raises(NotAcceptable, match=r"VP9 \(profile 0\)"):
        sdp.check_offer(sdp.parse(vp9_profile2, what="offer"), publishing=True)
    h264_mode0 = OFFER.replace("a=rtpmap:97 VP8/90000", "a=rtpmap:97 H264/90000")
    with pytest.raises(NotAcceptable):
        sdp.check_offer(sdp.parse(h264_mode0, what="offer"), publishing=True)
    two_videos = OFFER + OFFER[OFFER.index("m=video"):]
    with pytest.raises(BadInput, match="more than one video"):
        sdp.check_offer(sdp.parse(two_videos, what="offer"), publishing=True)
    with pytest.raises(BadInput, match="must start with v=0"):
        sdp.parse("<html>", what="offer")
    with pytest.raises(BadInput, match="lacks ICE"):
        sdp.parse(OFFER.replace("a=ice-ufrag:abcd\r\n", ""), what="offer")


@pytest.mark.parametrize("tail", ["\t", "\x1f", "\xa0", "-x", "\x01"])
def test_ice_credentials_outside_ice_chars_are_refused(tail: str) -> None:
    """What aiortc parsed is checked, whitespace a stripped line would lose included: the ufrag
    goes into the answer's ETag header."""
    for line in ("a=ice-ufrag:abcd", "a=ice-pwd:0123456789012345678901"):
        with pytest.raises(BadInput, match="ice-char"):
            sdp.parse(OFFER.replace(line, line + tail), what="offer")


def test_answers_from_upstream_keep_their_credentials() -> None:
    """An upstream server's answer reaches no header: its credentials are aiortc's to judge."""
    answer = sdp.parse(OFFER.replace("a=ice-ufrag:abcd", "a=ice-ufrag:ab-cd"), what="answer")
    assert answer.ice_ufrag == "ab-cd"


def test_mdns_candidates_are_dropped() -> None:
    text, dropped = sdp.strip_mdns_candidates(OFFER)
    assert dropped == 1
    assert ".local" not in text and "127.0.0.1 50000" in text


def test_trickle_fragment() -> None:
    frag = "\r\n".join([
        "a=ice-ufrag:abcd", "a=ice-pwd:0123456789012345678901", "m=audio 9 RTP/AVP 0",
        "a=mid:0", "a=candidate:1 1 udp 2122260223 127.0.0.1 50002 typ host",
        "a=candidate:2 1 udp 2122260223 abc.local 50003 typ host", "a=end-of-candidates", "",
    ])
    t = sdp.parse_trickle(frag)
    assert [(c.ip, c.port, c.sdpMid) for c in t.candidates] == [("127.0.0.1", 50002, "0")]
    assert t.end_of_candidates and t.mdns_dropped == 1
    sdp.check_no_restart(t, "abcd", "0123456789012345678901")
    with pytest.raises(Unprocessable):
        sdp.check_no_restart(t, "other", "0123456789012345678901")
    with pytest.raises(BadInput):
        sdp.parse_trickle("a=candidate:garbage")
    with pytest.raises(BadInput):
        sdp.parse_trickle("hello")


def test_media_attributes_go_into_every_audio_and_video_section() -> None:
    text = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\n"
            "a=mid:0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:2\r\n"
            "m=video 9 UDP/TLS/RTP/SAVPF 97\r\na=mid:1\r\n")
    out = sdp.add_media_attributes(text, ["a=ts-refclk:ptp=IEEE1588-2008:00-11:0",
                                          "a=mediaclk:direct=0"])
    sections = out.split("\r\nm=")
    assert "a=mediaclk:direct=0" not in sections[0]  # session level untouched
    audio, application, video = sections[1:]
    assert audio.endswith("a=mid:0\r\na=ts-refclk:ptp=IEEE1588-2008:00-11:0\r\na=mediaclk:direct=0")
    assert "mediaclk" not in application
    assert video.endswith("a=mediaclk:direct=0\r\n")
