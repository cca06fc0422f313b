"""`stall.within`: a silent stream stalls; a cancel that meets a result still cancels."""

from __future__ import annotations

import asyncio

import pytest

from torpor.processors.models.providers.errors import StreamStalledError
from torpor.processors.models.providers.stall import within


def test_nothing_within_the_timeout_is_a_stall() -> None:
    async def run() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        stalled = r"the stream: nothing within the stall timeout of 0\.05s"
        with pytest.raises(StreamStalledError, match=stalled):
            await within(never, 0.05, "the stream")

    asyncio.run(run())


def test_a_cancel_arriving_with_the_result_cancels() -> None:
    async def run() -> None:
        chunk: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(within(chunk, 10.0, "the stream"))
        await asyncio.sleep(0)  # the task now waits on the chunk
        chunk.set_result(1)  # the chunk arrives and, in the same instant, the stage cancels
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(run())
