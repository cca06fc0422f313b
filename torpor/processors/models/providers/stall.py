"""A stall guard for provider streams: no chunk within `stall_s` is a `StreamStalledError`.

The adapters await each item of a stream (and the response that opens it) through
`within`, so one slow step, not the whole turn, is what the timeout bounds.

A client's read timeout covers one socket read, but a server that trickles keep-alive
bytes (or SSE comments, or pings) never trips it while the turn makes no progress. The
guard times each item of the decoded stream instead, which is what "the model stopped
talking" means to us.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from torpor.processors.models.providers.errors import StreamStalledError

T = TypeVar("T")


async def within(awaitable: Awaitable[T], stall_s: float, what: str) -> T:
    """Await `awaitable`, or raise `StreamStalledError` naming `what` after `stall_s` seconds.

    A cancellation of the caller always propagates (the stage cancels a completion that
    is revoked or interrupted): `asyncio.timeout`, not `asyncio.wait_for`, which on
    Python 3.11 returns the result instead when the cancel and the result coincide.
    """
    try:
        async with asyncio.timeout(stall_s):
            return await awaitable
    except TimeoutError as exc:
        raise StreamStalledError(f"{what}: nothing within the stall timeout of {stall_s:g}s") from exc
