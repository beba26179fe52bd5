"""Alert hysteresis: raise and clear thresholds apart, minimum durations, no flapping."""

from __future__ import annotations

import pytest

from sfu_sidecar.probe.alerts import RULES, Alerts, Rule, flag

S = 1_000_000_000


def run(alerts: Alerts, name: str, values: list[float | None], step_s: float = 0.5,
        subject: str = "live") -> list[tuple[float, str]]:
    """Feed values every step_s seconds; (time s, state) of every event."""
    out = []
    for i, v in enumerate(values):
        event = alerts.update(name, subject, v, int(i * step_s * S))
        if event is not None:
            out.append((i * step_s, event.state))
    return out


def test_frame_jitter_raises_after_its_minimum_duration_and_clears_below_the_clear_line() -> None:
    alerts = Alerts()
    # Bad from t = 1 s; raise needs 1 s of it. Then 100 ms: between the lines, so it stays up;
    # 80 ms from t = 5 s: below the clear line, cleared after 3 s of it.
    values = [50.0, 50.0] + [120.0] * 4 + [100.0] * 4 + [80.0] * 8
    assert run(alerts, "frame_jitter", values) == [(2.0, "raised"), (8.0, "cleared")]
    assert not alerts.is_active("frame_jitter", "live")


def test_no_flapping_at_the_raise_threshold() -> None:
    alerts = Alerts()
    # Hovering across 112 ms every half second never holds 1 s on the bad side.
    assert run(alerts, "frame_jitter", [111.9, 112.1] * 20) == []
    # Once raised, hovering across 112 ms never holds 3 s on the good side of 90 ms.
    alerts = Alerts()
    events = run(alerts, "frame_jitter", [150.0] * 3 + [111.9, 112.1] * 20 + [89.0, 91.0] * 10)
    assert events == [(1.0, "raised")]
    assert alerts.is_active("frame_jitter", "live")


def test_lip_sync_window_is_two_sided_and_exclusive() -> None:
    alerts = Alerts()
    # Exactly +15 and -45 are inside the ATSC window.
    assert run(alerts, "lip_sync_atsc", [15.0, -45.0] * 10) == []
    events = run(alerts, "lip_sync_atsc", [0.0] + [-50.0] * 5 + [-42.0] * 20 + [0.0] * 11)
    # Raised 2 s after -50 began (t = 0.5); -42 is between -45 and -40: no clearing;
    # 0 from t = 13 s clears 5 s later.
    assert events == [(2.5, "raised"), (18.0, "cleared")]
    assert run(alerts, "lip_sync_detectable", [44.0] * 10 + [46.0] * 5) == [(7.0, "raised")]


def test_missing_data_holds_the_state_and_resets_pending_changes() -> None:
    alerts = Alerts()
    assert run(alerts, "frame_jitter", [120.0, None, 120.0, 120.0, 120.0]) == [(2.0, "raised")]
    assert alerts.is_active("frame_jitter", "live")
    # Clearing needs 3 s of good values without a gap.
    alerts2 = Alerts()
    assert run(alerts2, "frame_jitter", [120.0] * 3 + [50.0] * 4 + [None] + [50.0] * 7) == [
        (1.0, "raised"), (7.0, "cleared")]


def test_flags_and_subjects_are_independent() -> None:
    alerts = Alerts()
    e1 = alerts.update("discontinuity", "a", 1.0, 0)
    assert e1 is not None and e1.state == "raised"
    assert alerts.update("discontinuity", "b", 0.0, 0) is None
    assert alerts.is_active("discontinuity", "a") and not alerts.is_active("discontinuity", "b")
    e2 = alerts.update("discontinuity", "a", 0.0, S)
    assert e2 is not None and e2.state == "cleared"
    assert [e.state for e in alerts.recent] == ["raised", "cleared"]


def test_active_list_and_forgetting_a_subject() -> None:
    alerts = Alerts()
    alerts.update("gpu_memory", "gpu0", 97.0, 5 * S, detail="GPU 0")
    alerts.update("discontinuity", "live", 1.0, 6 * S)
    active = alerts.active()
    assert [(a["alert"], a["subject"], a["since_ns"]) for a in active] == [
        ("gpu_memory", "gpu0", 5 * S), ("discontinuity", "live", 6 * S)]
    assert active[0]["detail"] == "GPU 0" and active[0]["value"] == 97.0
    events = alerts.forget(["live"], 7 * S)
    assert [(e.alert, e.state) for e in events] == [("discontinuity", "cleared")]
    assert [a["alert"] for a in alerts.active()] == ["gpu_memory"]


def test_catalogue_names_every_alert_of_the_issue_with_its_limits() -> None:
    names = {r["alert"]: r for r in Alerts().catalogue()}
    assert set(names) == {
        "frame_jitter", "lip_sync_atsc", "lip_sync_detectable", "bursty_delivery",
        "discontinuity", "clock_source_lost", "clock_holdover", "clock_slewing",
        "gpu_fragmentation", "gpu_memory", "viewer_backlog",
    }
    assert names["frame_jitter"]["high"] == 112.0
    assert (names["lip_sync_atsc"]["high"], names["lip_sync_atsc"]["low"]) == (15.0, -45.0)
    assert (names["lip_sync_detectable"]["high"],
            names["lip_sync_detectable"]["low"]) == (45.0, -125.0)
    assert names["bursty_delivery"]["high"] == 3.5
    assert names["gpu_fragmentation"]["high"] == 0.68
    assert names["gpu_memory"]["high"] == 95.0
    assert RULES["bursty_delivery"].bad(3.51) and not RULES["bursty_delivery"].bad(3.5)
    assert RULES["gpu_fragmentation"].bad(0.68)


def test_rules_refuse_a_clear_line_outside_the_raise_line() -> None:
    with pytest.raises(ValueError):
        Rule("x", "x", high=10.0, clear_high=12.0)
    with pytest.raises(ValueError):
        Rule("x", "x", low=-10.0, clear_low=-12.0)
    assert flag("y", "y").bad(1.0) and flag("y", "y").good(0.0)
