"""The bridge from a blocking read to the event loop: idle waits, errors, and the caller leaving."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from torpor.inspector.bridge import IDLE, iterate_in_thread

GENEROUS_S = 60.0


def test_a_quiet_read_yields_idle_and_then_goes_on_with_the_next_item() -> None:
    release = threading.Event()

    def read(stopped: Callable[[], bool]) -> Iterator[int]:
        yield 1
        assert release.wait(GENEROUS_S)
        yield 2

    async def consume() -> list[object]:
        got: list[object] = []
        async for item in iterate_in_thread(read, idle=0.01):
            got.append(item)
            if item is IDLE and got.count(IDLE) == 3:
                release.set()  # quiet for a while: the stream must still be open
        return got

    got = asyncio.run(consume())
    assert [g for g in got if g is not IDLE] == [1, 2] and got.count(IDLE) >= 3


def test_an_error_in_the_read_is_raised_in_the_caller() -> None:
    def read(stopped: Callable[[], bool]) -> Iterator[int]:
        yield 1
        raise LookupError("the topic went away")

    async def consume() -> list[object]:
        return [item async for item in iterate_in_thread(read, idle=GENEROUS_S)]

    with pytest.raises(LookupError, match="went away"):
        asyncio.run(consume())


def test_a_caller_that_leaves_stops_the_read() -> None:
    ended = threading.Event()

    def read(stopped: Callable[[], bool]) -> Iterator[int]:
        try:
            n = 0
            while not stopped():
                n += 1
                yield n
        finally:
            ended.set()

    async def consume() -> None:
        items = iterate_in_thread(read, idle=GENEROUS_S)
        async for item in items:
            if item == 3:
                break
        await items.aclose()

    asyncio.run(consume())
    assert ended.wait(GENEROUS_S)
