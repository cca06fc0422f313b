"""`GET /api/lag` in-process (no broker: the sampler is not started), as an attacker tries it.

A window that is not whole seconds from 1 to 600 (negative, zero, huge, not a number,
digits of another script, a float) or a parameter the route does not take gets one 400
with a reason; a server that watches no group answers 501; a good request answers the
sampler's view (here: nothing sampled yet) and the server keeps answering.
"""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from torpor.inspector.app import UiConfig, create_app
from torpor.inspector.desk import Desk
from torpor.schemas.records import Input
from torpor.streams.config import Settings


def _config(group: str | None) -> UiConfig:
    def submit(record: Input) -> None:
        raise AssertionError("the lag route produces nothing")

    return UiConfig(settings=Settings(), desk=Desk("tester", None, submit), hosts=("testserver",),
                    group=group)


@pytest.mark.parametrize("query", [
    "window=-1", "window=0", "window=601", "window=99999999999999999999999999", "window=abc", "window=",
    "window=1e3", "window=2.5", "window=%20%205", "window=%D9%A3", "window=0x10", "window=+5",
    "partition=0", "window=60&since=0", "window=" + "9" * 10_000,
])
def test_a_bad_query_is_refused_with_one_reason(query: str) -> None:
    with TestClient(create_app(_config("app"), feed=False)) as client:
        refused = client.get("/api/lag?" + query)
        assert refused.status_code == 400, (query, refused.text)
        assert set(refused.json()) == {"error"} and len(refused.json()["error"]) < 200
        assert client.get("/api/lag?window=60").status_code == 200  # still serving


def test_a_good_query_answers_the_view_before_any_sample() -> None:
    with TestClient(create_app(_config("app-1"), feed=False)) as client:
        for query in ("", "?window=1", "?window=600"):
            answer = client.get("/api/lag" + query)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["group"] == "app-1" and body["at"] is None and body["error"] is None
            assert body["partitions"] == [] and body["members"] == [] and body["series"] == {}
            assert body["total_lag"] == 0


def test_a_server_that_watches_no_group_says_so() -> None:
    with TestClient(create_app(_config(None), feed=False)) as client:
        answer = client.get("/api/lag")
        assert answer.status_code == 501 and "no processor group" in answer.json()["error"]
