"""Live deltas coalesced per attempt, with one timer per stage for the quiet ones."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from torpor.processors.models.deltas import Deltas, DeltaWindows

Published = list[tuple[str, int, str]]


def recorder(published: Published, name: str) -> functools.partial[None]:
    def publish(name: str, first: int, text: str) -> None:
        published.append((name, first, text))

    return functools.partial(publish, name)


async def wait_for(predicate: Callable[[], bool], seconds: float = 60.0) -> None:
    async with asyncio.timeout(seconds):  # generous: the windows below are milliseconds
        while not predicate():
            await asyncio.sleep(0.002)


def test_with_no_window_every_delta_is_published_at_once() -> None:
    published: Published = []

    async def go() -> None:
        deltas = Deltas(recorder(published, "a"), DeltaWindows(0.0))
        deltas.add("po")
        deltas.add("ng")
        deltas.flush()

    asyncio.run(go())
    assert published == [("a", 0, "po"), ("a", 1, "ng")]


def test_deltas_within_the_window_go_out_as_one_event_at_the_flush() -> None:
    published: Published = []

    async def go() -> None:
        deltas = Deltas(recorder(published, "a"), DeltaWindows(30.0))
        for text in ("a", "b", "c"):
            deltas.add(text)
        assert published == []
        deltas.flush()
        deltas.flush()  # nothing buffered: nothing more

    asyncio.run(go())
    assert published == [("a", 0, "abc")]


def test_quiet_buffers_are_published_when_their_windows_pass_each_labelled_by_its_first_delta() -> None:
    published: Published = []

    async def go() -> None:
        windows = DeltaWindows(0.01)
        one = Deltas(recorder(published, "one"), windows)
        two = Deltas(recorder(published, "two"), windows)
        one.add("a")
        one.add("b")
        two.add("x")
        await wait_for(lambda: len(published) == 2)
        one.add("c")  # a new window, a new label: the index of its first delta
        await wait_for(lambda: len(published) == 3)
        one.flush()
        two.flush()

    asyncio.run(go())
    assert published == [("one", 0, "ab"), ("two", 0, "x"), ("one", 2, "c")]


def test_a_buffer_flushed_before_its_window_leaves_the_timer_to_the_next_one() -> None:
    published: Published = []

    async def go() -> None:
        windows = DeltaWindows(0.01)
        fast = Deltas(recorder(published, "fast"), windows)
        quiet = Deltas(recorder(published, "quiet"), windows)
        fast.add("done")  # the timer is armed for this one's window
        await asyncio.sleep(0.002)
        quiet.add("waiting")
        fast.flush()  # the end of its attempt, long before its window
        await wait_for(lambda: len(published) == 2)
        quiet.flush()

    asyncio.run(go())
    assert published == [("fast", 0, "done"), ("quiet", 0, "waiting")]


def test_a_failing_publish_does_not_strand_the_other_buffers() -> None:
    published: Published = []

    def broken(first: int, text: str) -> None:
        raise RuntimeError("the sink is down")

    async def go() -> None:
        windows = DeltaWindows(0.005)
        bad = Deltas(broken, windows)
        good = Deltas(recorder(published, "good"), windows)
        bad.add("lost")
        good.add("kept")
        await wait_for(lambda: len(published) == 1)
        bad.flush()  # its text went with the failed publish: nothing to repeat
        good.flush()

    asyncio.run(go())
    assert published == [("good", 0, "kept")]


def test_windows_used_again_on_a_new_event_loop_still_publish_a_quiet_buffer() -> None:
    published: Published = []
    windows = DeltaWindows(0.01)

    async def first() -> None:
        deltas = Deltas(recorder(published, "first"), windows)
        deltas.add("x")  # arms the timer on this loop, which ends before it fires
        deltas.flush()

    async def second() -> None:
        deltas = Deltas(recorder(published, "second"), windows)
        deltas.add("y")
        await wait_for(lambda: len(published) == 2)
        deltas.flush()

    asyncio.run(first())
    asyncio.run(second())
    assert published == [("first", 0, "x"), ("second", 0, "y")]
