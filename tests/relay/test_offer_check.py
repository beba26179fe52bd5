"""Offer shape checks: real offers pass, each malformed shape is refused with its reason, and
no offer that passes makes the real relay answer with a 5xx."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
from aiortc import sdp as aiosdp
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.relay.offer_check import MAX_LINE_CHARS, MAX_LINES, validate_offer
from tests.relay.conftest import Relay
from tests.relay.peers import LOOPBACK, client_pc

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
SDP = {"Content-Type": "application/sdp"}


async def make_offer(direction: str = "sendonly", data_channel: bool = True) -> str:
    """A real aiortc offer with audio, video and (optionally) a data channel."""
    pc = client_pc()
    pc.addTransceiver("audio", direction=direction)
    pc.addTransceiver("video", direction=direction)
    if data_channel:
        pc.createDataChannel("sync")
    aiortc_adapter.install_ice(pc, LOOPBACK, None)
    await pc.setLocalDescription(await pc.createOffer())
    sdp = str(pc.localDescription.sdp)
    await pc.close()
    # LF line ends, so the mutations below can anchor on "$"; the CRLF form is tested too.
    return sdp.replace("\r\n", "\n")


@pytest.fixture(scope="module")
def offers() -> dict[str, str]:
    loop = asyncio.new_event_loop()
    try:
        return {
            "publish": loop.run_until_complete(make_offer("sendonly")),
            "view": loop.run_until_complete(make_offer("recvonly")),
        }
    finally:
        loop.close()


def edit(sdp: str, pattern: str, replacement: str, count: int = 0) -> str:
    """``sdp`` with a regex replaced line-wise (MULTILINE); the pattern must occur."""
    out, n = re.subn(pattern, replacement, sdp, count=count, flags=re.MULTILINE)
    assert n, f"{pattern!r} not in the offer"
    return out


def refused(sdp: str) -> str:
    with pytest.raises(BadInput) as info:
        validate_offer(sdp)
    assert info.value.status == 400
    return info.value.reason


def test_real_aiortc_offers_pass(offers: dict[str, str]) -> None:
    validate_offer(offers["publish"])
    validate_offer(offers["view"])
    validate_offer(offers["publish"].replace("\n", "\r\n"))


def test_the_offer_returned_is_what_was_checked(offers: dict[str, str]) -> None:
    """Lines are checked stripped; aiortc would read a direction with a trailing tab as an
    unknown attribute (and fail in createAnswer), so the stripped lines are what is handed on."""
    padded = re.sub(r"^a=(sendonly|recvonly)$", "a=\\1\t", offers["publish"], flags=re.MULTILINE)
    padded = "\n  \n" + padded.replace("a=mid:", " a=mid:")
    assert "\t" in padded
    checked = validate_offer(padded)
    assert "\t" not in checked and "\n\r\n" not in checked and " a=mid:" not in checked
    assert checked.endswith("\r\n") and checked.startswith("v=0\r\n")
    parsed = aiosdp.SessionDescription.parse(checked)
    assert [m.direction for m in parsed.media if m.kind != "application"] == ["sendonly"] * 2
    assert validate_offer(checked) == checked


def test_a_real_chromium_offer_passes(browser: Any) -> None:
    page = browser.new_page()
    try:
        sdp = page.evaluate(
            """async () => {
                const pc = new RTCPeerConnection();
                pc.addTransceiver('audio', {direction: 'sendonly'});
                pc.addTransceiver('video', {direction: 'sendonly'});
                pc.createDataChannel('sync');
                await pc.setLocalDescription(await pc.createOffer());
                const sdp = pc.localDescription.sdp;
                pc.close();
                return sdp;
            }"""
        )
    finally:
        page.close()
    assert "a=extmap-allow-mixed" in sdp or "a=msid-semantic" in sdp  # it is Chromium's
    validate_offer(sdp)


# A GStreamer webrtcbin offer (an independent WebRTC stack, as OBS-style encoders are), made by
# the system Python that carries the gi bindings.
GST_OFFER = """
import gi
gi.require_version("Gst", "1.0"); gi.require_version("GstWebRTC", "1.0")
from gi.repository import Gst, GstWebRTC, GLib
Gst.init(None)
pipe = Gst.parse_launch(
    "webrtcbin name=w bundle-policy=max-bundle "
    "videotestsrc is-live=true ! vp8enc deadline=1 ! rtpvp8pay ! "
    "application/x-rtp,media=video,encoding-name=VP8,payload=96 ! w. "
    "audiotestsrc is-live=true ! opusenc ! rtpopuspay ! "
    "application/x-rtp,media=audio,encoding-name=OPUS,payload=97 ! w.")
