"""A GStreamer ``webrtcbin`` WHIP publisher: VP8 + Opus test sources, RTCP sender reports, no
abs-capture-time and no clock join, like most real publishers (OBS, encoders, GStreamer apps).

Run with the system Python, where the ``gi`` bindings live:
``/usr/bin/python3 tests/interop/gst_publisher.py WHIP_URL SECONDS``. It prints one JSON line
``{"status": 201, "location": ...}`` once the answer is applied, publishes for SECONDS, sends
the WHIP DELETE and exits 0.

Two facts of GStreamer 1.22 shape it: libnice ignores ``lo``, so 127.0.0.1 is added to its agent
by hand; and its DTLS certificate is RSA while aiortc's DTLS client offers only ECDSA suites, so
the offer says ``a=setup:active`` and the service takes the DTLS server role.
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("Nice", "0.1")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC, Nice  # noqa: E402

PIPELINE = (
    "webrtcbin name=send bundle-policy=max-bundle "
    "videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=30/1 "
    "! vp8enc deadline=1 target-bitrate=600000 ! rtpvp8pay pt=96 "
    "! application/x-rtp,media=video,encoding-name=VP8,payload=96 ! send. "
    "audiotestsrc is-live=true wave=sine ! audioconvert ! audioresample ! opusenc "
    "! rtpopuspay pt=111 ! application/x-rtp,media=audio,encoding-name=OPUS,payload=111 ! send."
)


def main() -> int:
    url, seconds = sys.argv[1], float(sys.argv[2])
    Gst.init(None)
    loop = GLib.MainLoop()
    pipe = Gst.parse_launch(PIPELINE)
    webrtc = pipe.get_by_name("send")
    keep: dict[str, object] = {}
    result: dict[str, object] = {}

    def on_ice_agent(_bin: object, agent: object) -> None:
        keep["agent"] = agent  # PyGObject would free it otherwise, and GStreamer would crash
        address = Nice.Address.new()
        address.set_from_string("127.0.0.1")
        agent.get_property("agent").add_local_address(address)  # type: ignore[attr-defined]

    ice = webrtc.get_property("ice-agent")
    if ice is not None:
        on_ice_agent(webrtc, ice)

    def post_offer() -> None:
        sdp = webrtc.get_property("local-description").sdp.as_text()
        sdp = sdp.replace("a=setup:actpass", "a=setup:active")
        req = urllib.request.Request(url, data=sdp.encode(), method="POST",
                                     headers={"Content-Type": "application/sdp"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = resp.read().decode()
            result["status"] = resp.status
            result["location"] = resp.headers.get("Location")
        _ok, msg = GstSdp.SDPMessage.new_from_text(answer)
        desc = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, msg)
        webrtc.emit("set-remote-description", desc, None)
        print(json.dumps(result), flush=True)
        GLib.timeout_add(int(seconds * 1000), finish)

    def finish() -> bool:
        loc = result.get("location")
        if isinstance(loc, str):
            base = url.split("/whip/")[0]
            with contextlib.suppress(OSError):
                urllib.request.urlopen(urllib.request.Request(
                    base + loc if loc.startswith("/") else loc, method="DELETE"), timeout=5)
        loop.quit()
        return False

    def on_gathering(*_: object) -> None:
        complete = GstWebRTC.WebRTCICEGatheringState.COMPLETE
        if webrtc.get_property("ice-gathering-state") == complete and not keep.get("posted"):
            keep["posted"] = True
            # The POST blocks: make it from the main loop, not from a streaming thread.
            GLib.idle_add(post_offer)

    def on_offer(promise: Gst.Promise, *_: object) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        if offer is None:
            return  # negotiation-needed fires before every pad is linked; a later one offers
        webrtc.emit("set-local-description", offer, None)

    def on_negotiation_needed(*_: object) -> None:
        promise = Gst.Promise.new_with_change_func(on_offer)
        webrtc.emit("create-offer", None, promise)

    webrtc.connect("on-negotiation-needed", on_negotiation_needed)
    webrtc.connect("notify::ice-gathering-state", on_gathering)
    pipe.set_state(Gst.State.PLAYING)
    GLib.timeout_add(int((seconds + 30) * 1000), lambda: (loop.quit(), False)[1])
    try:
        loop.run()
    finally:
        pipe.set_state(Gst.State.NULL)
    return 0 if result.get("status") == 201 else 1


if __name__ == "__main__":
    sys.exit(main())
