"""Speech on the house clock, per stream, and how far each caption is from the voice it captions.

A relay observer (after the sync component, which maps every packet to its capture time): each
publisher audio packet's payload is queued with the capture time of its first sample, untouched
(the forwarded copies are the relay's, never changed here). Every ``tick_s`` the queue is
decoded (Opus, :mod:`sfu_sidecar.speech.decode`), run through the voice activity detector
(:mod:`sfu_sidecar.speech.detector`) and the closed speech segments go to the stream's caption
lag meter (:mod:`sfu_sidecar.speech.lag`) and its segment window. Final cues arrive as caption
events (every node publishes the ones it stores or relays), are placed on the house clock with
the stream's epoch and matched once the audio around them has been heard.

Decoding and detection run on the event loop between packets, in batches: a few hundred
microseconds per stream per tick (bench/speech_cost.py), far from the forwarding path.

Works for every publisher kind (WHIP, an RTP tap, a cascade edge's upstream): all reach the
relay as a publisher. A stream with no captions still gets its speech timeline.

A dub is a stream declared to follow a source stream (``PUT /api/streams/{dub}/dub`` with
``{"source": NAME}``, publish token): the dub's speech is matched utterance by utterance to the
source's (:mod:`sfu_sidecar.speech.dub`) and its lag reported with the dub's status.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sfu_sidecar import logs
from sfu_sidecar.captions.events import Cue, CueRetract, SubscriptionLost
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.config import Settings
from sfu_sidecar.relay.hooks import PacketInfo, PublisherHandle, RelayObserver, RelayView
from sfu_sidecar.speech.decode import OpusDecoder
from sfu_sidecar.speech.detector import SpeechDetector
from sfu_sidecar.speech.dub import DubLagMeter, DubReport
from sfu_sidecar.speech.lag import CaptionLagMeter, CueLag, LagReport, Outcome
from sfu_sidecar.speech.segments import SpeechSegment
from sfu_sidecar.speech.vad import make_vad
from sfu_sidecar.syncchannel.service import SyncService
from sfu_sidecar.tasks import Tasks

log = logs.get("speech")

TICK_S = 0.2
# Packets waiting for a tick, per track: 5 s of 20 ms packets; a loop starved longer than that
# loses the oldest audio (counted), not memory.
MAX_PENDING = 250
SEGMENTS_KEPT = 200
# Capture times that jump by less than this between packets continue the audio: a lost packet
# (20 ms) or a new sender report moving the capture-time mapping by a few tens of milliseconds
# is no pause in the speech; longer (DTX, a publisher that stopped) ends the speech heard.
GAP_MS = 60.0
S = 1_000_000_000

ALIGN_MODES = ("off", "report", "snap")
MAX_ALIGN_MODES = 10_000  # per-stream overrides kept (each is a few bytes)

# Why a stream has no speech figures (the ``state`` of its status).
LISTENING = "listening"
NO_AUDIO = "no audio"
NOT_MAPPED = "waiting for capture times"
ENDED = "publisher ended"


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


@dataclass
class _Track:
    """One publisher audio track (one SSRC) being listened to."""

    ssrc: int
    decoder: OpusDecoder
    detector: SpeechDetector
    pending: deque[tuple[bytes, int]] = field(default_factory=lambda: deque(maxlen=MAX_PENDING))
    last_seq: int | None = None
    packets: int = 0
    late: int = 0  # older than a packet already decoded: too late to place in the audio
    overflowed: int = 0
    unmapped: int = 0  # no capture time yet (the sync component had not mapped the track)


@dataclass
class StreamSpeech:
    """A stream's speech timeline and caption lag."""

    name: str
    meter: CaptionLagMeter = field(default_factory=CaptionLagMeter)
    segments: deque[SpeechSegment] = field(default_factory=lambda: deque(maxlen=SEGMENTS_KEPT))
    track: _Track | None = None
    state: str = NO_AUDIO
    reason: str = ""
    estimated: bool = False  # capture times mapped from arrival, not from the publisher's clock
    decoded_packets: int = 0
    refused_packets: int = 0
    segments_heard: int = 0
    snapped: int = 0  # cues moved onto the voice (caption_align snap)
    not_snapped: int = 0  # matched within reach but left: fixed, or changed since
    cues_before_epoch: int = 0


