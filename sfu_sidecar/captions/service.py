"""The caption service: ingest, durable store, stream timeline, chunk cache and live events.

Stream timeline rule (documented for producers and the relay):

* A stream's **epoch** is house time (ns) of its first captured frame; stream time is seconds
  since it. The relay offers it with :meth:`CaptionService.fix_epoch` when media arrives.
* Before media arrives, the **first accepted caption batch fixes it**: for ``house_ns`` cues,
  the earliest cue start in that batch; for ``stream_s`` cues, "now" minus the earliest start
  (the producer is taken to be live). The relay's later offer then returns this epoch, and the
  relay uses it.
* Once fixed an epoch never moves (chunks already served would lie), and it is stored durably
  with the cues, so it survives restarts.
* A house-time cue that starts before the epoch but ends after it is shown from stream time 0;
  one that ends before the epoch is refused (422).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sfu_sidecar import logs
from sfu_sidecar.captions import chunks, webvtt
from sfu_sidecar.captions import words as cue_words
from sfu_sidecar.captions.events import (
    CaptionEvents,
    Cue,
    CueRetract,
    Epoch,
    LocalEvents,
)
from sfu_sidecar.captions.model import (
    GENERATED_ID_PREFIX,
    MAX_HOUSE_SKEW_NS,
    CueInput,
    IngestBatch,
    StoredCue,
    check_cue_id,
    check_lang,
    check_stream,
    normalize_settings,
)
from sfu_sidecar.captions.store import (
    Change,
    CueStore,
    EpochConflict,
    SqliteCueStore,
    WriteBatch,
)
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import BadInput, ConfigError, NotFound, Unprocessable
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.tasks import Tasks

log = logs.get("captions")

FROZEN_CACHE_CHUNKS = 8192  # ~4.5 h of 2 s chunks for one language, a few MB
LIVE_CACHE_CHUNKS = 1024
MAX_WINDOW_MS = 6 * 3600 * 1000
MAX_FEED_ITEMS = 1000
# How far ahead of now a barge-in may be dated: a producer's clock may be a little ahead.
INTERRUPT_AHEAD_MS = 5000
# Cue ids remembered per stream and language as touched by a barge-in (late revisions refused):
# a producer's revisions come within seconds, so the newest few thousand are plenty.
MAX_INTERRUPTED_IDS = 4096


@dataclass(frozen=True, slots=True)
class IngestResult:
    cue: StoredCue
    # "new", "updated", "unchanged", "stale" (interim after final: ignored), "interrupted"
    # (a revision of a cue a barge-in retracted or cut: ignored)
    result: str

    def to_json(self) -> dict[str, object]:
        out = self.cue.to_json()
        out["result"] = self.result
        return out


@dataclass(frozen=True, slots=True)
class Interruption:
    """What a barge-in did: the cues it retracted and the cues it cut short."""

    stream: str
    lang: str
    at_ms: int | None  # None: the stream had no caption yet
    retracted: tuple[str, ...]
    cut: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"stream": self.stream, "lang": self.lang,
                "at": None if self.at_ms is None else webvtt.seconds_from_ms(self.at_ms),
                "retracted": list(self.retracted), "cut": list(self.cut)}


@dataclass(frozen=True, slots=True)
class Served:
    body: bytes
    state: chunks.ChunkState
    epoch_ns: int


class CaptionService:
    """Component ``captions``: see the module docstring for the timeline rule."""

    name = "captions"

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        now_ns: Callable[[], int] = time.time_ns,
        *,
        store: CueStore | None = None,
        events: CaptionEvents | None = None,
    ) -> None:
        self.settings = settings
        self._now_ns = now_ns
        self.chunk_ms = round(settings.caption_chunk_s * 1000)
        self.retention_ms = round(settings.caption_retention_s * 1000)
        self._cue_results = metrics.counter(
            "caption_cues", "Caption cue writes by result", ("result",)
        )
        self._commits = metrics.counter("caption_store_commits", "Caption store transactions")
        self._committed_batches = metrics.counter(
            "caption_store_batches", "Caption write batches committed (batches/commits = "
            "group commit factor)"
        )
        self._chunk_requests = metrics.counter(
            "caption_chunk_requests", "Caption chunk requests by chunk state", ("state",)
        )
        self.store: CueStore = store or self._default_store(settings)
        self.events: CaptionEvents = events or LocalEvents()
        self._epochs: dict[str, int] = {}
        self._epochs_unsaved: dict[str, tuple[int, str]] = {}
        self._records: dict[str, dict[tuple[str, str], StoredCue]] = {}  # committed, tombstones too
        self._pending: dict[tuple[str, str, str], StoredCue] = {}  # written, not yet committed
        # Ids of cues a barge-in retracted or cut, per (stream, lang), the newest
        # MAX_INTERRUPTED_IDS: their revisions are not stored (see interrupt). In memory: a
        # restart forgets them.
        self._interrupted: dict[tuple[str, str], dict[str, None]] = {}
        self._tracks: dict[tuple[str, str], chunks.Track] = {}
        self._seq = 0
        self._live_cache: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._frozen: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._freezing: dict[tuple[str, str, int], asyncio.Future[bytes]] = {}
        self._loops = Tasks("captions", log)  # cancelled on stop
        self._writes = Tasks("captions", log)  # awaited on stop: each holds a durable write

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        snapshot = await self.store.open()
        for stream, (epoch, _source) in snapshot.epochs.items():
            self._epochs[stream] = epoch
        for cue in snapshot.cues:
            self._apply(cue, publish=False)
        self._seq = max(self._seq, snapshot.max_seq)
        self.store.follow(self._on_change)
        log.info(
            "caption store open: %d streams, %d cues", len(self._epochs), len(snapshot.cues)
        )
        self._loops.start("retention", self._retention_loop())

    async def stop(self) -> None:
        await self._loops.stop()
        await self._writes.drain()
        await self.store.close()

    def _default_store(self, settings: Settings) -> CueStore:
        if settings.redis_url is not None:
            # Imported only here: the redis package is an optional extra.
            try:
                from sfu_sidecar.captions.redis_store import RedisCueStore
            except ImportError as exc:
                raise ConfigError(
                    f"redis_url is set but the redis package is missing ({exc}); install "
                    "the extra: pip install 'sfu-sidecar[redis]'"
                ) from None

            return RedisCueStore(
                settings.redis_url,
                allow_unsafe_persistence=settings.redis_allow_unsafe_persistence,
                on_commit=self._count_commit,
            )
        return SqliteCueStore(settings.data_dir, on_commit=self._count_commit)

    def _count_commit(self, batches: int, _seconds: float) -> None:
        self._commits.inc()
        self._committed_batches.inc(batches)

    # --- epoch -----------------------------------------------------------------------------

    def epoch(self, stream: str) -> int | None:
        """The stream's epoch in house ns, or None before media or captions fixed it."""
        return self._epochs.get(stream)

    def fix_epoch(self, stream: str, house_ns: int) -> int:
        """Offer the first capture time of ``stream``; return the epoch in force.

        Called by the relay when the first frame arrives. The first offer (or the first caption
        batch, whichever comes first) wins; the epoch is persisted in the background and is
        durable no later than the first cue that depends on it.
        """
        existing = self._epochs.get(stream)
        if existing is not None:
            return existing
        self._set_epoch(stream, house_ns, "media")
        self._spawn(self._save_epochs())
        return house_ns

    def follow_epoch(self, stream: str, house_ns: int) -> None:
        """The epoch an upstream relay gave the stream (already on this node's clock): it wins
        over one this node fixed, so every node of a cascade shares one stream time. Moves
        smaller than a millisecond (a new clock join's estimate) are ignored."""
        existing = self._epochs.get(stream)
        if existing is not None and abs(existing - house_ns) < 1_000_000:
            return
        if existing is not None:
            log.warning("stream %s: epoch moved %+.3f s to the upstream's", stream,
                        (house_ns - existing) / 1e9)
        self._set_epoch(stream, house_ns, "upstream")
        self._spawn(self._save_epochs())

    async def mirror(self, event: Cue | CueRetract) -> None:
        """Store a cue or retraction an upstream relay pushed, as it stands there (same id,
        stream times relative to the shared epoch)."""
        if isinstance(event, CueRetract):
            with contextlib.suppress(NotFound):
                await self.retract(event.stream, event.lang, event.id)
            return
        start_ms, end_ms = round(event.start * 1000), round(event.end * 1000)
        if end_ms <= start_ms or self._epochs.get(event.stream) is None:
            return
        # The upstream checked the settings; parsing them again keeps what is stored here to what
        # this node would have stored from the same WebVTT.
        cue = CueInput(event.id, start_ms, end_ms, event.text, event.final,
                       normalize_settings(event.settings), event.fixed, event.shift_ms)
        await self.ingest(event.stream, IngestBatch(event.lang, "stream_s", (cue,)))

    async def _save_epochs(self) -> None:
        # An epoch another node stored first has been adopted by _write: nothing to report.
        with contextlib.suppress(EpochConflict):
            await self._write(WriteBatch())

    def _adopt_epoch(self, stream: str, epoch_ns: int) -> None:
        """The epoch a shared store holds wins over one this node fixed and did not store."""
        if self._epochs.get(stream) == epoch_ns:
            return
        self._epochs_unsaved.pop(stream, None)
        self._epochs[stream] = epoch_ns
        log.info("stream %s epoch %d (stored by another node)", stream, epoch_ns)
        self.events.publish(Epoch(stream, epoch_ns))

    def _on_change(self, change: Change) -> None:
        """Apply what another node committed to the shared store, and tell live listeners
        exactly as for a local write (the seq check drops what this node applied already)."""
        for stream, epoch_ns in change.epochs.items():
            self._adopt_epoch(stream, epoch_ns)
        for cue in sorted(change.cues, key=lambda c: c.seq):
            self._apply(cue, publish=True)

    def _set_epoch(self, stream: str, epoch_ns: int, source: str) -> None:
        self._epochs[stream] = epoch_ns
        self._epochs_unsaved[stream] = (epoch_ns, source)
        log.info("stream %s epoch %d (%s)", stream, epoch_ns, source)
        self.events.publish(Epoch(stream, epoch_ns))

    def stream_now_ms(self, stream: str) -> int:
        """Stream time now (ms since the epoch); NotFound before the epoch is fixed."""
        epoch = self._epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        return (self._now_ns() - epoch) // 1_000_000

    # --- writes ----------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the next write carries it
            self._writes.start("write", coro)

    async def _write(self, batch: WriteBatch) -> list[StoredCue]:
        # Every write carries the epochs not yet on disk: a cue is never durable without the
        # epoch its times are relative to.
        unsaved = dict(self._epochs_unsaved)
        batch.epochs.extend((s, e, src) for s, (e, src) in unsaved.items())
        try:
            stored = await self.store.write(batch)
        except EpochConflict as exc:
            self._adopt_epoch(exc.stream, exc.epoch_ns)
            raise
        for stream, value in unsaved.items():
            if self._epochs_unsaved.get(stream) == value:
                del self._epochs_unsaved[stream]
        return stored

    def _latest(self, stream: str, lang: str, cue_id: str) -> StoredCue | None:
        pending = self._pending.get((stream, lang, cue_id))
        if pending is not None:
            return pending
        return self._records.get(stream, {}).get((lang, cue_id))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def ingest(self, stream: str, batch: IngestBatch) -> list[IngestResult]:
        """Store a validated batch durably, then publish it. Idempotent per cue id."""
        try:
            return await self._ingest(stream, batch)
        except EpochConflict:
            # Another node sharing the store fixed this stream's epoch first; it is adopted
            # now, so the times are converted again against it (once: it never moves again).
            return await self._ingest(stream, batch)

    async def _ingest(self, stream: str, batch: IngestBatch) -> list[IngestResult]:
        check_stream(stream)
        now = self._now_ns()
        cues = batch.cues
        if batch.timebase == "house_ns":
            for i, cue in enumerate(cues):
                for what, t in (("start", cue.start), ("end", cue.end)):
                    if abs(t - now) > MAX_HOUSE_SKEW_NS:
                        raise Unprocessable(
                            f"cues[{i}].{what} is {abs(t - now) / 1e9:.0f} s away from house "
                            "time now: wrong clock or unit?"
                        )
        if stream not in self._epochs:
            if batch.timebase == "house_ns":
                self._set_epoch(stream, min(c.start for c in cues), "first caption")
            else:
                first_ms = min(c.start for c in cues)
                self._set_epoch(stream, now - first_ms * 1_000_000, "first caption")
        epoch = self._epochs[stream]
        results: list[IngestResult] = []
        changes: list[StoredCue] = []
        generated: set[str] = set()
        changed_at: list[int] = []  # index in results of each change
        for i, cue in enumerate(cues):
            if batch.timebase == "house_ns":
                start_ms = (cue.start - epoch + 500_000) // 1_000_000
                end_ms = (cue.end - epoch + 500_000) // 1_000_000
                if end_ms <= 0:
                    raise Unprocessable(
                        f"cues[{i}] ends {-end_ms} ms before the stream epoch {epoch}"
                    )
                # A cue that began before the stream did (captions posted ahead of the first
                # frame, which then fixed the epoch) is shown from the stream's start.
                start_ms = max(0, start_ms)
                if end_ms <= start_ms:
                    raise Unprocessable(f"cues[{i}] is shorter than a millisecond")
            else:
                start_ms, end_ms = cue.start, cue.end
            text = cue.text
            if cue.words:
                text = self._tag_words(cue, batch.timebase, epoch, (start_ms, end_ms), i)
            cue_id = cue.id
            current = self._latest(stream, batch.lang, cue_id) if cue_id is not None else None
            if current is not None and cue_id in self._interrupted.get((stream, batch.lang), ()):
                results.append(IngestResult(current, "interrupted"))
                continue
            if cue_id is None:
                cue_id = f"{GENERATED_ID_PREFIX}{self._seq + 1}"
                generated.add(cue_id)
            stored = StoredCue(
                stream, batch.lang, cue_id, start_ms, end_ms, text, cue.final, 0,
                cue.settings, fixed=cue.fixed, shift_ms=cue.shift_ms,
            )
            if current is not None and not current.deleted:
                if current.final and not stored.final:
                    results.append(IngestResult(current, "stale"))
                    continue
                if current.same_content(stored):
                    results.append(IngestResult(current, "unchanged"))
                    continue
            stored = _with_seq(stored, self._next_seq())
            changes.append(stored)
            kind = "updated" if current is not None and not current.deleted else "new"
            changed_at.append(len(results))
            results.append(IngestResult(stored, kind))
        committed = await self._commit(changes, generated)
        # A shared store assigns the seqs (and generated ids) itself: answer what it stored.
        for i, done in zip(changed_at, committed, strict=True):
            results[i] = IngestResult(done, results[i].result)
        for r in results:
            self._cue_results.labels(r.result).inc()
        return results

    @staticmethod
    def _tag_words(cue: CueInput, timebase: str, epoch: int, interval: tuple[int, int],
                   i: int) -> str:
        """The cue's text with its words' timestamp tags, in stream time like its own."""
        if timebase == "house_ns":
            timed = [((t - epoch + 500_000) // 1_000_000, w) for t, w in cue.words]
        else:
            timed = list(cue.words)
        try:
            return cue_words.tag(cue.text, timed, *interval)
        except cue_words.WordTimingError as exc:
            raise Unprocessable(f"cues[{i}].{exc}") from None

    async def retract(self, stream: str, lang: str, cue_id: str) -> bool:
        """Retract a cue; True if it was live, False if already retracted."""
        check_stream(stream)
        check_lang(lang)
        check_cue_id(cue_id, generated_ok=True)
        current = self._latest(stream, lang, cue_id)
        if current is None:
            raise NotFound(f"no cue {cue_id!r} in {stream}/{lang}")
        if current.deleted:
            return False
        tomb = StoredCue(
            stream, lang, cue_id, current.start_ms, current.end_ms, "", current.final,
            self._next_seq(), "", True,
        )
        await self._commit([tomb])
        self._cue_results.labels("retracted").inc()
        return True

    async def interrupt(self, stream: str, lang: str, at: int, timebase: str) -> Interruption:
        """The speaker of ``stream`` in ``lang`` was cut off at ``at`` (house ns or stream ms,
        as ``timebase`` says; at most INTERRUPT_AHEAD_MS ahead of now): every
        cue starting then or later is retracted, a cue spanning it ends there with its words
        from then on dropped, in one durable write, published live. Revisions producers send
        afterwards of the cues it touched are not stored (a TTS pipeline's late final version
        of a cut sentence would bring the unsaid words back). Cues marked ``fixed`` (a chapter
        title, say) are not speech and stay. Calling it again changes nothing."""
        check_stream(stream)
        check_lang(lang)
        epoch = self._epochs.get(stream)
        if epoch is None:
            return Interruption(stream, lang, None, (), ())  # no caption yet: nothing said
        at_ms = (at - epoch + 500_000) // 1_000_000 if timebase == "house_ns" else at
        if at_ms < 0:
            raise Unprocessable(f"at is {-at_ms / 1000:g} s before the stream's epoch")
        ahead_ms = at_ms - (self._now_ns() - epoch) // 1_000_000
        if ahead_ms > INTERRUPT_AHEAD_MS:
            raise Unprocessable(
                f"at is {ahead_ms / 1000:.1f} s after now: a barge-in is sent when it happens "
                f"(at most {INTERRUPT_AHEAD_MS / 1000:g} s ahead, for clocks that differ)")
        touched = self._interrupted.setdefault((stream, lang), {})
        retracted: list[str] = []
        cut: list[str] = []
        changes: list[StoredCue] = []
        keys = {(lang_, cid) for lang_, cid in self._records.get(stream, {})}
        keys.update((k[1], k[2]) for k in self._pending if k[0] == stream)
        for lang_, cue_id in sorted(keys):
            cue = self._latest(stream, lang_, cue_id)
            if lang_ != lang or cue is None or cue.deleted or cue.fixed:
                continue
            text = cue_words.cut(cue.text, at_ms) if cue.start_ms < at_ms < cue.end_ms else ""
            if cue.start_ms >= at_ms or (cue.end_ms > at_ms and not text.strip()):
                changes.append(StoredCue(stream, lang, cue_id, cue.start_ms, cue.end_ms, "",
                                         cue.final, self._next_seq(), "", True))
                retracted.append(cue_id)
            elif cue.end_ms > at_ms:
                changes.append(dataclasses.replace(cue, end_ms=at_ms, text=text,
                                                   seq=self._next_seq()))
                cut.append(cue_id)
            else:
                continue
            touched.pop(cue_id, None)
            touched[cue_id] = None
            while len(touched) > MAX_INTERRUPTED_IDS:
                del touched[next(iter(touched))]
        await self._commit(changes)
        self._cue_results.labels("retracted").inc(len(retracted))
        self._cue_results.labels("cut").inc(len(cut))
        return Interruption(stream, lang, at_ms, tuple(retracted), tuple(cut))

    async def align(self, stream: str, lang: str, cue_id: str, author_start_ms: int,
                    shift_ms: int) -> StoredCue | None:
        """Move a cue by ``shift_ms`` (its duration kept) onto the voice it captions, durably and
        live like any revision, recording the shift; None when the cue changed since it was
        measured (its start is no longer ``author_start_ms``), is fixed, retracted or gone."""
        current = self._latest(stream, lang, cue_id)
        if (current is None or current.deleted or current.fixed or current.shift_ms
                or current.start_ms != author_start_ms or shift_ms == 0):
            return None
        start_ms = max(0, current.start_ms + shift_ms)
        shift_ms = start_ms - current.start_ms
        moved = dataclasses.replace(current, start_ms=start_ms, end_ms=current.end_ms + shift_ms,
                                    text=cue_words.shift(current.text, shift_ms),
                                    shift_ms=shift_ms, seq=self._next_seq())
        (stored,) = await self._commit([moved])
        self._cue_results.labels("aligned").inc()
        return stored

    async def _commit(
        self, changes: list[StoredCue], generated: set[str] | None = None
    ) -> list[StoredCue]:
        if not changes:
            return []
        for cue in changes:
            self._pending[(cue.stream, cue.lang, cue.id)] = cue
        try:
            stored = await self._write(
                WriteBatch(cues=list(changes), generated_ids=set(generated or ()))
            )
        finally:
            for cue in changes:
                key = (cue.stream, cue.lang, cue.id)
                if self._pending.get(key) is cue:
                    del self._pending[key]
        # Futures resolve in commit order and resume their tasks in that order, so changes are
        # applied in seq order; the seq check keeps that true even if they were not.
        for cue in stored:
            self._apply(cue, publish=True)
        return stored

    def _apply(self, cue: StoredCue, *, publish: bool) -> None:
        # Seqs a shared store assigned on other nodes move this node's counter too, so ids it
        # generates never repeat one of theirs.
        self._seq = max(self._seq, cue.seq)
        records = self._records.setdefault(cue.stream, {})
        old = records.get((cue.lang, cue.id))
        if old is not None and old.seq >= cue.seq:
            return
        records[(cue.lang, cue.id)] = cue
        track = self._tracks.setdefault((cue.stream, cue.lang), chunks.Track())
        track.put(cue)
        touched = set(chunks.chunks_touched(cue.start_ms, cue.end_ms, self.chunk_ms))
        if old is not None:
            touched.update(chunks.chunks_touched(old.start_ms, old.end_ms, self.chunk_ms))
        for n in touched:
            self._live_cache.pop((cue.stream, cue.lang, n), None)
        if not publish:
            return
        self.events.publish(cue.event())

    # --- reads -----------------------------------------------------------------------------

    def cues_between(self, stream: str, lang: str, start_ms: int, end_ms: int) -> list[StoredCue]:
        track = self._tracks.get((stream, lang))
        return [] if track is None else track.between(start_ms, end_ms)

    def snapshot(self, stream: str, start_s: float, end_s: float) -> list[Cue]:
        """Cue events for every cue of ``stream``, all languages, displayed in
        [start_s, end_s): what a viewer joining late needs before the live events."""
        start_ms, end_ms = round(start_s * 1000), round(end_s * 1000)
        out = []
        for (s, _lang), track in sorted(self._tracks.items()):
            if s == stream:
                for cue in track.between(start_ms, end_ms):
                    out.append(cue.cue_event())
        return out

    def languages(self, stream: str) -> list[str]:
        return sorted(lang for (s, lang), track in self._tracks.items() if s == stream)

    def changes(
        self, stream: str, since: int, lang: str | None = None, limit: int = MAX_FEED_ITEMS
    ) -> list[StoredCue]:
        """Committed cue writes (retractions included) with seq > since, in seq order."""
        records = self._records.get(stream, {})
        out = [c for c in records.values() if c.seq > since and (lang is None or c.lang == lang)]
        out.sort(key=lambda c: c.seq)
        return out[:limit]

    def _track_or_404(self, stream: str, lang: str) -> chunks.Track:
        track = self._tracks.get((stream, lang))
        if track is None:
            raise NotFound(f"no captions for stream {stream!r} in {lang!r}")
        return track

    def _first_chunk(self, now_ms: int) -> int:
        horizon = now_ms - self.retention_ms
        return max(0, horizon // self.chunk_ms)

    async def chunk(self, stream: str, lang: str, n: int) -> Served:
        epoch = self._epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        track = self._track_or_404(stream, lang)
        now_ms = (self._now_ns() - epoch) // 1_000_000
        state = chunks.chunk_state(n, self.chunk_ms, now_ms)
        self._chunk_requests.labels(state.value).inc()
        if state is chunks.ChunkState.FUTURE:
            wait_s = max(1, -(-(n * self.chunk_ms - now_ms) // 1000))
            raise NotFound(
                f"chunk {n} starts in the future", headers={"Retry-After": str(wait_s)}
            )
        if n < self._first_chunk(now_ms):
            raise NotFound(f"chunk {n} is older than the retention window")
        key = (stream, lang, n)
        if state is chunks.ChunkState.LIVE:
            body = self._live_cache.get(key)
            if body is None:
                body = chunks.render_chunk(track, n, self.chunk_ms, epoch)
                self._live_cache[key] = body
                if len(self._live_cache) > LIVE_CACHE_CHUNKS:
                    self._live_cache.popitem(last=False)
            return Served(body, state, epoch)
        body = self._frozen.get(key)
        if body is not None:
            self._frozen.move_to_end(key)
            return Served(body, state, epoch)
        return Served(await self._freeze(key, track, epoch), state, epoch)

    async def _freeze(self, key: tuple[str, str, int], track: chunks.Track, epoch: int) -> bytes:
        """A closed chunk's bytes: as stored when first served, else rendered and stored now.

        It is durable before it is served as immutable, so a restart serves the same bytes
        even if a late cue changed the chunk's interval afterwards.
        """
        inflight = self._freezing.get(key)
        if inflight is not None:
            return await asyncio.shield(inflight)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._freezing[key] = future
        try:
            stream, lang, n = key
            body = await self.store.frozen_chunk(stream, lang, n)
            if body is None:
                body = chunks.render_chunk(track, n, self.chunk_ms, epoch)
                await self._write(WriteBatch(chunks=[(stream, lang, n, body)]))
                # Stored only if absent: on a store shared with other nodes one of them may
                # have frozen this chunk first, and every node must serve the same bytes.
                body = await self.store.frozen_chunk(stream, lang, n) or body
            self._frozen[key] = body
            if len(self._frozen) > FROZEN_CACHE_CHUNKS:
                self._frozen.popitem(last=False)
            self._live_cache.pop(key, None)
            future.set_result(body)
            return body
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it, nobody logs "never retrieved"
            raise
        finally:
            del self._freezing[key]

    def window(self, stream: str, lang: str, start_ms: int, end_ms: int) -> bytes:
        epoch = self._epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        track = self._track_or_404(stream, lang)
        if not 0 <= start_ms < end_ms:
            raise BadInput("need 0 <= start < end (stream seconds)")
        if end_ms - start_ms > MAX_WINDOW_MS:
            raise BadInput(f"a window may span at most {MAX_WINDOW_MS // 3_600_000} hours")
        return chunks.render(track.between(start_ms, end_ms), start_ms, epoch)

    def playlist(self, stream: str, lang: str) -> tuple[str | None, int]:
        """(playlist text or None if no chunk closed yet, seconds until one closes)."""
        epoch = self._epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        self._track_or_404(stream, lang)
        now_ms = (self._now_ns() - epoch) // 1_000_000
        text = chunks.playlist(
            now_ms=now_ms, chunk_ms=self.chunk_ms, window=self.settings.caption_playlist_chunks,
            epoch_ns=epoch, first_n=self._first_chunk(now_ms),
        )
        wait_ms = self.chunk_ms + chunks.CLOSE_GRACE_MS - now_ms
        return text, max(1, -(-wait_ms // 1000))

    # --- retention -------------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        interval = min(60.0, self.settings.caption_retention_s / 10)
        while True:
            try:
                await self.purge_expired()
            except Exception:
                log.exception("caption retention pass failed")
            await asyncio.sleep(interval)

    async def purge_expired(self) -> int:
        """Drop cues (and frozen chunks) that ended before the retention window."""
        now = self._now_ns()
        purge = []
        for stream, epoch in self._epochs.items():
            horizon_ms = (now - epoch) // 1_000_000 - self.retention_ms
            if horizon_ms > 0:
                purge.append((stream, horizon_ms, horizon_ms // self.chunk_ms))
        if not purge:
            return 0
        await self._write(WriteBatch(purge=purge))
        dropped = 0
        for stream, horizon_ms, first_n in purge:
            records = self._records.get(stream, {})
            for key in [k for k, c in records.items() if c.end_ms < horizon_ms]:
                del records[key]
                dropped += 1
            for (s, _lang), track in self._tracks.items():
                if s == stream:
                    track.purge_before(horizon_ms)
            for cache in (self._frozen, self._live_cache):
                for key3 in [k for k in cache if k[0] == stream and k[2] < first_n]:
                    del cache[key3]
        if dropped:
            log.info("retention: dropped %d cues", dropped)
        return dropped


def _with_seq(cue: StoredCue, seq: int) -> StoredCue:
    return dataclasses.replace(cue, seq=seq)
