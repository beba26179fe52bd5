"""The viewer page reconnects by itself when the worker serving it dies, and maps frames and
shows captions exactly again, and stays on its session while the video only pauses
(``serve --workers 2``, headless Chromium)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import in_stored_cue, judge_pixels
from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.timeout(150)]

TOLERANCE_NS = 1_000_000


def run_probe() -> dict[str, Any]:
    return probes.run_probe("tests.e2e.workers_chromium_probe", timeout=130, netns=False)


def test_the_viewer_page_reconnects_after_its_worker_is_killed() -> None:
    result = run_probe()
    assert result["joined"], "the publisher did not join the house clock"
    # The page was served by the worker that pulls, not by the publisher's home worker.
    assert result["page_worker"] is not None and result["page_worker"] != result["home"], result
    killed = result["page_worker"]
    before = result["workers_before"][killed]
    after = result["workers_after"][killed]
    assert after["alive"] and after["restarts"] == before["restarts"] + 1, result["workers_after"]
    assert after["pid"] != before["pid"]

    # The publisher's video stopped for a while: the page asked whether its session was still
    # there, was told it was, and stayed on it (no reconnection, the same resource).
    pause = result["pause"]
    assert pause["stats"]["sessionChecks"] >= 1 and pause["stats"]["reconnects"] == 0, pause
    assert pause["resource"] == result["page_resource"], pause
    print(f"\nvideo stopped {pause['seconds']:.0f} s: {pause['stats']['sessionChecks']} session "
          "check(s), the page stayed on its session")

    stats = result["stats"]
    assert stats["reconnects"] >= 1, (stats, result["status_text"])
    truth = {int(n): ns for n, ns in result["capture_log"].items()}
    kill_ns = result["kill_ns"]
    frames = result["frames"]
    mapped = [f for f in frames if f["capture"] is not None]
    after_kill = [f for f in mapped if int(f["capture"]) > kill_ns]
    assert len(after_kill) >= 60, len(after_kill)
    # Mapped through the new connection's records only: each within 1 ms of the truth (read
    # off the canvas as the other pixel-reading tests do).
    judged = judge_pixels(((f["n"], int(f["capture"])) for f in after_kill), truth, TOLERANCE_NS)
    judged.check(tolerance_ns=TOLERANCE_NS)
    first_back = min(f["wall_ms"] for f in after_kill)
    last_before = max(f["wall_ms"] for f in mapped if int(f["capture"]) <= kill_ns)
    print(f"\nworker {killed} killed: the page presented frames again "
          f"{(first_back - kill_ns / 1e6) / 1000:.1f} s later (last frame before "
          f"{(last_before - kill_ns / 1e6) / 1000:+.2f} s), reconnects {stats['reconnects']}, "
          f"|error| max {judged.worst_ns / 1e3:.1f} us over {len(judged.errors)} frames")

    # A caption posted after the reconnection shows on exactly its frames, placed by its
    # settings.
    cue = result["cue"]
    assert cue["status"] in (200, 201)
    inside = [f for f in after_kill if cue["start"] <= int(f["capture"]) < cue["end"]]
    assert len(inside) >= 30, len(inside)
    for f in after_kill:
        shown = in_stored_cue(int(f["capture"]), cue["start"], cue["end"])
        if shown is not None:
            assert f["caption"] == ("after the reconnection" if shown else ""), (f, cue)
        if shown:
            assert f["placement"] == [{"line": 0, "snapToLines": True, "align": "start"}], f
