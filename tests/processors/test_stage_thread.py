"""`processor.StageThread`: calls handed to the model stage's loop, coalesced into one wake-up.

No broker: the stage thread is an asyncio loop on a daemon thread; these check that
calls handed over while a wake-up is pending still run, in order, that they count as in
flight until they have run, that one that raises strands none behind it, and that a
periodic call (`every`, which serves the stage producer's delivery reports) keeps ticking.
"""

from __future__ import annotations

import functools
import threading

from tests.waiting import wait_until
from torpor.processors.processor import StageThread


def test_calls_handed_over_while_the_stage_is_busy_run_in_order_and_count_until_run() -> None:
    stages = StageThread()
    try:
        release = threading.Event()
        ran: list[int] = []
        stages.call(lambda: release.wait(30))  # holds the stage's loop: the next ones queue up
        for n in range(3):
            stages.call(functools.partial(ran.append, n))
        assert stages.scheduled == 4 and ran == []  # in flight: `until_idle` must not stop
        release.set()
        wait_until(lambda: stages.scheduled == 0, timeout=30, message="the queued calls ran")
        assert ran == [0, 1, 2]
        stages.call(lambda: ran.append(3))  # nothing pending: a new wake-up
        wait_until(lambda: stages.scheduled == 0, timeout=30, message="a later call ran")
        assert ran == [0, 1, 2, 3]
    finally:
        stages.stop()


def test_a_call_that_raises_strands_none_of_the_calls_behind_it() -> None:
    stages = StageThread()
    try:
        release = threading.Event()
        ran: list[str] = []

        def broken() -> None:
            raise RuntimeError("a stage hand-over failed")

        stages.call(lambda: release.wait(30))
        stages.call(broken)
        stages.call(lambda: ran.append("after"))
        release.set()
        wait_until(lambda: stages.scheduled == 0, timeout=30, message="every call ran or failed")
        assert ran == ["after"]
    finally:
        stages.stop()


def test_a_periodic_call_keeps_running_on_the_stage_loop_after_one_that_raises() -> None:
    stages = StageThread()
    try:
        ticks: list[str] = []

        def tick() -> None:
            ticks.append(threading.current_thread().name)
            if len(ticks) == 2:
                raise RuntimeError("one tick fails")

        stages.every(0.01, tick)
        wait_until(lambda: len(ticks) >= 5, timeout=30, message="the periodic call ran five times")
        assert set(ticks) == {"torpor-model-stage"}  # on the stage's loop, not the caller's thread
    finally:
        stages.stop()
