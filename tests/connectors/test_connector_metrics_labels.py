"""`ConnectorMetrics` without a broker: what a record on the outbox says cannot grow its
labels, and an effect's latency is measured only from a `dispatched` this process saw."""

from __future__ import annotations

import dataclasses

from tests.connectors.test_journal import answer, dispatch
from torpor.connectors.journal import EffectJournal
from torpor.connectors.metrics import ConnectorMetrics


def _value(metrics: ConnectorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_an_unknown_kind_and_a_close_threads_tool_do_not_become_labels() -> None:
    metrics = ConnectorMetrics()
    metrics.taken(dataclasses.replace(dispatch("rq1", kind="x" * 300), tool="effect"))
    metrics.taken(dataclasses.replace(dispatch("rq2", kind="close_thread"), tool="anything-at-all"))
    metrics.taken(dispatch("rq3"))
    assert _value(metrics, "torpor_connector_dispatches_total", kind="other", tool="effect") == 1
    assert _value(metrics, "torpor_connector_dispatches_total", kind="close_thread", tool="") == 1
    assert _value(metrics, "torpor_connector_dispatches_total", kind="invoke", tool="effect") == 1


def test_effect_latency_is_observed_from_dispatched_to_done_and_every_state_is_exported() -> None:
    metrics = ConnectorMetrics()
    journal = EffectJournal()
    assert _value(metrics, "torpor_connector_effects_total", state="unknown") == 0  # exported at 0
    journal.on_moved = metrics.effect_moved
    journal.begin(dispatch("rq1", "c1"), 1)
    journal.begin(dispatch("rq2", "c2"), 1)
    journal.finish("rq1", answer("rq1", "c1"), 2)
    journal.delivered("rq1", 3)
    journal.cancel("t1", "c2", 4)
    assert _value(metrics, "torpor_connector_effect_seconds_count", tool="effect") == 1
    assert _value(metrics, "torpor_connector_effects_total", state="dispatched") == 2
    assert _value(metrics, "torpor_connector_effects_total", state="cancelled") == 1
    assert metrics.registry.get_sample_value("torpor_connector_effects_total", {"state": "delivered"}) == 1
    metrics.sent(answer("rq1", "c1"))
    assert _value(metrics, "torpor_connector_results_total", outcome="ok") == 1
