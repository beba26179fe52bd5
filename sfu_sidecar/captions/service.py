"""The caption service: ingest, durable store, stream timeline and live events (its files are
served by ``serving.py``).

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
from collections.abc import Callable, Coroutine
from typing import Any

from sfu_sidecar import logs
from sfu_sidecar.captions import bargein, chunks, timebase
from sfu_sidecar.captions import words as cue_words
from sfu_sidecar.captions.backends import store_for
from sfu_sidecar.captions.events import (
    CaptionEvents,
    Cue,
    CueRetract,
    Epoch,
    LocalEvents,
)
from sfu_sidecar.captions.model import (
    GENERATED_ID_PREFIX,
    CueInput,
    IngestBatch,
    IngestResult,
    Interruption,
    StoredCue,
    check_cue_id,
    check_lang,
    check_stream,
    normalize_settings,
)
from sfu_sidecar.captions.serving import ChunkServer
from sfu_sidecar.captions.store import (
    Change,
    CueStore,
    EpochConflict,
    WriteBatch,
)
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import NotFound
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.tasks import Tasks

log = logs.get("captions")

MAX_FEED_ITEMS = 1000
# Cue ids remembered per stream and language as touched by a barge-in (late revisions refused):
# a producer's revisions come within seconds, so the newest few thousand are plenty.
MAX_INTERRUPTED_IDS = 4096


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
        self.now_ns = now_ns
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
        self.chunk_requests = metrics.counter(
            "caption_chunk_requests", "Caption chunk requests by chunk state", ("state",)
        )
        self.store: CueStore = store or store_for(settings, self._count_commit)
        self.events: CaptionEvents = events or LocalEvents()
        self.epochs: dict[str, int] = {}
        self._epochs_unsaved: dict[str, tuple[int, str]] = {}
        self._records: dict[str, dict[tuple[str, str], StoredCue]] = {}  # committed, tombstones too
        self._pending: dict[tuple[str, str, str], StoredCue] = {}  # written, not yet committed
        # Ids of cues a barge-in retracted or cut, per (stream, lang), the newest
        # MAX_INTERRUPTED_IDS: their revisions are not stored (see interrupt). In memory: a
        # restart forgets them.
        self._interrupted: dict[tuple[str, str], dict[str, None]] = {}
        self.tracks: dict[tuple[str, str], chunks.Track] = {}
        self._seq = 0
        self.serving = ChunkServer(self)
        self._loops = Tasks("captions", log)  # cancelled on stop
        self._writes = Tasks("captions", log)  # awaited on stop: each holds a durable write

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        snapshot = await self.store.open()
        for stream, (epoch, _source) in snapshot.epochs.items():
            self.epochs[stream] = epoch
        for cue in snapshot.cues:
            self._apply(cue, publish=False)
        self._seq = max(self._seq, snapshot.max_seq)
        self.store.follow(self._on_change)
        log.info(
            "caption store open: %d streams, %d cues", len(self.epochs), len(snapshot.cues)
        )
        self._loops.start("retention", self._retention_loop())

    async def stop(self) -> None:
        await self._loops.stop()
        await self._writes.drain()
        await self.store.close()

    def _count_commit(self, batches: int, _seconds: float) -> None:
        self._commits.inc()
        self._committed_batches.inc(batches)

    # --- epoch -----------------------------------------------------------------------------

    def epoch(self, stream: str) -> int | None:
        """The stream's epoch in house ns, or None before media or captions fixed it."""
        return self.epochs.get(stream)

    def fix_epoch(self, stream: str, house_ns: int) -> int:
        """Offer the first capture time of ``stream``; return the epoch in force.

        Called by the relay when the first frame arrives. The first offer (or the first caption
        batch, whichever comes first) wins; the epoch is persisted in the background and is
        durable no later than the first cue that depends on it.
        """
        existing = self.epochs.get(stream)
        if existing is not None:
            return existing
        self._set_epoch(stream, house_ns, "media")
        self._spawn(self._save_epochs())
        return house_ns

    def follow_epoch(self, stream: str, house_ns: int) -> None:
        """The epoch an upstream relay gave the stream (already on this node's clock): it wins
        over one this node fixed, so every node of a cascade shares one stream time. Moves
        smaller than a millisecond (a new clock join's estimate) are ignored."""
        existing = self.epochs.get(stream)
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
        if end_ms <= start_ms or self.epochs.get(event.stream) is None:
            return
        # The upstream checked the settings; parsing them again keeps what is stored here to what
        # this node would have stored from the same WebVTT.
        cue = CueInput(event.id, start_ms, end_ms, event.text, event.final,
                       normalize_settings(event.settings), event.fixed, event.shift_ms)
        await self.ingest(event.stream, IngestBatch(event.lang, "stream_s", (cue,)))

    async def _save_epochs(self) -> None:
        # An epoch another node stored first has been adopted by _write: nothing to report.
        with contextlib.suppress(EpochConflict):
            await self.write(WriteBatch())

    def _adopt_epoch(self, stream: str, epoch_ns: int) -> None:
        """The epoch a shared store holds wins over one this node fixed and did not store."""
        if self.epochs.get(stream) == epoch_ns:
            return
        self._epochs_unsaved.pop(stream, None)
        self.epochs[stream] = epoch_ns
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
        self.epochs[stream] = epoch_ns
        self._epochs_unsaved[stream] = (epoch_ns, source)
        log.info("stream %s epoch %d (%s)", stream, epoch_ns, source)
        self.events.publish(Epoch(stream, epoch_ns))

    def stream_now_ms(self, stream: str) -> int:
        """Stream time now (ms since the epoch); NotFound before the epoch is fixed."""
        epoch = self.epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        return (self.now_ns() - epoch) // 1_000_000

    # --- writes ----------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the next write carries it
            self._writes.start("write", coro)

    async def write(self, batch: WriteBatch) -> list[StoredCue]:
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
        now = self.now_ns()
        cues = batch.cues
        if batch.timebase == "house_ns":
            timebase.check_house_times(cues, now)
        if stream not in self.epochs:
            if batch.timebase == "house_ns":
                self._set_epoch(stream, min(c.start for c in cues), "first caption")
            else:
                first_ms = min(c.start for c in cues)
                self._set_epoch(stream, now - first_ms * 1_000_000, "first caption")
        epoch = self.epochs[stream]
        results: list[IngestResult] = []
        changes: list[StoredCue] = []
        generated: set[str] = set()
        changed_at: list[int] = []  # index in results of each change
        for i, cue in enumerate(cues):
            start_ms, end_ms = timebase.stream_interval_ms(cue, batch.timebase, epoch, i)
            text = cue.text
            if cue.words:
                text = timebase.tag_words(cue, batch.timebase, epoch, (start_ms, end_ms), i)
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
        epoch = self.epochs.get(stream)
        if epoch is None:
            return Interruption(stream, lang, None, (), ())  # no caption yet: nothing said
        at_ms = bargein.instant_ms(at, timebase, epoch, self.now_ns())
        touched = self._interrupted.setdefault((stream, lang), {})
        retracted: list[str] = []
        cut: list[str] = []
        changes: list[StoredCue] = []
        keys = {(lang_, cid) for lang_, cid in self._records.get(stream, {})}
        keys.update((k[1], k[2]) for k in self._pending if k[0] == stream)
        for lang_, cue_id in sorted(keys):
            cue = self._latest(stream, lang_, cue_id)
            if lang_ != lang or cue is None:
                continue
            after = bargein.after(cue, at_ms)
            if after is None:
                continue
            changes.append(dataclasses.replace(after, seq=self._next_seq()))
            (retracted if after.deleted else cut).append(cue_id)
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
            stored = await self.write(
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
        track = self.tracks.setdefault((cue.stream, cue.lang), chunks.Track())
        track.put(cue)
        touched = set(chunks.chunks_touched(cue.start_ms, cue.end_ms, self.chunk_ms))
        if old is not None:
            touched.update(chunks.chunks_touched(old.start_ms, old.end_ms, self.chunk_ms))
        for n in touched:
            self.serving.changed((cue.stream, cue.lang, n))
        if not publish:
            return
        self.events.publish(cue.event())

    # --- reads -----------------------------------------------------------------------------

    def cues_between(self, stream: str, lang: str, start_ms: int, end_ms: int) -> list[StoredCue]:
        track = self.tracks.get((stream, lang))
        return [] if track is None else track.between(start_ms, end_ms)

    def snapshot(self, stream: str, start_s: float, end_s: float) -> list[Cue]:
        """Cue events for every cue of ``stream``, all languages, displayed in
        [start_s, end_s): what a viewer joining late needs before the live events."""
        start_ms, end_ms = round(start_s * 1000), round(end_s * 1000)
        out = []
        for (s, _lang), track in sorted(self.tracks.items()):
            if s == stream:
                for cue in track.between(start_ms, end_ms):
                    out.append(cue.cue_event())
        return out

    def languages(self, stream: str) -> list[str]:
        return sorted(lang for (s, lang), track in self.tracks.items() if s == stream)

    def changes(
        self, stream: str, since: int, lang: str | None = None, limit: int = MAX_FEED_ITEMS
    ) -> list[StoredCue]:
        """Committed cue writes (retractions included) with seq > since, in seq order."""
        records = self._records.get(stream, {})
        out = [c for c in records.values() if c.seq > since and (lang is None or c.lang == lang)]
        out.sort(key=lambda c: c.seq)
        return out[:limit]

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
        now = self.now_ns()
        purge = []
        for stream, epoch in self.epochs.items():
            horizon_ms = (now - epoch) // 1_000_000 - self.retention_ms
            if horizon_ms > 0:
                purge.append((stream, horizon_ms, horizon_ms // self.chunk_ms))
        if not purge:
            return 0
        await self.write(WriteBatch(purge=purge))
        dropped = 0
        for stream, horizon_ms, first_n in purge:
            records = self._records.get(stream, {})
            for key in [k for k, c in records.items() if c.end_ms < horizon_ms]:
                del records[key]
                dropped += 1
            for (s, _lang), track in self.tracks.items():
                if s == stream:
                    track.purge_before(horizon_ms)
            self.serving.purge(stream, first_n)
        if dropped:
            log.info("retention: dropped %d cues", dropped)
        return dropped


def _with_seq(cue: StoredCue, seq: int) -> StoredCue:
    return dataclasses.replace(cue, seq=seq)
