"""The aiortc seam: start-up checks, extension negotiation, ICE on chosen addresses and ports."""

from __future__ import annotations

import pytest
from aiortc.codecs import HEADER_EXTENSIONS

from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.settingvalues import PortRange
from tests.conftest import free_port
from tests.relay.peers import client_pc


async def test_check_passes_on_the_pinned_aiortc() -> None:
    await aiortc_adapter.check()


async def test_check_names_the_version_when_an_internal_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    monkeypatch.delattr(RTCDtlsTransport, "_handle_rtp_data")
    with pytest.raises(ConfigError, match=r"aiortc 1\.16\.0.*_handle_rtp_data"):
        await aiortc_adapter.check()


def test_negotiate_header_extension_is_idempotent_and_shares_ids() -> None:
    uri = "urn:example:test-extension"
    try:
        aiortc_adapter.negotiate_header_extension("audio", uri)
        aiortc_adapter.negotiate_header_extension("video", uri)
        aiortc_adapter.negotiate_header_extension("video", uri)
        audio = [e for e in HEADER_EXTENSIONS["audio"] if e.uri == uri]
        video = [e for e in HEADER_EXTENSIONS["video"] if e.uri == uri]
        assert len(audio) == len(video) == 1 and audio[0].id == video[0].id
        other_ids = {e.id for k in HEADER_EXTENSIONS.values() for e in k if e.uri != uri}
        assert audio[0].id not in other_ids
    finally:
        for kind in ("audio", "video"):
            HEADER_EXTENSIONS[kind][:] = [e for e in HEADER_EXTENSIONS[kind] if e.uri != uri]


async def test_negotiate_video_codec_offers_it_after_aiortcs_own_with_rtx_and_feedback() -> None:
    aiortc_adapter.negotiate_video_codec("video/VP9", {"profile-id": 0})
    aiortc_adapter.negotiate_video_codec("video/VP9", {"profile-id": 0})  # idempotent
    pc = client_pc()
    try:
        pc.addTransceiver("video", direction="recvonly")
        offer = (await pc.createOffer()).sdp
    finally:
        await pc.close()
    rtpmaps = [line.split(":", 1)[1] for line in offer.splitlines()
               if line.startswith("a=rtpmap:")]
    names = [m.split()[1].split("/")[0] for m in rtpmaps]
    assert names.count("VP9") == 1 and names.index("VP8") < names.index("VP9"), names
    pt = next(m.split()[0] for m in rtpmaps if " VP9/90000" in m)
    assert f"a=fmtp:{int(pt) + 1} apt={pt}" in offer
    assert f"a=rtcp-fb:{pt} nack pli" in offer and f"a=rtcp-fb:{pt} nack" in offer
    assert f"a=fmtp:{pt} profile-id=0" in offer


async def test_install_ice_announces_loopback_inside_the_port_range() -> None:
    low = free_port(kind=2)  # SOCK_DGRAM
    ports = PortRange(low, low + 3)
    pc = client_pc()
    pc.addTransceiver("video", direction="sendonly")
    aiortc_adapter.install_ice(pc, ("127.0.0.1",), ports)
    await pc.setLocalDescription(await pc.createOffer())
    candidates = [
        line.split() for line in pc.localDescription.sdp.splitlines()
        if line.startswith("a=candidate:")
    ]
    await pc.close()
    assert [(c[4], c[7]) for c in candidates] == [("127.0.0.1", "host")]
    assert low <= int(candidates[0][5]) <= low + 3


async def test_announced_address_that_is_not_local_binds_the_wildcard() -> None:
    pc = client_pc()
    pc.addTransceiver("audio", direction="sendonly")
    aiortc_adapter.install_ice(pc, ("203.0.113.7",), None)
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    assert " 203.0.113.7 " in sdp


async def test_close_peer_after_a_failed_negotiation() -> None:
    """A garbled direction makes aiortc's createAnswer raise half way; closing that peer
    connection still completes and leaves it closed."""
    from aiortc import RTCSessionDescription

    from tests.relay.test_offer_check import make_offer

    offer = (await make_offer()).replace("a=sendonly", "a=sendonlx")
    pc = client_pc()
    await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
    with pytest.raises(ValueError):
        await pc.setLocalDescription(await pc.createAnswer())
    await aiortc_adapter.close_peer(pc)
    assert pc.connectionState == "closed"


async def _gather_on_an_address_not_of_this_host() -> tuple[list[str], list[tuple[str, int]]]:
    pc = client_pc()
    try:
        pc.addTransceiver("video", direction="recvonly")
        low = free_port()
        aiortc_adapter.install_ice(pc, ("192.0.2.7",), PortRange(low, low + 9))
        await pc.setLocalDescription(await pc.createOffer())
        candidates = [line for line in pc.localDescription.sdp.splitlines()
                      if line.startswith("a=candidate:")]
        bound = aiortc_adapter.ice_socknames(pc)
        assert all(low <= port <= low + 9 for _, port in bound), (bound, low)
        return candidates, bound
    finally:
        await pc.close()


@pytest.mark.integration
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_announced_address_that_is_not_local_is_listened_for_on_every_address(
        loop: str) -> None:
    """1:1 NAT, a container's published ports: ice_addresses names the address clients reach,
    which no interface here has. The candidate announces it, the socket listens on every
    address at the same port. With uvloop too, whose bind error carries no errno."""
    import asyncio

    import uvloop

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        candidates, bound = runner.run(_gather_on_an_address_not_of_this_host())
    assert candidates and all(" 192.0.2.7 " in c for c in candidates), candidates
    assert bound and all(host == "0.0.0.0" for host, _ in bound), bound
    assert {int(c.split()[5]) for c in candidates} == {port for _, port in bound}
