"""Prometheus metrics of a connector process, and the observer seam that feeds them.

Contract. `ConnectorRuntime(..., observer=metrics)` with a `ConnectorMetrics` counts into
its own `CollectorRegistry` (`registry`, served on `/metrics` by the command line):

  torpor_connector_dispatches_total{kind,tool}  dispatches for this connector taken from the
                                                outbox and journaled (a redelivered one too);
                                                `close_thread` concerns a thread, not a tool: its
                                                tool label is empty, and a kind the schema does not
                                                name is `other` (labels stay bounded whatever a
                                                record on the outbox says)
  torpor_connector_results_total{outcome}       inputs produced to `inputs`: `ok` and `error`
                                                tool results, `event` (subscription events),
                                                `timer_fired`, `approval_request`, `other`;
                                                a stored answer re-sent counts again
  torpor_connector_effects_total{state}         effects the journal moved into each state:
                                                `dispatched` (begun, or re-run after recovery),
                                                `done`, `delivered`, `cancelled`, `unknown`
  torpor_connector_effect_seconds{tool}         histogram: from an effect's `dispatched` to its
                                                `done`, for effects begun by this process
  torpor_connector_effects_running              calls the connector is running now

The runtime calls the `ConnectorObserver` methods on its own event loop's thread, with
what it holds already: the dispatch it took, the record it produces, the effect the
journal wrote (`EffectJournal.on_moved`).
"""

from __future__ import annotations

import time
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter

from torpor.connectors.inprocess import APPROVAL_DECISION, CANCEL, CLOSE_THREAD, INVOKE
from torpor.connectors.journal import Effect, EffectState
from torpor.schemas.records import ApprovalRequest, Dispatch, Input, TimerFired, ToolEvent, ToolResult

# A tool call takes from a millisecond (echo) to a week (a timer): wide buckets.
_EFFECT_BUCKETS: Final = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0, 86400.0)
_KINDS: Final = frozenset({INVOKE, CANCEL, CLOSE_THREAD, APPROVAL_DECISION})


class ConnectorObserver(Protocol):
    """Told what a connector runtime takes, produces and journals (module docstring)."""

    def taken(self, dispatch: Dispatch) -> None: ...

    def sent(self, record: Input) -> None: ...

    def effect_moved(self, effect: Effect) -> None: ...

    def running(self, calls: int) -> None: ...


def outcome_of(record: Input) -> str:
    """The `outcome` label of a record a connector produces."""
    body = record.body
    if isinstance(body, ToolResult):
        return "ok" if body.ok else "error"
    if isinstance(body, ToolEvent):
        return "event"
    if isinstance(body, TimerFired):
        return "timer_fired"
    if isinstance(body, ApprovalRequest):
        return "approval_request"
    return "other"


class ConnectorMetrics:
    """A `ConnectorObserver` counting into a registry of its own (module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or CollectorRegistry()
        self._begun: dict[str, tuple[str, float]] = {}  # request id -> (tool, monotonic start)
        self.dispatches = PromCounter("torpor_connector_dispatches", "Dispatches taken from the outbox.",
                                      ["kind", "tool"], registry=registry)
        self.results = PromCounter("torpor_connector_results", "Inputs produced, by outcome.",
                                   ["outcome"], registry=registry)
        self.effects = PromCounter("torpor_connector_effects", "Effects moved into each journal state.",
                                   ["state"], registry=registry)
        self.effect_seconds = Histogram("torpor_connector_effect_seconds",
                                        "Time from an effect's dispatch to its answer.",
                                        ["tool"], buckets=_EFFECT_BUCKETS, registry=registry)
        self.in_flight = Gauge("torpor_connector_effects_running", "Calls the connector is running.",
                               registry=registry)
        for state in EffectState:  # every state is exported from the start, at 0
            self.effects.labels(state.value)

    def taken(self, dispatch: Dispatch) -> None:
        # The runtime takes only its own tools' dispatches, and close_thread for any tool.
        kind = dispatch.kind if dispatch.kind in _KINDS else "other"
        tool = "" if dispatch.kind == CLOSE_THREAD else dispatch.tool
        self.dispatches.labels(kind, tool).inc()

    def sent(self, record: Input) -> None:
        self.results.labels(outcome_of(record)).inc()

    def effect_moved(self, effect: Effect) -> None:
        self.effects.labels(effect.state.value).inc()
        if effect.state == EffectState.DISPATCHED:
            self._begun[effect.request_id] = (effect.dispatch.tool, time.monotonic())
            return
        begun = self._begun.pop(effect.request_id, None)
        if begun is not None and effect.state == EffectState.DONE:
            tool, started = begun
            self.effect_seconds.labels(tool).observe(time.monotonic() - started)

    def running(self, calls: int) -> None:
        self.in_flight.set(calls)
