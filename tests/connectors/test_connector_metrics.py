"""`torpor connector run-echo --metrics-port`: `/metrics` scraped from a real connector process.

Dispatches go straight to the outbox of a real broker (as a processor's committed
transaction leaves them): two echo calls, one of them redelivered, a slow call and its
cancel, and a call for another connector's tool. The connector's `/metrics` then counts
what it took by kind, the results it produced exactly as the `inputs` topic holds them,
the journal's moves (a redelivered call is not begun twice; the cancelled one is never
done) and the latency of the effects that finished. It logs in JSON (`--log-format json`):
every line it wrote parses, and each dispatch it journaled is logged with its request id.
"""

from __future__ import annotations

import json
import re
from typing import Final

import pytest
from confluent_kafka import Producer

from tests.connectors.test_journal import CAPABILITY
from tests.processors.test_metrics import Samples, exposition, scrape
from tests.processors.test_processor import TORPOR, Deployment, deployment
from tests.test_compose import CONNECTOR_PREFIX, dashboard_metric_names, exported_names
from tests.waiting import wait_until
from torpor.schemas.codec import encode_value
from torpor.schemas.records import Dispatch, ToolResult

pytestmark = pytest.mark.kafka
__all__ = ["deployment"]

WAIT_S: Final = 120.0


def _dispatch(n: int, *, tool: str = "echo", kind: str = "invoke", call: int | None = None,
              delay_s: float = 0.0) -> Dispatch:
    arguments = json.dumps({"text": f"hi {n}", "delay_s": delay_s}) if kind == "invoke" else "{}"
    return Dispatch(request_id=f"rq-{n}", thread_id=f"t-{call or n}", call_id=f"c-{call or n}", tool=tool,
                    arguments=arguments, capability=CAPABILITY, attempt=0, created_at=1, deadline=None,
                    kind=kind)


def _produce(deployment: Deployment, *dispatches: Dispatch) -> None:
    producer = Producer({"bootstrap.servers": deployment.bootstrap, "partitioner": "murmur2_random"})
    for d in dispatches:
        producer.produce(deployment.topic("outbox"), key=d.thread_id.encode(), value=encode_value(d))
    assert producer.flush(30) == 0


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_connector_metrics_count_what_it_took_produced_and_journaled(deployment: Deployment) -> None:
    deployment.start([TORPOR, "connector", "run-echo", "--group", f"conn-{deployment.prefix}",
                      "--journal-dir", str(deployment.root / "journal"), "--metrics-port", "0",
                      "--log-format", "json"], "connector")
    found = wait_until(lambda: re.search(r"metrics on (http://\S+/metrics)", deployment.log("connector")),
                       timeout=WAIT_S, message="the metrics address in the connector's log")
    url = found.group(1)
    slow = _dispatch(3, delay_s=600.0)
    _produce(deployment, _dispatch(1), _dispatch(2), _dispatch(1), slow,
             _dispatch(5, tool="not-mine"))
    # The cancel goes once the slow call runs, so the journal has an effect to cancel.
    wait_until(lambda: _value(scrape(url), "torpor_connector_effects_running") == 1, timeout=WAIT_S,
               message="the slow call to be running")
    _produce(deployment, _dispatch(4, kind="cancel", call=3))

    def settled() -> Samples | None:
        samples = scrape(url)
        results = [i for i in deployment.inputs() if isinstance(i.body, ToolResult)]
        sent = _value(samples, "torpor_connector_results_total", outcome="ok")
        if len(results) < 2 or sent != len(results):
            return None
        if _value(samples, "torpor_connector_effects_total", state="delivered") < 2:
            return None
        if _value(samples, "torpor_connector_effects_total", state="cancelled") < 1:
            return None
        # The gauge is set once per pass of the loop, after the pass's journal writes: a
        # scrape during the pass that cancelled (its sync) sees the cancel, not the gauge.
        if _value(samples, "torpor_connector_effects_running") != 0:
            return None
        return samples

    samples = wait_until(settled, timeout=WAIT_S,
                         message=lambda: f"/metrics to settle; log:\n{deployment.log('connector')[-2000:]}")
    assert _value(samples, "torpor_connector_dispatches_total", kind="invoke", tool="echo") == 4
    assert _value(samples, "torpor_connector_dispatches_total", kind="cancel", tool="echo") == 1
    assert _value(samples, "torpor_connector_dispatches_total", kind="invoke", tool="not-mine") == 0
    # The redelivered call was not run again: two answers, as the inputs topic holds them.
    assert _value(samples, "torpor_connector_results_total", outcome="ok") == 2
    assert _value(samples, "torpor_connector_results_total", outcome="error") == 0
    assert _value(samples, "torpor_connector_effects_total", state="dispatched") == 3
    assert _value(samples, "torpor_connector_effects_total", state="done") == 2
    assert _value(samples, "torpor_connector_effects_total", state="delivered") == 2
    assert _value(samples, "torpor_connector_effects_total", state="cancelled") == 1
    assert _value(samples, "torpor_connector_effects_total", state="unknown") == 0
    assert _value(samples, "torpor_connector_effect_seconds_count", tool="echo") == 2
    assert _value(samples, "torpor_connector_effects_running") == 0
    # compose/'s Grafana dashboard asks only for what a connector really serves.
    wanted = {n for n in dashboard_metric_names() if n.startswith(CONNECTOR_PREFIX)}
    assert wanted and wanted <= exported_names(exposition(url)), wanted - exported_names(exposition(url))
    lines = [json.loads(line) for line in deployment.log("connector").splitlines()]
    journaled = [line for line in lines if "journaled" in line["message"]]
    assert len(journaled) == 5, journaled
    assert all(line["request_id"] and line["thread_id"] for line in journaled), journaled
