"""The list stream tells the page when the feed catches up, even when no row changed.

A page that loads while the feed still reads the topics shows "reading the topics…"
and waits for a `changed` message. The feed reaching the end changes no row, so a
stream that spoke only when rows changed left the page saying it for good (the demo UI
test failed so in CI). Here the state flips with the rows unchanged, and the stream must
say so; an error appearing and going must be said too.
"""

from __future__ import annotations

import asyncio
import json

from torpor.inspector.app import list_changes


class _Walked(Exception):
    """Every state was shown to the stream."""


def _messages(states: list[dict[str, object]]) -> list[dict[str, object]]:
    """What the stream says while `state()` walks through `states`, one per poll."""
    walk = iter(states)

    def state() -> dict[str, object]:
        for now in walk:
            return now
        raise _Walked

    async def read() -> list[dict[str, object]]:
        said: list[dict[str, object]] = []
        stream = list_changes(state, poll_seconds=0)
        try:
            while True:
                text = await anext(stream)
                assert text.startswith("event: changed"), text
                said.append(json.loads(text.split("data: ", 1)[1]))
        except _Walked:
            return said

    return asyncio.run(read())


def test_the_feed_catching_up_with_no_row_changed_is_said() -> None:
    reading = {"version": 3, "caught_up": False, "feed_error": None, "count": 2}
    live = {**reading, "caught_up": True}
    said = _messages([reading, reading, live, live])
    assert said == [reading, live]


def test_a_feed_error_and_its_recovery_are_said() -> None:
    live = {"version": 3, "caught_up": True, "feed_error": None, "count": 2}
    failing = {**live, "feed_error": "KafkaException: broker away"}
    said = _messages([live, failing, failing, live])
    assert said == [live, failing, live]


def test_rows_changing_are_said_once_each() -> None:
    first = {"version": 1, "caught_up": True, "feed_error": None, "count": 1}
    second = {**first, "version": 2, "count": 2}
    said = _messages([first, first, second, second])
    assert said == [first, second]
