"""What word times cost a caption, beside the same caption without them, in process.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/caption_words.py [--rounds 5]

A 12-word sentence (what a TTS presenter posts: 3.6 s, a word every 0.3 s) goes through each
step the service takes with it, once with its 12 word times and once as plain text:

- ingest: validating the JSON cue and, with words, placing their timestamp tags
  (``parse_json_batch`` then ``words.tag``);
- feed: the change feed's JSON of the stored cue (``StoredCue.to_json``: with tags it adds the
  ``words`` list, read back from the text the first time and remembered for the next reads);
- chunk: the cue serialized into a WebVTT chunk (``chunks.render`` of 100 such cues);
- barge-in: cutting the cue at an instant (``words.cut``; plain text is kept whole).

Each figure is the median over ``--rounds`` of the time per cue (process CPU time, so another
process on the machine does not count), with the ratio of word-timed to plain.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sfu_sidecar.captions import chunks, words  # noqa: E402
from sfu_sidecar.captions.model import (  # noqa: E402
    StoredCue,
    _feed_words,
    parse_json_batch,
)

SENTENCE = "Tonight we look at the weather across the whole country and the coast"
START_MS = 120_000


def cue_doc(timed: bool) -> dict[str, object]:
    said = SENTENCE.split()
    cue: dict[str, object] = {"id": "c", "start": START_MS / 1000,
                              "end": (START_MS + 300 * len(said)) / 1000, "text": SENTENCE}
    if timed:
        cue["words"] = [{"start": (START_MS + 300 * i) / 1000, "text": w}
                        for i, w in enumerate(said)]
    return {"timebase": "stream_s", "lang": "en", "cues": [cue]}


def stored(timed: bool) -> StoredCue:
    (cue,) = parse_json_batch(cue_doc(timed)).cues
    text = words.tag(cue.text, cue.words, cue.start, cue.end) if cue.words else cue.text
    return StoredCue("s", "en", "c", cue.start, cue.end, text, True, 1)


def per_cue_us(step: Callable[[], object], n: int) -> float:
    started = time.process_time_ns()
    for _ in range(n):
        step()
    return (time.process_time_ns() - started) / n / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=2000, help="cues per step per round")
    args = parser.parse_args()
    steps: dict[str, Callable[[bool], Callable[[], object]]] = {
        "ingest": lambda timed: lambda: stored(timed),
        "feed, first read": lambda timed: (lambda c: lambda: (_feed_words.cache_clear(),
                                                               c.to_json()))(stored(timed)),
        "feed, read again": lambda timed: (lambda c: lambda: c.to_json())(stored(timed)),
        "chunk (per cue)": lambda timed: (lambda cs: lambda: chunks.render(cs, 0, 0))(
            [stored(timed)] * 100),
        "barge-in": lambda timed: (lambda c: lambda: words.cut(c.text, START_MS + 1650))(
            stored(timed)),
    }
    print(f"{'step':<18} {'plain µs':>9} {'words µs':>9} {'ratio':>6}")
    for name, make in steps.items():
        n = args.n // 100 if name.startswith("chunk") else args.n
        per = 100 if name.startswith("chunk") else 1
        plain = [per_cue_us(make(False), n) / per for _ in range(args.rounds)]
        timed = [per_cue_us(make(True), n) / per for _ in range(args.rounds)]
        p, t = statistics.median(plain), statistics.median(timed)
        print(f"{name:<18} {p:>9.1f} {t:>9.1f} {t / p:>6.2f}")


if __name__ == "__main__":
    main()
