"""Captions moved onto the voice reach a viewer page that is already open: the page holds each
moved cue at its new start without a reload, and the cue its author marked fixed where the
author put it (tests/e2e/caption_align_probe.py)."""

from __future__ import annotations

import pytest

from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns, pytest.mark.needs("espeak-ng"),
              pytest.mark.timeout(180)]


def test_an_open_viewer_page_holds_the_moved_cues_and_the_fixed_one_unmoved() -> None:
    result = probes.run_probe("tests.e2e.caption_align_probe", timeout=150)
    feed, first, last = result["feed"], result["page_first"], result["page_last"]
    print({cue_id: (first.get(cue_id), last.get(cue_id), feed[cue_id].get("aligned_ms"))
           for cue_id in result["posted"]})
    assert result["reloads"] == 1  # the one navigation that opened it
    for cue_id in result["posted"]:
        cue = feed[cue_id]
        if cue_id == result["fixed"]:
            assert "aligned_ms" not in cue and cue["fixed"] is True, cue
            assert first[cue_id] == last[cue_id] == cue["start"], (cue, first, last)
            continue
        # Held first at the author's start, then at the start the service moved it to.
        assert first[cue_id] == cue["author_start"], (cue, first)
        assert last[cue_id] == cue["start"] and cue["aligned_ms"] > 0, (cue, last)
