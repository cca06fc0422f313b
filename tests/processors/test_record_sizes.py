"""No input can make a record Kafka refuses (finding F8 of the review of issue 16).

A record over the producer's `message.max.bytes` fails the checkpoint: the processor
exits, its successor folds the same input and fails again, and the partition stops. The
bounds of `torpor.streams.config` (`RECORD_MAX_BYTES` and what derives from it) keep every
record under it: the door parks inputs over `TORPOR_MAX_INPUT_BYTES` (at most the
ceiling), `step` refuses whole any input whose rows or loopbacks would be too large or
whose holding would grow a waiting thread's state past its bound, a child inherits only
the history that fits one input, and the model stage and the connectors answer with an
error instead of sending an answer the door would park (the call would wait forever).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.processors.authority_rig import Rig
from tests.processors.fold_scenarios import SEARCH, call, completion, config, control, create, result, user
from tests.processors.test_stage import Sink, thread_awaiting_model
from torpor.processors.admission import size_problem
from torpor.processors.fold.authority import PUBLIC_TENANT
from torpor.processors.fold.state import ANSWERED_KEPT, Status, with_answered
from torpor.processors.models.provider import ScriptedModel, ScriptedTurn, ScriptRule
from torpor.processors.models.stage import COMPLETION_MAX_BYTES, ModelStage, StageConfig
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore
from torpor.schemas.codec import encode_value
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Capability, Completion, CompletionError, CreateThread, Input, ThreadConfig
from torpor.streams.config import (
    MAX_INPUT_BYTES_CEILING,
    RECORD_MAX_BYTES,
    ROW_MAX_BYTES,
    STATE_HOLD_MAX_BYTES,
    InputSettings,
    Settings,
    producer_config,
)


def _public(max_turns: int | None = None) -> ThreadConfig:
    base = config(tools=(SEARCH,), granted=(), max_turns=max_turns)
    return dataclasses.replace(base, capability=Capability(tenant=PUBLIC_TENANT, tools=(), scopes=(),
                                                           expires_at=None))


def _largest_row(rig: Rig) -> int:
    return max(len(value) for _, value in rig.store.iterate(b""))


# --- the bounds themselves ------------------------------------------------------------


def test_the_bounds_nest_under_the_record_a_producer_sends() -> None:
    assert producer_config(Settings())["message.max.bytes"] == RECORD_MAX_BYTES
    assert STATE_HOLD_MAX_BYTES + MAX_INPUT_BYTES_CEILING < ROW_MAX_BYTES < RECORD_MAX_BYTES
    assert COMPLETION_MAX_BYTES < MAX_INPUT_BYTES_CEILING


def test_an_input_limit_above_the_ceiling_is_a_clear_config_error() -> None:
    assert InputSettings(max_bytes=MAX_INPUT_BYTES_CEILING).max_bytes == MAX_INPUT_BYTES_CEILING
    with pytest.raises(ConfigError, match=f"between 1 and {MAX_INPUT_BYTES_CEILING}.*TORPOR_MAX_INPUT_BYTES"):
        InputSettings(max_bytes=1_048_576)


def test_the_door_parks_by_size_the_same_way_before_and_after_decoding() -> None:
    limit = 1_000
    assert size_problem(limit, limit, None) is None and size_problem(limit, limit, "user:u") is None
    # Over the configured limit: only known once decoded, and the processor's own inputs pass.
    assert size_problem(limit + 1, limit, None) is None
    assert "TORPOR_MAX_INPUT_BYTES" in (size_problem(limit + 1, limit, "user:u") or "")
    assert size_problem(limit + 1, limit, "processor") is None
    # Over the ceiling: parked undecoded, whoever claims to send it.
    for source in (None, "processor", "user:u"):
        assert "any input may have" in (size_problem(MAX_INPUT_BYTES_CEILING + 1, limit, source) or "")


# --- step refuses whole ---------------------------------------------------------------


def test_an_input_whose_history_row_kafka_would_refuse_is_refused_whole_and_the_thread_goes_on() -> None:
    """Anything up to the broker's topic limit can reach `step` (a replay of an old log, a
    record under a raised limit): its history row and event would be too large to produce."""
    rig = Rig()
    assert rig.send(create(_public()), "user:owner", None).disposition == "applied"
    rig.complete("hi")
    before = rig.state()
    record = rig.envelope(user("A" * 1_040_000), "user:anyone")
    out = rig.fold(StepRecord(record))
    [receipt] = out.receipts
    assert receipt.disposition == "rejected:too_large"
    assert receipt.reason is not None and f"more than {ROW_MAX_BYTES}" in receipt.reason
    assert out.changes == () and out.events == () and out.completions == ()
    assert rig.state() == before and _largest_row(rig) <= ROW_MAX_BYTES
    # The same bytes again: the same verdict (nothing was remembered), and the thread still runs.
    assert rig.fold(StepRecord(record)).receipts[0].disposition == "rejected:too_large"
    assert rig.send(user("a normal question"), "user:anyone", None).disposition == "applied"
    assert rig.state().status is Status.AWAITING_MODEL  # type: ignore[union-attr]


def test_a_parked_thread_holds_inputs_up_to_its_bound_then_refuses_them_with_a_reason() -> None:
    """A keyless stranger writes to a parked public thread: held inputs live in its state
    row, which stays under its bound; the operator's unpark and the model's answer still fit."""
    rig = Rig()
    assert rig.send(create(_public()), "user:owner", None).disposition == "applied"
    error = CompletionError(kind="rate_limited", message="429", attempts=5)
    state = rig.state()
    assert state is not None and state.pending_request is not None
    assert rig.send(completion(state.pending_request, error=error), "processor",
                    message_id=state.pending_request).disposition == "parked"
    dispositions = [rig.send(user(f"{n}" + "B" * 200_000), "user:stranger", None).disposition
                    for n in range(4)]
    assert dispositions == ["parked", "parked", "rejected:too_large", "rejected:too_large"], dispositions
    refused = rig.receipts[-1]
    assert refused.reason is not None and "holds too many inputs" in refused.reason
    state_row = rig.store.get(keys.state_key("t"))
    assert state_row is not None and len(state_row) <= STATE_HOLD_MAX_BYTES
    # The operator unparks: the two held inputs run, and the model's answer is folded.
    assert rig.send(control("unpark"), "operator:ops").disposition == "applied"
    assert rig.complete("answered both").disposition == "applied"
    held = [b for b in rig.history() if getattr(b, "content", None) and "B" * 100 in str(b)]
    assert len(held) == 2
    assert _largest_row(rig) <= ROW_MAX_BYTES


@given(st.lists(st.text(min_size=1, max_size=8), max_size=3 * ANSWERED_KEPT))
def test_a_thread_remembers_a_bounded_window_of_answered_calls(call_ids: list[str]) -> None:
    answered: tuple[str, ...] = ()
    for call_id in call_ids:
        answered = with_answered(answered, call_id)
        assert answered[-1] == call_id and len(answered) <= ANSWERED_KEPT
    assert list(answered) == call_ids[-ANSWERED_KEPT:]


def test_a_long_lived_thread_answering_many_calls_keeps_a_bounded_state_row() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    for n in range(ANSWERED_KEPT + 40):
        call_id = f"call-{n:05d}-" + "x" * 40
        assert rig.complete("", (call(call_id, "search", {"q": "x"}),)).disposition == "applied"
        [dispatch] = [d for d in rig.dispatches if d.call_id == call_id]
        assert rig.send(result(call_id, dispatch.request_id), "connector:tools").disposition == "applied"
    state = rig.state()
    assert state is not None and len(state.answered_calls) == ANSWERED_KEPT
    assert state.answered_calls[-1] == call_id
    # A late copy of a result whose call left the window is stale: absorbed, as a duplicate is.
    first = next(d for d in rig.dispatches if d.call_id.startswith("call-00000-"))
    assert rig.send(result(first.call_id, first.request_id), "connector:tools").disposition == "stale"


def test_a_child_inherits_only_the_most_recent_history_that_fits_one_input() -> None:
    rig = Rig()
    assert rig.send(create(_public()), "user:owner", None).disposition == "applied"
    for n in range(6):  # about 1.2 MB of history, five times what one input may carry
        rig.complete(f"answer {n}")
        assert rig.send(user(f"question {n} " + "Q" * 200_000), "user:anyone", None).disposition == "applied"
    rig.complete("", (call("s1", "spawn_thread", {"instructions": "summarise"}),))
    [creation] = [i for i in rig.loopbacks if isinstance(i.body, CreateThread)]
    assert isinstance(creation.body, CreateThread)
    assert len(encode_value(creation)) <= MAX_INPUT_BYTES_CEILING
    inherited = creation.body.inherited
    assert 0 < len(inherited) < rig.state().history_len  # type: ignore[union-attr]
    # The most recent entries, in order, up to the spawning turn.
    assert [e.seq for e in inherited] == list(range(inherited[0].seq, inherited[-1].seq + 1))
    assert inherited[-1].seq == rig.state().history_len - 2  # type: ignore[union-attr]
    receipts = rig.deliver_loopbacks()
    assert [r.disposition for r in receipts if r.thread_id == creation.thread_id] == ["applied"]


# --- the processor's own answers and the connectors' ------------------------------------


def test_a_model_answer_too_large_for_one_input_becomes_an_error_completion() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = Sink()
    huge = ScriptedTurn(chunks=("Z" * (COMPLETION_MAX_BYTES + 1),))

    async def go() -> None:
        stage = ModelStage(store, ScriptedModel([ScriptRule(turns=(huge,))]), sink, lambda: 5_000,
                           StageConfig(backoff_initial_s=0.001, backoff_max_s=0.002, max_attempts=3))
        stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    [answer] = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is not None
    assert answer.body.error.kind == "permanent" and answer.body.error.attempts == 1
    assert f"more than the {COMPLETION_MAX_BYTES}" in answer.body.error.message
    assert len(encode_value(answer)) < COMPLETION_MAX_BYTES
    out = step(store, [StepRecord(answer, 0, 1)])
    assert [r.disposition for r in out.receipts] == ["parked"]  # an error completion parks, visibly


def test_a_forged_processor_input_gains_nothing_from_the_doors_exemption() -> None:
    """Over `TORPOR_MAX_INPUT_BYTES` only the processor's inputs pass the door; a stranger
    claiming to be the processor passes the door and is refused by the verifier."""
    rig = Rig()
    assert rig.send(create(_public()), "user:owner", None).disposition == "applied"
    state = rig.state()
    assert state is not None and state.pending_request is not None
    forged = Input(message_id=state.pending_request, thread_id="t", created_at=1, source="processor",
                   expires_at=None, key_id=None, signature=None,
                   body=completion(state.pending_request, "W" * 100_000))
    assert size_problem(len(encode_value(forged)), 1_000, forged.source) is None
    [receipt] = rig.fold(StepRecord(forged)).receipts
    assert receipt.disposition.startswith("rejected:") and receipt.disposition != "rejected:too_large"
    assert json.loads(json.dumps(receipt.reason)) is not None
