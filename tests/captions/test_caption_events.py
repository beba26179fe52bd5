"""The in-process event hub: ordering, stream filter, slow subscribers."""

from __future__ import annotations

import pytest

from sfu_sidecar.captions.events import (
    CueEvent,
    CueRetractEvent,
    EpochEvent,
    LocalEvents,
    SubscriptionLost,
)


async def test_fan_out_in_order_with_stream_filter() -> None:
    hub = LocalEvents()
    every = hub.subscribe()
    one = hub.subscribe("a")
    events = [EpochEvent("a", 5), CueEvent("b", "en", "1", 0, 1, "x", True),
              CueRetractEvent("a", "en", "1")]
    for e in events:
        hub.publish(e)
    assert [await every.get() for _ in range(3)] == events
    assert [await one.get() for _ in range(2)] == [events[0], events[2]]
    one.close()
    hub.publish(EpochEvent("a", 6))
    assert hub.subscriber_count == 1
    with pytest.raises(StopAsyncIteration):
        await one.get()
    every.close()


async def test_slow_subscriber_is_cut_off_not_blocking() -> None:
    hub = LocalEvents()
    slow = hub.subscribe(maxsize=3)
    fast = hub.subscribe(maxsize=100)
    for i in range(10):
        hub.publish(EpochEvent("s", i))
    assert hub.subscriber_count == 1
    got = [await slow.get() for _ in range(3)]
    assert [e.epoch_ns for e in got] == [0, 1, 2]  # type: ignore[union-attr]
    with pytest.raises(SubscriptionLost):
        await slow.get()
    assert [(await fast.get()).epoch_ns for _ in range(10)] == list(range(10))  # type: ignore[union-attr]


def test_message_shapes() -> None:
    assert CueRetractEvent("s", "en", "i").message() == {
        "type": "cue_retract", "stream": "s", "lang": "en", "id": "i"}
    assert EpochEvent("s", 7).message() == {"type": "epoch", "stream": "s", "epoch_ns": 7}


def test_messages_are_sync_channel_controls() -> None:
    # The sync DataChannel forwards event.message() as a control message: the shapes must match.
    from sfu_sidecar.sync.wire import control_from_map

    for event in (CueEvent("s", "en", "i", 1.0, 2.5, "hi", False),
                  CueRetractEvent("s", "en", "i"), EpochEvent("s", 17)):
        control = control_from_map(event.message())
        assert {k: getattr(control, k) for k in event.message() if k != "type"} == {
            k: v for k, v in event.message().items() if k != "type"}