@dataclass
class DubFollow:
    """A dub stream following its source stream."""

    source: str
    meter: DubLagMeter = field(default_factory=DubLagMeter)


class SpeechService(RelayObserver):
    """Component: speech onsets per stream and the caption lag meter."""

    name = "speech"

    def __init__(
        self,
        settings: Settings,
        relay: RelayView,
        sync: SyncService,
        captions: CaptionService | None,
        *,
        now_ns: Callable[[], int],
        vad_factory: Callable[[int], Any] = make_vad,
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.sync = sync
        self.captions = captions
        self.dubs: dict[str, DubFollow] = {}  # by dub stream
        self.align_modes: dict[str, str] = {}  # per-stream caption_align, over the setting
        self.now_ns = now_ns
        self.vad_factory = vad_factory
        self.streams: dict[str, StreamSpeech] = {}
        # Seconds between decoding batches; None leaves ticking to the owner (tests, benchmarks).
        self.tick_s: float | None = TICK_S
        self._tasks = Tasks("speech", log)

    # --- component --------------------------------------------------------------------------

    async def start(self) -> None:
        self.relay.add_observer(self)
        if self.tick_s is not None:
            self._tasks.start("tick", self._tick_loop(self.tick_s))
        if self.captions is not None:
            self._tasks.start("cues", self._cue_loop(self.captions))

    async def stop(self) -> None:
        await self._tasks.stop()

    # --- relay hooks (per packet: a lookup and an append) ------------------------------------

    def stream(self, name: str) -> StreamSpeech:
        ss = self.streams.get(name)
        if ss is None:
            ss = self.streams[name] = StreamSpeech(name)
        return ss

    def publisher_packet(
        self, stream: str, publisher_id: str, packet: PacketInfo
    ) -> Mapping[str, bytes] | None:
        if packet.kind != "audio":
            return None
        ss = self.streams.get(stream) or self.stream(stream)
        track = ss.track
        if track is None or track.ssrc != packet.ssrc:
            track = self._new_track(ss, packet)
            if track is None:
                return None
        capture = self.sync.capture_time(stream, packet)
        if capture is None:
            track.unmapped += 1
            return None
        seq = packet.sequence_number
        if track.last_seq is not None and (
                seq == track.last_seq or (seq - track.last_seq) & 0xFFFF >= 0x8000):
            # A repeat, or reordered behind what is queued: its audio's place is taken.
            track.late += 1
            return None
        track.last_seq = seq
        ss.estimated = capture.estimated
        if len(track.pending) == MAX_PENDING:
            track.overflowed += 1
        track.pending.append((packet.payload, capture.capture_ns))
        track.packets += 1
        return None

    def _new_track(self, ss: StreamSpeech, packet: PacketInfo) -> _Track | None:
        """A new audio SSRC (a publisher came, or came back): a fresh decoder and detector."""
        if ss.track is not None:
            self._end_track(ss)
        relayed = self.relay.stream(ss.name)
        name = (relayed.codec("audio") if relayed is not None else None) or ""
        if name != "opus":
            if ss.reason != f"audio codec {name or 'unknown'} is not decoded":
                log.warning("stream %s: audio codec %s not decoded: no speech figures",
                            ss.name, name or "unknown")
            ss.state = NO_AUDIO
            ss.reason = f"audio codec {name or 'unknown'} is not decoded"
            ss.track = None
            return None
        decoder = OpusDecoder()
        rate = decoder.sample_rate
        detector = SpeechDetector(rate, self.vad_factory(rate), gap_ms=GAP_MS)
        ss.track = _Track(packet.ssrc, decoder, detector)
        ss.state, ss.reason = NOT_MAPPED, ""
        return ss.track

    def _end_track(self, ss: StreamSpeech) -> None:
        track = ss.track
        if track is None:
            return
        self._drain(ss, track)
        self._closed(ss, track.detector.end())
        ss.track = None

    def publisher_closed(self, publisher: PublisherHandle) -> None:
        ss = self.streams.get(publisher.stream_name)
        if ss is None:
            return
        self._end_track(ss)
        ss.state, ss.reason = ENDED, ""
        heard = max((s.offset_ns for s in ss.segments), default=None)
        if heard is not None:
            self._settled(ss, ss.meter.settle(heard + ss.meter.match_window_ns, final=True))

    # --- periodic ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Decode and listen to everything queued; settle the cues the audio now decides."""
        relayed = set(self.relay.stream_names())
        for name, ss in list(self.streams.items()):
            track = ss.track
            if track is not None:
                self._drain(ss, track)
            elif name not in relayed and ss.state == ENDED:
                del self.streams[name]  # the stream ended: its figures went with it
        for dub, follow in self.dubs.items():
            self._settle_dub(dub, follow)

    def _settle_dub(self, dub: str, follow: DubFollow) -> None:
        """Match the dub's utterances both streams have been heard past."""
        heard = [self._heard(dub), self._heard(follow.source)]
        if None in heard:
            return
        source = self.streams[follow.source].track
        open_onset = source.detector.open_onset_ns if source is not None else None
        follow.meter.settle(min(h for h in heard if h is not None),
                            source_open_onset_ns=open_onset)

    def _heard(self, name: str) -> int | None:
        ss = self.streams.get(name)
        track = ss.track if ss is not None else None
        return track.detector.heard_until_ns if track is not None else None

    def _drain(self, ss: StreamSpeech, track: _Track) -> None:
        detector = track.detector
        while track.pending:
            payload, capture_ns = track.pending.popleft()
            pcm = track.decoder.decode(payload)
            if pcm is None:
                ss.refused_packets += 1
                continue
            ss.decoded_packets += 1
            if len(pcm):
                # The decoded samples trail the packet's capture time by the encoder's lookahead.
                self._closed(ss, detector.push(pcm, capture_ns - track.decoder.delay_ns))
        if detector.heard_until_ns is not None:
            ss.state, ss.reason = LISTENING, ""
            self._settled(ss, ss.meter.settle(detector.heard_until_ns,
                                              open_onset_ns=detector.open_onset_ns))
        elif ss.refused_packets:
            ss.state = NO_AUDIO
            ss.reason = (f"the Opus decoder refused all {ss.refused_packets} audio payloads so "
                         "far")

    def align_mode(self, stream: str) -> str:
        return self.align_modes.get(stream, self.settings.caption_align)

    def _settled(self, ss: StreamSpeech, lags: list[CueLag]) -> None:
        """In snap mode, move each cue matched within reach onto its speech onset."""
        if self.captions is None or self.align_mode(ss.name) != "snap":
            return
        epoch = self.captions.epoch(ss.name)
        reach_ns = self.settings.caption_align_max_ms * 1_000_000
        for lag in lags:
            if (epoch is None or lag.outcome is not Outcome.MATCHED or lag.lag_ns is None
                    or abs(lag.lag_ns) > reach_ns):
                continue
            shift_ms = -round(lag.lag_ns / 1_000_000)
            if shift_ms:
                author_start_ms = round((lag.cue_start_ns - epoch) / 1_000_000)
                self._tasks.start(f"align-{ss.name}", self._snap(
                    ss, lag.language, lag.cue_id, author_start_ms, shift_ms))

    async def _snap(self, ss: StreamSpeech, lang: str, cue_id: str, author_start_ms: int,
                    shift_ms: int) -> None:
        assert self.captions is not None
        moved = await self.captions.align(ss.name, lang, cue_id, author_start_ms, shift_ms)
        if moved is None:
            ss.not_snapped += 1
        else:
            ss.snapped += 1

    def _closed(self, ss: StreamSpeech, segments: list[SpeechSegment]) -> None:
        for segment in segments:
            ss.segments_heard += 1
            ss.segments.append(segment)
            ss.meter.add_speech(segment)
            follow = self.dubs.get(ss.name)
            if follow is not None:
                follow.meter.add_dub(segment)
            for other in self.dubs.values():
                if other.source == ss.name:
                    other.meter.add_source(segment)

    async def _tick_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.tick()
            except Exception:
                log.exception("speech tick failed")

    # --- captions ---------------------------------------------------------------------------

    def on_caption_event(self, event: object) -> None:
        """A caption event: final cues are measured, retracted ones forgotten."""
        if isinstance(event, Cue):
            if not event.final or self.align_mode(event.stream) == "off":
                return  # an interim hypothesis: its final form is what gets measured
            if event.shift_ms:
                return  # moved onto the voice here: the lag measured is its author's
            assert self.captions is not None
            epoch = self.captions.epoch(event.stream)
            ss = self.stream(event.stream)
            if epoch is None:
                ss.cues_before_epoch += 1
                return
            ss.meter.add_cue(event.id, event.lang, epoch + round(event.start * S),
                             epoch + round(event.end * S))
        elif isinstance(event, CueRetract):
            ss_or_none = self.streams.get(event.stream)
            if ss_or_none is not None:
                ss_or_none.meter.remove_cue(event.id, event.lang)

    async def _cue_loop(self, captions: CaptionService) -> None:
        while True:
            subscription = captions.events.subscribe()
            try:
                async for event in subscription:
                    self.on_caption_event(event)
            except SubscriptionLost:
                log.warning("caption events came faster than the lag meter read them: "
                            "some cues are not measured")
            finally:
                subscription.close()

    # --- views ------------------------------------------------------------------------------

    def reports(self, name: str) -> dict[str, LagReport]:
        ss = self.streams.get(name)
        if ss is None:
            return {}
        return {lang: ss.meter.report(lang) for lang in ss.meter.languages()}

    def dub_report(self, name: str) -> tuple[str, DubReport] | None:
        """(source, report) of a dub stream; None for a stream that is no dub."""
        follow = self.dubs.get(name)
        return None if follow is None else (follow.source, follow.meter.report())

    def status(self, name: str, *, segments: int = 20) -> dict[str, Any] | None:
        """The stream's speech timeline and caption lag, for ``/api/streams/{stream}/sync``."""
        ss = self.streams.get(name)
        if ss is None:
            return None
        track = ss.track
        detector = track.detector if track is not None else None
        return {
            "speech": {
                "state": ss.state,
                "reason": ss.reason,
                "estimated": ss.estimated,
                "open_onset_ns": detector.open_onset_ns if detector is not None else None,
                "heard_until_ns": detector.heard_until_ns if detector is not None else None,
                "segments": [[s.onset_ns, s.offset_ns] for s in list(ss.segments)[-segments:]],
                "segments_heard": ss.segments_heard,
                "decoded_packets": ss.decoded_packets,
                "refused_packets": ss.refused_packets,
                "late_packets": track.late if track is not None else 0,
                "dropped_packets": track.overflowed if track is not None else 0,
            },
            "caption_lag": {lang: report_dict(r) for lang, r in self.reports(name).items()},
            "dub": self.dub_status(name),
            "caption_align": {"mode": self.align_mode(name), "snapped": ss.snapped,
                              "not_snapped": ss.not_snapped,
                              "max_ms": self.settings.caption_align_max_ms},
            "cues_before_epoch": ss.cues_before_epoch,
        }

    def dub_status(self, name: str) -> dict[str, Any] | None:
        dub = self.dub_report(name)
        if dub is None:
            return None
        source, r = dub
        return {"source": source, "matched": r.matched, "unmatched_dub": r.unmatched_dub,
                "unmatched_source": r.unmatched_source, "inside_source": r.inside_source,
                "median_ms": r.median_ms, "p95_ms": r.p95_ms,
                "recent_median_ms": r.recent_median_ms,
                "drift_ms_per_min": r.drift_ms_per_min,
                "lags": [[t, round(ms, 3)] for t, ms in r.lags[-50:]]}

def report_dict(report: LagReport, *, lags: int = 50) -> dict[str, Any]:
    """A lag report as JSON: figures in ms, the last ``lags`` per-cue lags for a plot."""
    return {
        "matched": report.matched,
        "unmatched_cues": report.unmatched_cues,
        "unmatched_speech": report.unmatched_speech,
        "inside_speech": report.inside_speech,
        "median_ms": report.median_ms,
        "p95_ms": report.p95_ms,
        "recent_median_ms": report.recent_median_ms,
        "drift_ms_per_min": report.drift_ms_per_min,
        "lags": [[t, round(ms, 3)] for t, ms in report.lags[-lags:]],
    }
