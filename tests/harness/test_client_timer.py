"""The client's timer: callbacks at a CLOCK_MONOTONIC time, in time order, inside the loop's wake-up."""
import asyncio
import os
import time

import pytest

from tensorfold_bench.client import timer


def test_callbacks_run_in_time_order_never_early_and_a_later_earlier_one_rearms():
    async def go():
        ran: list[tuple[str, float]] = []
        now = time.monotonic()
        f_late = timer.call_at(now + 0.06, lambda: ran.append(("late", time.monotonic())))
        f_soon = timer.call_at(now + 0.02, lambda: ran.append(("soon", time.monotonic())))  # armed after: fires first
        f_past = timer.call_at(now - 1.0, lambda: ran.append(("past", time.monotonic())))
        await asyncio.gather(f_late, f_soon, f_past)
        return now, ran
    now, ran = asyncio.run(go())
    assert [name for name, _ in ran] == ["past", "soon", "late"]
    assert ran[1][1] >= now + 0.02 and ran[2][1] >= now + 0.06


def test_a_failing_callback_fails_its_waiter_only_and_a_cancelled_one_does_not_run():
    async def go():
        ran = []
        now = time.monotonic()
        bad = timer.call_at(now + 0.01, lambda: 1 / 0)
        dropped = timer.call_at(now + 0.02, lambda: ran.append("dropped"))
        dropped.cancel()
        good = timer.call_at(now + 0.03, lambda: ran.append("good"))
        with pytest.raises(ZeroDivisionError):
            await bad
        await good
        return ran
    assert asyncio.run(go()) == ["good"]


def test_sleep_until_returns_at_the_time_and_at_once_for_a_past_one():
    async def go():
        t = time.monotonic() + 0.015
        await timer.sleep_until(t)
        woke = time.monotonic()
        before = time.monotonic()
        await timer.sleep_until(before - 5)
        return t, woke, time.monotonic() - before
    t, woke, past = asyncio.run(go())
    assert woke >= t and past < 0.01


@pytest.mark.skipif(not timer.available(), reason="a timerfd is Linux's")
def test_the_timers_wakeup_is_first_among_the_ready_files():
    """Reads that became ready together with the timer run after its callbacks."""
    async def go():
        loop = asyncio.get_running_loop()
        order = []
        await timer.sleep_until(time.monotonic())  # the loop's timer exists
        r, w = os.pipe()
        loop.add_reader(r, lambda: order.append("read"))
        t = time.monotonic() + 0.02
        fut = timer.call_at(t, lambda: order.append("timer"))
        os.write(w, b"x")  # ready before the timer: epoll lists it first
        time.sleep(0.03)  # the loop blocked past t: both are ready at its next wait
        await fut
        await asyncio.sleep(0)
        loop.remove_reader(r)
        return order
    order = asyncio.run(go())
    assert order[:2] == ["timer", "read"]


def test_a_levels_tasks_are_waited_for_until_all_end_or_the_timeout():
    from tensorfold_bench.client.player import Tasks

    async def go():
        tasks = Tasks()
        tasks.start(asyncio.sleep(0.01))
        tasks.start(asyncio.sleep(5))
        t = time.monotonic()
        pending = await tasks.wait(0.1)
        waited = time.monotonic() - t
        for p in pending:
            p.cancel()
        done = Tasks()
        done.start(asyncio.sleep(0.01))
        return len(pending), waited, await done.wait(5), await Tasks().wait(5)
    n_pending, waited, none_left, nothing = asyncio.run(go())
    assert n_pending == 1 and 0.1 <= waited < 1.0
    assert none_left == [] and nothing == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts this process's open files")
def test_a_loops_timer_goes_with_the_loop():
    import gc

    def open_fds():
        return len(os.listdir("/proc/self/fd"))
    asyncio.run(timer.sleep_until(time.monotonic() + 0.001))
    gc.collect()
    before = open_fds()
    for _ in range(50):
        asyncio.run(timer.sleep_until(time.monotonic() + 0.001))
    gc.collect()
    assert open_fds() <= before + 2


def test_the_timers_order_survives_a_self_check_ending_on_the_same_loop():
    """The self-check's timing of the loop's waits ends with its run; a timer wrapped over it
    keeps putting its wake-up first."""
    from tensorfold_bench.client import selfcheck

    async def go():
        loop = asyncio.get_running_loop()
        async with selfcheck.Watch():
            await timer.sleep_until(time.monotonic() + 0.001)  # the timer wraps the Watch's wrapper
        order = []
        r, w = os.pipe()
        loop.add_reader(r, lambda: order.append("read"))
        fut = timer.call_at(time.monotonic() + 0.02, lambda: order.append("timer"))
        os.write(w, b"x")
        time.sleep(0.03)
        await fut
        await asyncio.sleep(0)
        loop.remove_reader(r)
        return order
    assert asyncio.run(go())[:2] == ["timer", "read"]
