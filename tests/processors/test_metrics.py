"""`torpor processor --metrics-port`: `/metrics` scraped from a real processor process.

A processor against a real broker folds applied inputs, a duplicate, a control to a
thread that does not exist, a poison record and a park; its `/metrics` then counts the
inputs by disposition exactly as the `receipts` topic holds them, the dispatch and the
completions it produced (with their provider, latency and tokens), its committed
checkpoints with their commit latency, the one parked thread, and, per owned partition,
its consumer lag (none left once caught up) and its store's size.
"""

from __future__ import annotations

import re
import urllib.request
import uuid
from collections import Counter
from dataclasses import replace
from typing import Final

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.processors.test_processor import PARTITIONS, Deployment, _conversation, _input, deployment
from tests.test_compose import CONNECTOR_PREFIX, dashboard_metric_names, exported_names
from tests.waiting import wait_until
from torpor.schemas.records import Control, Input

pytestmark = pytest.mark.kafka
__all__ = ["deployment"]  # the fixture, shared with the processor's tests

WAIT_S: Final = 120.0
EXPECTED_RECEIPTS: Final = 10


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A scrape: (sample name, its labels sorted) -> value."""


def exposition(url: str) -> str:
    """The text `url` serves now."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text: str = response.read().decode()
    return text


def scrape(url: str) -> Samples:
    """Every sample `url` serves now."""
    text = exposition(url)
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _inputs(samples: Samples) -> Counter[str]:
    counted: Counter[str] = Counter()
    for (name, labels), value in samples.items():
        if name == "torpor_inputs_total" and value:
            label = dict(labels)
            key = label["disposition"] + (f":{label['reason']}" if label["reason"] else "")
            counted[key] += int(value)
    return counted


def _operator(thread: str, at: int, control: Control) -> Input:
    return replace(_input(thread, f"m-{uuid.uuid4().hex}", at, control), source="operator:test")


def test_the_metrics_endpoint_counts_what_the_receipts_say(deployment: Deployment) -> None:
    working, parked = f"metrics-{uuid.uuid4().hex[:8]}", f"parked-{uuid.uuid4().hex[:8]}"
    create, ping = _conversation(working, "please ping")
    deployment.send(create, ping, ping)  # the second is a duplicate
    deployment.send(*_conversation(parked, "hello"))
    deployment.send(_operator(f"nobody-{uuid.uuid4().hex[:8]}", 3_000, Control("stop", None, None, None)))
    deployment.send_raw(working.encode(), b"not an input at all")
    deployment.start(deployment.processor_args("p0", "--metrics-port", "0"), "processor")
    found = wait_until(lambda: re.search(r"metrics on (http://\S+/metrics)", deployment.log("processor")),
                       timeout=WAIT_S, message="the metrics address in the processor's log")
    url = found.group(1)
    # The park goes once the thread has answered, so the gauge sees a thread that was idle.
    wait_until(lambda: any(r.thread_id == parked and r.turn_commit for r in deployment.receipts()),
               timeout=WAIT_S, message="the thread to be parked to answer first")
    deployment.send(_operator(parked, 4_000, Control("park", None, None, "metrics")))

    def settled() -> tuple[Counter[str], Samples] | None:
        receipts = Counter(r.disposition for r in deployment.receipts())
        samples = scrape(url)
        if sum(receipts.values()) < EXPECTED_RECEIPTS or _inputs(samples) != receipts:
            return None
        return receipts, samples

    receipts, samples = wait_until(settled, timeout=WAIT_S,
                                   message=lambda: f"/metrics to match the receipts; log:\n"
                                           f"{deployment.log('processor')[-2000:]}")
    assert receipts["applied"] >= 6 and receipts["duplicate"] == 1 and receipts["parked"] == 1, receipts
    assert receipts["rejected:unknown_thread"] == 1, receipts
    assert samples[("torpor_dispatches_total", ())] == 1  # the echo call of "please ping"
    scripted_ok = (("outcome", "ok"), ("provider", "scripted"))
    assert samples[("torpor_completions_total", scripted_ok)] == 2
    assert samples[("torpor_model_seconds_count", scripted_ok)] == 2
    assert samples[("torpor_model_tokens_total", (("direction", "input"), ("provider", "scripted")))] >= 0
    assert samples[("torpor_parked_threads", ())] == 1
    assert samples[("torpor_checkpoint_commit_seconds_count", ())] >= 1
    assert samples[("torpor_checkpoint_commit_seconds_sum", ())] > 0
    # One instance owns every partition; each has a store on disk and a lag (a transaction
    # marker at a partition's end counts as 1: Kafka's own definition of lag).
    partitions = [str(p) for p in range(PARTITIONS)]
    for partition in partitions:
        assert samples[("torpor_store_bytes", (("partition", partition),))] > 0
    # The caches' fill, read from the caches: the stores have written rows and memtables,
    # the stage has decoded the histories of its two completions.
    assert samples[("torpor_cache_bytes", (("cache", "rows"),))] > 0
    assert samples[("torpor_cache_bytes", (("cache", "memtables"),))] > 0
    assert samples[("torpor_cache_bytes", (("cache", "block"),))] >= 0
    assert samples[("torpor_history_cache_entries", ())] >= 2
    lags = [samples[("torpor_consumer_lag", (("partition", p),))] for p in partitions]
    assert all(0 <= lag <= 1 for lag in lags), lags
    # compose/'s Grafana dashboard asks only for what a processor really serves.
    wanted = {n for n in dashboard_metric_names() if not n.startswith(CONNECTOR_PREFIX)}
    assert wanted <= exported_names(exposition(url)), wanted - exported_names(exposition(url))
