"""The in-process event hub: ordering, stream filter, slow subscribers."""

from __future__ import annotations

import pytest

from sfu_sidecar.captions.events import (
    Cue,
    CueRetract,
    Epoch,
    LocalEvents,
    SubscriptionLost,
)


async def test_fan_out_in_order_with_stream_filter() -> None:
    hub = LocalEvents()
    every = hub.subscribe()
    one = hub.subscribe("a")
    events = [Epoch("a", 5), Cue("b", "en", "1", 0, 1, "x", True),
              CueRetract("a", "en", "1")]
    for e in events:
        hub.publish(e)
    assert [await every.get() for _ in range(3)] == events
    assert [await one.get() for _ in range(2)] == [events[0], events[2]]
    one.close()
    hub.publish(Epoch("a", 6))
    assert hub.subscriber_count == 1
    with pytest.raises(StopAsyncIteration):
        await one.get()
    every.close()


async def test_slow_subscriber_is_cut_off_not_blocking() -> None:
    hub = LocalEvents()
    slow = hub.subscribe(maxsize=3)
    fast = hub.subscribe(maxsize=100)
    for i in range(10):
        hub.publish(Epoch("s", i))
    assert hub.subscriber_count == 1
    got = [await slow.get() for _ in range(3)]
    assert [e.epoch_ns for e in got] == [0, 1, 2]  # type: ignore[union-attr]
    with pytest.raises(SubscriptionLost):
        await slow.get()
    assert [(await fast.get()).epoch_ns for _ in range(10)] == list(range(10))  # type: ignore[union-attr]


def test_the_events_are_the_sync_channels_control_messages() -> None:
    # Defined once: the sync DataChannel carries the caption events as they are.
    from sfu_sidecar.sync import wire

    assert (wire.Cue, wire.CueRetract, wire.Epoch) == (Cue, CueRetract, Epoch)
    assert wire.control_to_map(CueRetract("s", "en", "i")) == {
        "type": "cue_retract", "stream": "s", "lang": "en", "id": "i"}
    assert wire.control_to_map(Epoch("s", 7)) == {"type": "epoch", "stream": "s", "epoch_ns": 7}
    for event in (Cue("s", "en", "i", 1.0, 2.5, "hi", False),
                  CueRetract("s", "en", "i"), Epoch("s", 17)):
        assert wire.control_from_map(wire.control_to_map(event)) == event