w = pipe.get_by_name("w")
loop = GLib.MainLoop()
def offered(promise, _):
    reply = promise.get_reply()
    offer = reply.get_value("offer")
    done = Gst.Promise.new()
    w.emit("set-local-description", offer, done)
def gathered(*_):
    if w.get_property("ice-gathering-state") == GstWebRTC.WebRTCICEGatheringState.COMPLETE:
        print(w.get_property("local-description").sdp.as_text())
        loop.quit()
def negotiate(_):
    promise = Gst.Promise.new_with_change_func(offered, None)
    w.emit("create-offer", None, promise)
w.connect("on-negotiation-needed", negotiate)
w.connect("notify::ice-gathering-state", gathered)
pipe.set_state(Gst.State.PLAYING)
GLib.timeout_add_seconds(20, loop.quit)
loop.run()
pipe.set_state(Gst.State.NULL)
"""


@pytest.mark.needs("gst-launch-1.0", "/usr/bin/python3")
async def test_a_real_gstreamer_offer_passes_and_is_answered(relay: Relay) -> None:
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/python3", "-c", GST_OFFER,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    offer = out.decode()
    assert offer.startswith("v=0"), err.decode()[-2000:]
    validate_offer(offer)
    # The DTLS client role, as a GStreamer publisher must take against aiortc.
    offer = offer.replace("a=setup:actpass", "a=setup:active")
    async with relay.http.post(f"{relay.base}/whip/gst", data=offer, headers=SDP) as r:
        assert r.status == 201, await r.text()


CASES: list[tuple[str, Callable[[str], str], str]] = [
    ("direction removed",
     lambda s: edit(s, r"^a=sendonly\n", "", 1), "exactly one direction attribute"),
    ("direction garbled",
     lambda s: edit(s, r"^a=sendonly$", "a=sendonlyy", 1), "exactly one direction attribute"),
    ("two directions",
     lambda s: edit(s, r"^a=sendonly$", "a=sendonly\na=recvonly", 1),
     "exactly one direction attribute"),
    ("no mid", lambda s: edit(s, r"^a=mid:0\n", ""), "a=mid"),
    ("mid repeated", lambda s: edit(s, r"^a=mid:1$", "a=mid:0"), "repeats a=mid:0"),
    ("unknown m-line kind", lambda s: s + "m=text 9 RTP/AVP 0\na=mid:9\n",
     "only audio, video and application"),
    ("two data channels",
     lambda s: s + "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\na=mid:7\n",
     "more than one application"),
    ("m-line without formats", lambda s: edit(s, r"^m=audio (\d+) (\S+) .*$", r"m=audio \1 \2"),
     "is not m=<kind>"),
    ("port out of range", lambda s: edit(s, r"^m=audio \d+", "m=audio 70000"), "not 0-65535"),
    ("payload type over 127", lambda s: edit(s, r"^(m=audio .*) 96 ", r"\1 200 "),
     "payload type '200'"),
    ("payload type in the RTCP range", lambda s: edit(s, r"^(m=audio .*) 96 ", r"\1 72 "),
     "payload type '72'"),
    ("payload type not a number", lambda s: edit(s, r"^(m=audio .*) 96 ", r"\1 x "),
     "payload type 'x'"),
    ("no codecs", lambda s: edit(s, r"^a=rtpmap:(96|9|0|8) .*\n", ""), "offers no codec"),
    ("rtpmap garbled", lambda s: edit(s, r"^a=rtpmap:96 .*$", "a=rtpmap:96 opus"), "a=rtpmap"),
    ("rtpmap for an unlisted payload type",
     lambda s: edit(s, r"^a=rtpmap:96 ", "a=rtpmap:110 ", 1), "does not list"),
    ("fmtp integer parameter garbled", lambda s: edit(s, r"apt=97", "apt=x"), "apt='x'"),
    ("fmtp for a payload type without rtpmap",
     lambda s: edit(s, r"^a=fmtp:98 ", "a=fmtp:9 "), "no a=rtpmap"),
    ("rtcp-fb without a type", lambda s: edit(s, r"^a=rtcp-fb:97 nack$", "a=rtcp-fb:97", 1),
     "a=rtcp-fb"),
    ("extmap id 0", lambda s: edit(s, r"^a=extmap:1 ", "a=extmap:0 "), "a=extmap"),
    ("ssrc over 32 bits", lambda s: edit(s, r"^a=ssrc:\d+ ", "a=ssrc:4294967296 ", 1),
     "32-bit ssrc"),
    ("ssrc-group garbled", lambda s: edit(s, r"^a=ssrc-group:FID .*$", "a=ssrc-group:FID x"),
     "a=ssrc-group"),
    ("no fingerprint", lambda s: edit(s, r"^a=fingerprint:.*\n", ""), "no DTLS fingerprint"),
    ("only a sha-1 fingerprint",
     lambda s: edit(edit(s, r"^a=fingerprint:sha-(384|512) .*\n", ""),
                    r"^a=fingerprint:sha-256 ", "a=fingerprint:sha-1 "),
     "no DTLS fingerprint this server can verify"),
    ("fingerprint of the wrong size",
     lambda s: edit(s, r"^(a=fingerprint:sha-256 [0-9A-F:]+):[0-9A-F]{2}$", r"\1"),
     "not 32 bytes"),
    ("fingerprint not hex", lambda s: edit(s, r"^a=fingerprint:sha-256 .*$",
                                           "a=fingerprint:sha-256 zz"), "<hash> <hex"),
    ("no setup", lambda s: edit(s, r"^a=setup:.*\n", ""), "no a=setup"),
    ("setup garbled", lambda s: edit(s, r"^a=setup:actpass$", "a=setup:holdconn"),
     "a=setup:holdconn"),
    ("no ice-ufrag", lambda s: edit(s, r"^a=ice-ufrag:.*\n", ""), "no a=ice-ufrag"),
    ("ice-pwd too long", lambda s: edit(s, r"^a=ice-pwd:.*$", "a=ice-pwd:" + "p" * 300),
     "a=ice-pwd is over"),
    # The ufrag is echoed in the answer's ETag: a control character there broke the response.
    ("ice-ufrag with a control character",
     lambda s: edit(s, r"^a=ice-ufrag:(.*)$", "a=ice-ufrag:\\1\x01x"), "ice-char"),
    ("ice-pwd with a space", lambda s: edit(s, r"^a=ice-pwd:(.*)$", r"a=ice-pwd:\1 x"), "ice-char"),
    ("not SDP at all", lambda s: "hello", "start with v=0"),
    ("empty", lambda s: "", "start with v=0"),
    ("version 1", lambda s: edit(s, r"^v=0$", "v=1"), "start with v=0"),
    ("BUNDLE names a missing mid", lambda s: edit(s, r"^a=group:BUNDLE 0 1 2$",
                                                  "a=group:BUNDLE 0 1 2 3"), "mid 3"),
    ("m-line removed, BUNDLE still names it", lambda s: edit(s, r"^m=audio .*\n", ""), "mid 0"),
    ("no m-line", lambda s: s.split("m=audio")[0], "no audio or video m-line"),
    ("a line that is not type=value", lambda s: s + "garbage\n", "is not <type>=<value>"),
    # aiortc's parser asserts on any other connection line (found by tests/fuzz).
    ("connection address with a space", lambda s: edit(s, r"^c=IN IP4 .*$", "c=IN IP4 1 2", 1),
     "is not c=IN IP4|IP6"),
    ("candidate cut short", lambda s: edit(s, r"^a=candidate:(\S+ \S+ \S+ \S+ \S+ \S+) .*$",
                                           r"a=candidate:\1", 1), "is not a=candidate"),
    ("candidate rport not a number",
     lambda s: edit(s, r"^(a=candidate:.* typ host)$", r"\1 raddr 0.0.0.0 rport x", 1),
     "is not a=candidate"),
    ("too many lines", lambda s: s + "a=x\n" * MAX_LINES, "lines; at most"),
    ("a line too long", lambda s: s + "a=x:" + "y" * MAX_LINE_CHARS + "\n", "is over"),
]


@pytest.mark.parametrize(("name", "mutate", "reason"), CASES, ids=[c[0] for c in CASES])
def test_malformed_offer_is_refused_with_its_reason(
    offers: dict[str, str], name: str, mutate: Callable[[str], str], reason: str
) -> None:
    assert reason in refused(mutate(offers["publish"]))


def test_the_line_limit_is_the_callers_setting(offers: dict[str, str]) -> None:
    offer = offers["publish"]
    lines = len(offer.splitlines())
    validate_offer(offer, max_lines=lines)
    with pytest.raises(BadInput) as info:
        validate_offer(offer, max_lines=lines - 1)
    assert f"at most {lines - 1} are accepted (setting max_sdp_lines)" in info.value.reason


async def test_garbled_direction_is_a_400_not_a_500(relay_factory: Any) -> None:
    """aiortc's createAnswer fails on a media section without a direction (``None is not in
    list``); the route must refuse the offer before that, for publishers and viewers alike."""
    relay: Relay = await relay_factory()
    for kind, direction in (("whip", "sendonly"), ("whep", "recvonly")):
        offer = await make_offer(direction)
        garbled = edit(offer, rf"^a={direction}$", f"a={direction}x")
        async with relay.http.post(f"{relay.base}/{kind}/cam", data=garbled, headers=SDP) as r:
            assert r.status == 400, await r.text()
            assert "direction" in (await r.json())["error"]
        assert relay.service.streams.get_or_create("cam").publisher is None


# --- properties: mutated real offers against the real relay ----------------------------------

JUNK_VALUES = st.sampled_from([
    "", " ", "x", "0", "-1", "128", "256", "65536", "4294967296", "1" * 30, "1e309", "nan",
    "sendrecv", "actpass", "sha-256", "\x00", "é", ":", "/", "96 opus", "*",
])


@st.composite
def mutated_offers(draw: st.DrawFn, base: str) -> str:
    lines = base.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "value", "swap", "insert"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "value":
            head, sep, _ = lines[i].partition(":" if lines[i].startswith("a=") else "=")
            lines[i] = head + (sep or "=") + draw(JUNK_VALUES)
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines.insert(i, draw(st.sampled_from([
                "a=inactive", "a=sendrecv", "a=mid:0", "m=text 9 RTP/AVP 0", "a=setup:passive",
                "m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "a=rtpmap:96 VP8/90000",
                "a=fmtp:96 apt=" + "9" * 30, "a=extmap:300 x", "a=ssrc-group:FID",
            ])))
        if not lines:
            lines = [""]
    return "\r\n".join(lines)


@given(data=st.data())
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(data=None)  # the known case: no direction on the audio m-line
async def test_no_mutated_offer_makes_the_relay_fail(
    relay: Relay, offers: dict[str, str], data: st.DataObject | None
) -> None:
    for kind in ("whip", "whep"):
        base = offers["publish" if kind == "whip" else "view"]
        if data is None:
            offer = edit(base, r"^a=(sendonly|recvonly)\n", "", 1)
        else:
            offer = data.draw(mutated_offers(base), label=kind)
        reason = None
        try:
            validate_offer(offer)
        except BadInput as exc:  # nothing else may escape the check
            reason = exc.reason
        async with relay.http.post(f"{relay.base}/{kind}/cam", data=offer, headers=SDP) as r:
            text = await r.text()
            assert r.status < 500, text
            event(f"{kind} answered {r.status}")
            if reason is not None:  # refused by the check: the route says why
                assert r.status == 400 and (await r.json()) == {"error": reason}
            elif r.status >= 400:
                assert (await r.json())["error"]
            else:
                async with relay.http.delete(relay.base + r.headers["Location"]) as gone:
                    assert gone.status == 200
