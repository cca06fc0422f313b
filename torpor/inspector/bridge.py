"""A blocking iterator (a Kafka read) consumed from the event loop, one item at a time.

`iterate_in_thread(make, idle)` runs `make(stopped)` in a thread of its own and yields its
items to an async caller through a small bounded queue: a slow browser slows the read,
it does not fill memory. When nothing came for `idle` seconds it yields `IDLE` (the
caller sends a keep-alive) and goes on waiting. When the caller stops (a client went
away: Starlette cancels the response), `stopped()` turns true, which the read checks
between polls, and the thread ends by itself. An exception in the read is raised in
the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from enum import Enum
from typing import Final, Literal, TypeVar

T = TypeVar("T")
QUEUE_SIZE: Final = 256
HANDOFF_SECONDS: Final = 0.5


class Idle(Enum):
    IDLE = "idle"


IDLE: Final = Idle.IDLE


class _End:
    pass


async def iterate_in_thread(make: Callable[[Callable[[], bool]], Iterator[T]],
                            idle: float) -> AsyncGenerator[T | Literal[Idle.IDLE], None]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[T | BaseException | _End] = asyncio.Queue(QUEUE_SIZE)
    stopped = threading.Event()

    def hand(value: T | BaseException | _End) -> None:
        future = asyncio.run_coroutine_threadsafe(queue.put(value), loop)
        while not stopped.is_set():
            try:
                future.result(HANDOFF_SECONDS)
                return
            except concurrent.futures.TimeoutError:
                continue
        future.cancel()

    def run() -> None:
        try:
            for value in make(stopped.is_set):
                hand(value)
                if stopped.is_set():
                    return
        except BaseException as error:
            hand(error)
        else:
            hand(_End())

    worker = threading.Thread(target=run, name="torpor-ui-read", daemon=True)
    worker.start()
    try:
        while True:
            try:
                # Only the queue's get is cancelled by the timeout, never this generator.
                value = await asyncio.wait_for(queue.get(), idle)
            except TimeoutError:
                yield IDLE
                continue
            if isinstance(value, _End):
                return
            if isinstance(value, BaseException):
                raise value
            yield value
    finally:
        stopped.set()
