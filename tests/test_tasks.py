from __future__ import annotations

import asyncio
import logging

import pytest

from sfu_sidecar.tasks import Tasks

log = logging.getLogger("test.tasks")


async def test_tasks_are_named_after_their_owner() -> None:
    tasks = Tasks("clock", log)
    task = tasks.start("tick", asyncio.sleep(3600))
    assert task.get_name() == "clock-tick"
    assert len(tasks) == 1
    await tasks.stop()


async def test_stop_cancels_and_awaits_every_running_task() -> None:
    tasks = Tasks("probe", log)
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    started = [tasks.start(n, forever(n)) for n in ("a", "b")]
    await asyncio.sleep(0)  # let both reach their sleep
    await tasks.stop()
    assert sorted(cancelled) == ["a", "b"]
    assert all(t.done() for t in started)
    assert len(tasks) == 0


async def test_a_crash_is_logged_once_and_does_not_break_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = Tasks("sync", log)

    async def crash() -> None:
        raise ValueError("bad state")

    task = tasks.start("poll", crash())
    await asyncio.wait([task])
    await asyncio.sleep(0)  # the done callback runs on the next loop turn
    failures = [r for r in caplog.records if r.getMessage() == "task sync-poll failed"]
    assert len(failures) == 1
    assert failures[0].exc_info is not None and "bad state" in str(failures[0].exc_info[1])
    await tasks.stop()
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


async def test_drain_waits_for_work_without_cancelling_it() -> None:
    tasks = Tasks("captions", log)
    done: list[int] = []

    async def write(n: int) -> None:
        await asyncio.sleep(0.01)
        done.append(n)

    for n in range(3):
        tasks.start(f"write-{n}", write(n))
    await tasks.drain()
    assert sorted(done) == [0, 1, 2]


async def test_stop_from_inside_a_task_leaves_that_task_running() -> None:
    tasks = Tasks("session", log)
    other = tasks.start("other", asyncio.sleep(3600))

    async def closes_its_owner() -> str:
        await tasks.stop()
        return "finished"

    own = asyncio.get_running_loop().create_task(closes_its_owner())
    assert await own == "finished"
    assert other.cancelled()


@pytest.mark.integration
def test_start_without_a_running_loop_raises_and_closes_the_coroutine() -> None:
    tasks = Tasks("captions", log)
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        tasks.start("write", coro)
    assert coro.cr_frame is None  # closed: no "never awaited" warning later
