"""The publisher page (/publish) in headless Chromium, judged by what the service receives.

The probe (publish_probe.py) runs the whole service with a publish token and drives the page
with Chromium's fake camera and microphone: a start with a wrong token, then one publication
per video codec (VP8, VP9, H.264) watched by a WHEP viewer and read from the live segments, a
caption sent from the page's
box, and Stop; a start with no token; then the broadcaster's controls on a 390 px wide page:
device selects and the level meter, a microphone switched and a bitrate ceiling set while live,
a network drop (UDP blackholed in the probe's namespace) and the relay ending the session, each
followed by the page publishing again on the same stream. Everything asserted here was read from
the service (its status routes, the caption feed and chunks, the relay's record of how sessions
ended) or from the viewer, or is what the page shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns]

# The probe waits for the machine-wide browser lock, which other users may hold for a while.
PROBE_TIMEOUT_S = 240
CODECS = {"vp8": "video/VP8", "vp9": "video/VP9", "h264": "video/H264"}
CONTAINERS = {"vp8": "webm", "vp9": "webm", "h264": "mp4"}
# The store keeps cue times in whole milliseconds of stream time.
STORE_ROUNDING_NS = 500_000


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    # Only ``lo`` inside: Chromium can pair nothing but loopback candidates with the relay.
    return probes.run_probe("tests.e2e.publish_probe", timeout=PROBE_TIMEOUT_S)


def test_a_wrong_token_shows_the_services_401_reason_and_publishes_nothing(
    probe: dict[str, Any],
) -> None:
    seen = probe["wrong_token"]
    page = seen["page"]
    assert page["state"] == "failed", page
    assert page["status_text"] == "publish token refused (401: wrong token for publishing)", page
    assert page["error"] == page["status_text"]
    assert page["state_text"] == "not published"
    assert seen["stream_status"] == 404, seen
    assert seen["streams"] == {"streams": []}, seen


@pytest.mark.parametrize("codec", list(CODECS))
def test_the_page_publishes_video_and_audio_with_the_chosen_codec(
    probe: dict[str, Any], codec: str
) -> None:
    run = probe[codec]
    assert run["page_connected"]["connection"] == "connected", run["page_connected"]
    live = run["stream_live"]
    assert live["publisher"]["state"] == "connected", live
    sent = {t["kind"]: t for t in live["publisher"]["tracks"]}
    assert sent["video"]["codec"] == codec and sent["audio"]["codec"] == "opus", sent
    assert live["tracks"]["video"]["codec"] == codec
    assert live["tracks"]["video"]["packets"] >= 50 and live["tracks"]["audio"]["packets"] >= 50
    assert live["tracks"]["video"]["keyframes"] >= 1, live

    # A real viewer decoded what the relay forwarded, in the publisher's codec.
    viewer = run["viewer"]
    assert viewer["video_codec"] == codec and viewer["audio_codec"] == "opus", viewer
    assert viewer["video_frames"] == 30 and (viewer["width"], viewer["height"]) == (640, 360)
    assert viewer["audio_frames"] == 25 and viewer["audio_rate"] == 48000
    assert viewer["video_packets"] > 0 and viewer["audio_packets"] > 0, viewer
    relayed = run["stream_viewed"]["viewers"][0]["tracks"]
    assert all(t["packets_sent"] > 0 for t in relayed), relayed

    # The live segments carry the publisher's frames without transcoding: FFmpeg decodes the
    # first one, in the publisher's codec and size.
    segment = run["segment"]
    assert segment["container"] == CONTAINERS[codec] and segment["codecs"][0].startswith(
        "avc1" if codec == "h264" else codec), segment
    assert segment["codec"] == codec, segment
    assert segment["frames"] >= 15 and segment["size"] == [640, 360], segment

    # The page reports what it sends: the codec and a bitrate from outbound-rtp bytesSent.
    page = run["page_publishing"]
    assert page["codecs"] == {"video": CODECS[codec], "audio": "audio/opus"}, page
    assert page["bitrate"]["video"] > 10_000 and page["bitrate"]["audio"] > 5_000, page
    assert run["page_bitrate_text"].endswith("bit/s"), run["page_bitrate_text"]

    # Chromium stamps what the page sends; the relay maps capture times from the stamps, with
    # the browser's clock offset estimated (the page reports none on its media connection).
    assert page["stampsCaptureTime"] is True, page
    for kind in ("audio", "video"):
        assert run["sync"][kind]["source"] == "abs_capture_time", run["sync"]
        assert run["sync"][kind]["estimated"] is True, run["sync"]


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_caption_from_the_box_starts_at_the_house_time_it_was_sent(
    probe: dict[str, Any], codec: str
) -> None:
    caption = probe[codec]["caption"]
    reply = caption["page"]["lastReply"]
    assert reply["status"] == 200, reply
    assert caption["reply_text"].startswith("ok: cue page-"), caption["reply_text"]
    feed = caption["feed"]
    cues = [c for c in feed["cues"] if c["text"] == caption["text"]]
    assert len(cues) == 1, feed
    cue = cues[0]
    assert cue["end"] - cue["start"] == pytest.approx(2.0, abs=1e-9)  # the default duration
    stored_ns = feed["epoch_ns"] + round(cue["start"] * 1000) * 1_000_000
    page_ns = int(caption["page"]["lastCue"]["startNs"])
    assert abs(stored_ns - page_ns) <= STORE_ROUNDING_NS, (stored_ns, page_ns)

    # The test read house time just before and after the click; the cue starts between the
    # two, give or take the page's own clock-join error and the store's rounding.
    clock = caption["page"]["clock"]
    tolerance = int(clock["errorNs"]) + STORE_ROUNDING_NS
    before, after = caption["before_ns"], caption["after_ns"]
    print(f"\n{codec}: click took {(after - before) / 1e6:.1f} ms; cue starts "
          f"{(stored_ns - before) / 1e6:.1f} ms after it began; page clock join "
          f"offset {int(clock['offsetNs']) / 1e6:.3f} ms ± {int(clock['errorNs']) / 1e6:.3f} ms")
    assert before - tolerance <= stored_ns <= after + tolerance, (before, stored_ns, after)
    assert after - before < 1_000_000_000, "the click took over a second: nothing was measured"

    status, vtt = caption["chunk"]
    assert status == 200
    assert cue["id"] in vtt and caption["text"] in vtt, vtt


@pytest.mark.parametrize("codec", list(CODECS))
def test_stop_deletes_the_whip_session(probe: dict[str, Any], codec: str) -> None:
    run = probe[codec]
    page = run["page_stopped"]
    assert page["state"] == "stopped" and page["deleteStatus"] == 200, page
    assert page["state_text"] == "not published"
    # The viewer keeps the stream listed; its publisher is gone, ended by the DELETE (not by
    # its transport closing, which the relay records as "disconnected").
    assert run["stream_stopped"]["publisher"] is None, run["stream_stopped"]
    assert run["stream_stopped"]["publishers_seen"] == 1
    assert run["ended"] == {"publisher:deleted": 1}, run["ended"]


def test_no_token_is_refused_in_words_and_not_retried(probe: dict[str, Any]) -> None:
    seen = probe["token_refused"]
    page = seen["page"]
    assert page["state"] == "failed" and page["sessions"] == 0 and page["reconnects"] == 0, page
    assert page["status_text"].startswith("publish token refused (401: "), page["status_text"]
    assert page["error"] == page["status_text"]
    # The status line is announced to screen readers.
    assert seen["status_role"] == ["status", "polite"]
    assert not any(s["stream"] == "page-no-token" for s in seen["streams"]["streams"]), seen


def test_device_selects_list_the_fake_devices_and_the_meter_follows_the_beep(
    probe: dict[str, Any],
) -> None:
    run = probe["broadcaster"]
    assert run["preview"]["state"] == "previewing" and run["preview"]["error"] is None
    # Named after permission was given: Chromium's fake camera and microphones.
    assert [c["label"] for c in run["cameras"]] == ["fake_device_0"], run["cameras"]
    assert len(run["microphones"]) >= 2, run["microphones"]
    assert all(m["label"].startswith("Fake") for m in run["microphones"]), run["microphones"]
    assert run["meter_label"] == "microphone level"
    # The fake microphone beeps once a second: the meter rises with it and falls back to
    # silence, before publishing and while live.
    for levels in (run["levels_before"], run["levels_live"]):
        assert max(levels) > 0.3 and min(levels) < 0.05, levels
    # Nothing wider than a 390 px phone screen, before and while publishing.
    assert all(w["scroll"] <= w["client"] == 390 for w in run["width"]), run["width"]


def test_another_microphone_goes_on_air_without_a_new_session(probe: dict[str, Any]) -> None:
    run = probe["broadcaster"]
    page = run["switched"]
    assert page["sentTrackIds"]["audio"] == page["trackIds"]["audio"], page
    assert page["trackIds"]["audio"] != run["preview"]["trackIds"]["audio"]
    assert page["sessions"] == 1 and page["state"] == "publishing", page
    # The relay saw no renegotiation: the same publisher session goes on.
    assert run["switched_live"]["publisher"]["id"] == run["live"]["publisher"]["id"]


def test_a_bitrate_ceiling_is_applied_while_live(probe: dict[str, Any]) -> None:
    run = probe["broadcaster"]
    print(f"\nvideo target {run['bitrate_before']['target']} bit/s, then "
          f"{run['bitrate_after']['target']} bit/s {run['bitrate_after']['applied_s']} s "
          "after a 250 kbit/s ceiling")
    assert run["bitrate_before"]["applied"] is None
    assert run["bitrate_before"]["target"] > 300_000, run["bitrate_before"]
    # On the sender's first encoding, and the encoder's target (getStats) under it.
    assert run["bitrate_encodings"] == 250_000
    assert run["bitrate_after"]["target"] <= 250_000, run["bitrate_after"]


def test_the_page_publishes_again_after_a_network_drop(probe: dict[str, Any]) -> None:
    run = probe["broadcaster"]
    after = run["after_drop"]
    page = after["page"]
    print(f"\ndrop noticed after {run['drop_noticed_s']} s; on air again "
          f"{run['drop_resumed_s']} s after the network came back")
    assert run["drop_resumed_s"] < 5, run["drop_resumed_s"]
    assert page["state"] == "publishing" and page["reconnects"] == 1, page
    assert page["lastDrop"].startswith(("disconnected", "the connection")), page["lastDrop"]
    # The same stream and the same tracks, in a new WHIP session; the old one was ended.
    assert page["sessions"] == 2 and page["sessionUrl"] != after["before"]["sessionUrl"]
    assert page["trackIds"] == after["before"]["trackIds"] == page["sentTrackIds"], page
    assert page["appliedMaxBitrate"] == 250_000, "the bitrate ceiling goes on with the stream"
    stream = after["stream"]
    assert stream["stream"] == run["stream"] and stream["publisher"]["state"] == "connected"
    assert stream["publisher"]["id"] != run["live"]["publisher"]["id"]


def test_the_page_publishes_again_when_the_relay_ends_its_session(
    probe: dict[str, Any],
) -> None:
    run = probe["broadcaster"]
    page = run["after_end"]["page"]
    print(f"\nsession ended by the relay; on air again after {run['end_resumed_s']} s")
    assert run["ended_status"] == 200
    assert run["end_resumed_s"] < 5, run["end_resumed_s"]
    assert page["lastDrop"] == "the relay ended the session", page
    assert page["state"] == "publishing" and page["sessions"] == 3, page
    assert run["after_end"]["stream"]["publisher"]["id"] != run["after_drop"]["stream"][
        "publisher"]["id"]
    stopped = run["stopped"]
    assert stopped["state"] == "stopped" and stopped["deleteStatus"] == 200, stopped
