"""Streams: one publisher slot, its viewers, and one forwarder per track kind.

A stream outlives its publisher: viewers stay attached to the forwarders, so a publisher that
drops and comes back continues the same tracks (sequence numbers and timestamps keep rising).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sfu_sidecar import logs
from sfu_sidecar.exceptions import Conflict, NotFound
from sfu_sidecar.relay.forwarder import TrackForwarder, ViewerOutput
from sfu_sidecar.relay.hooks import RequestKeyframe, TrackTraffic
from sfu_sidecar.relay.sdp import CodecInfo
from sfu_sidecar.relay.session import PublisherSource
from sfu_sidecar.relay.viewersink import ViewerSink

log = logs.get("relay.streams")


class Stream:
    def __init__(
        self, name: str, on_empty: Any = None,
        ended: Counter[tuple[str, str]] | None = None,
    ) -> None:
        self.name = name
        # Sessions ended, by (role, reason): shared by every stream (``Streams.ended``), since
        # a stream itself goes when its last session does.
        self.ended: Counter[tuple[str, str]] = ended if ended is not None else Counter()
        self.publisher: PublisherSource | None = None
        self.viewers: dict[str, ViewerSink] = {}
        self.forwarders: dict[str, TrackForwarder] = {}
        # The codec each kind is forwarded as: the last publisher's, else the first viewer's.
        self.codecs: dict[str, CodecInfo] = {}
        self.publishers_seen = 0
        self._on_empty = on_empty
        self._request_keyframe: RequestKeyframe | None = None  # the live publisher's

    def forwarder(self, kind: str, codec: CodecInfo) -> TrackForwarder:
        fw = self.forwarders.get(kind)
        if fw is None:
            fw = TrackForwarder(kind, codec.name, codec.clock_rate)
            self.forwarders[kind] = fw
            self.codecs.setdefault(kind, codec)
        elif fw.codec != codec.name:
            # A publisher with another codec: viewers negotiated for the old one cannot decode
            # it and the relay never transcodes, so they are detached (they stay connected).
            for output in list(fw.outputs):
                log.warning("viewer %s on %s: codec changed %s -> %s, detaching %s",
                            output.viewer_id[:8], self.name, fw.codec, codec.name, kind)
                fw.remove_output(output)
        return fw

    def claim_publisher(
        self, session: PublisherSource, request_keyframe: RequestKeyframe
    ) -> None:
        if self.publisher is not None and not self.publisher.closed.is_set():
            raise Conflict(f"stream {self.name} already has a publisher")
        self.publisher = session
        self._request_keyframe = request_keyframe
        self.publishers_seen += 1

    def publisher_closed(self, session: PublisherSource) -> None:
        self.ended["publisher", session.ended_reason or "unknown"] += 1
        if self.publisher is session:
            self.publisher = None
            self._request_keyframe = None
        self._maybe_empty()

    def viewer_added(self, session: ViewerSink) -> None:
        self.viewers[session.id] = session

    def viewer_connected(self, session: ViewerSink) -> None:
        for kind, output in session.outputs.items():
            fw = self.forwarders.get(kind)
            codec = self.codecs.get(kind)
            if fw is not None and (codec is None or fw.codec == codec.name):
                fw.add_output(output)

    def viewer_closed(self, session: ViewerSink) -> None:
        self.ended["viewer", session.ended_reason or "unknown"] += 1
        self.viewers.pop(session.id, None)
        for kind, output in session.outputs.items():
            fw = self.forwarders.get(kind)
            if fw is not None:
                fw.remove_output(output)
        self._maybe_empty()

    def keyframe_requested(self, output: ViewerOutput, now_ns: int) -> None:
        fw = self.forwarders.get(output.kind)
        if fw is None or output not in fw.outputs:
            return
        if fw.request_keyframe(now_ns, output) and self._request_keyframe is not None:
            self._request_keyframe(output.kind)

    def keyframe_wanted(self, kind: str, now_ns: int) -> bool:
        """A component other than a viewer needs a keyframe of ``kind``: asked of the publisher
        through the same per-track throttle as viewers' requests. True when one was sent."""
        fw = self.forwarders.get(kind)
        if fw is None or not fw.request_keyframe(now_ns) or self._request_keyframe is None:
            return False
        self._request_keyframe(kind)
        return True

    def _maybe_empty(self) -> None:
        if self.publisher is None and not self.viewers and self._on_empty is not None:
            self._on_empty(self)

    # --- StreamView (relay/hooks.py): what features read -------------------------------------

    @property
    def viewer_count(self) -> int:
        return len(self.viewers)

    def codec(self, kind: str) -> str | None:
        found = self.codecs.get(kind)
        return found.name.lower() if found is not None else None

    def traffic(self) -> dict[str, TrackTraffic]:
        nacked = {t.kind: t.nack.nacked for t in self.publisher.tracks
                  if t.nack is not None} if self.publisher is not None else {}
        return {
            kind: TrackTraffic(
                octets_in=fw.octets_in,
                octets_out=sum(o.octets_sent for o in fw.outputs),
                nacks_received=sum(o.nacks_received for o in fw.outputs),
                nacks_sent=nacked.get(kind, 0),
                keyframe_requests=sum(o.keyframe_requests for o in fw.outputs),
            )
            for kind, fw in self.forwarders.items()
        }

    def status(self) -> dict[str, Any]:
        return {
            "stream": self.name,
            "publisher": self.publisher.status() if self.publisher is not None else None,
            "publishers_seen": self.publishers_seen,
            "tracks": {
                kind: {
                    "codec": fw.codec,
                    "packets": fw.packets_in,
                    "keyframes": fw.keyframes_in,
                    "keyframe_requests_sent": fw.keyframe_requests_sent,
                    "viewers": len(fw.outputs),
                }
                for kind, fw in self.forwarders.items()
            },
            "viewers": [v.status() for v in self.viewers.values()],
        }


class Streams:
    """Every stream by name; a stream disappears when it has neither publisher nor viewers."""

    def __init__(self) -> None:
        self.by_name: dict[str, Stream] = {}
        self.ended: Counter[tuple[str, str]] = Counter()

    def get_or_create(self, name: str) -> Stream:
        stream = self.by_name.get(name)
        if stream is None:
            stream = Stream(name, on_empty=self._drop, ended=self.ended)
            self.by_name[name] = stream
        return stream

    def get(self, name: str) -> Stream:
        stream = self.by_name.get(name)
        if stream is None:
            raise NotFound(f"no stream {name}")
        return stream

    def _drop(self, stream: Stream) -> None:
        if self.by_name.get(stream.name) is stream:
            del self.by_name[stream.name]
