"""The fake runtime's loop mode: its sleeps, timeouts and timers move only with its clock, exactly."""

from __future__ import annotations

import asyncio

import pytest

from testing.fake_runtime import WALL_CLOCK_START, FakeRuntime


def test_a_sleep_ends_exactly_at_its_time_and_the_wall_clock_moves_with_it() -> None:
    async def main() -> None:
        runtime = FakeRuntime.on_running_loop()
        woke: list[float] = []

        async def sleeper() -> None:
            await runtime.sleep(2.5)
            woke.append(runtime.monotonic())

        task = asyncio.create_task(sleeper())
        assert await runtime.sleeper() == 2.5
        await runtime.elapse(2.499)
        assert woke == []
        await runtime.elapse(0.001)
        assert woke == [2.5] and task.done()
        assert runtime.now() == WALL_CLOCK_START + 2.5

    asyncio.run(main())


def test_chained_sleeps_within_one_elapse_each_fire_at_their_own_time() -> None:
    async def main() -> None:
        runtime = FakeRuntime.on_running_loop()
        times: list[float] = []

        async def ticker() -> None:
            for _ in range(4):
                await runtime.sleep(0.25)
                times.append(runtime.monotonic())

        task = asyncio.create_task(ticker())
        await runtime.elapse(1.0)
        assert times == [0.25, 0.5, 0.75, 1.0]
        await task

    asyncio.run(main())


def test_timeout_raises_at_its_deadline_and_a_cancel_from_outside_still_propagates() -> None:
    async def main() -> None:
        runtime = FakeRuntime.on_running_loop()
        never = asyncio.Event()

        async def waits(seconds: float) -> None:
            async with runtime.timeout(seconds):
                await never.wait()

        timed = asyncio.create_task(waits(0.3))
        await runtime.elapse(0.299)
        assert not timed.done()
        await runtime.elapse(0.001)
        with pytest.raises(TimeoutError):
            await timed

        cancelled = asyncio.create_task(waits(0.3))
        await runtime.settle()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert runtime.next_deadline is None  # the timeout's timer went with it

    asyncio.run(main())


def test_a_cancelled_sleep_leaves_no_timer_for_sleeper_to_find() -> None:
    async def main() -> None:
        runtime = FakeRuntime.on_running_loop()
        task = asyncio.ensure_future(runtime.sleep(5))
        await runtime.settle()
        assert runtime.next_deadline == 5
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert runtime.next_deadline is None

    asyncio.run(main())


def test_run_until_fails_when_the_condition_needs_more_fake_time_than_allowed() -> None:
    async def main() -> None:
        runtime = FakeRuntime.on_running_loop()
        sleeping = asyncio.ensure_future(runtime.sleep(10))
        with pytest.raises(AssertionError, match="not within 1"):
            await runtime.run_until(lambda: False, within=1)
        sleeping.cancel()

    asyncio.run(main())
