"""Attacks on two store changes (review 20): a deleted thread keeps its seen rows, and a
thread's config is a row of its own (`len|thread|F`) beside its state row.

A reader beside the folding thread must never see a state row and a config row of two
moments; a replay must compare a store written before either change as equal (or tell
where it differs); an applied input stays spent however many other senders reuse its id."""

from __future__ import annotations

import dataclasses

import pytest

from tests.processors.fold_scenarios import config, control, create, user
from tests.processors.test_statecodec import second_form_row
from torpor.processors.fold.state import Status
from torpor.processors.replay import compare, thread_heads
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys, statecodec
from torpor.processors.store.kv import Change, MemoryStore
from torpor.processors.store.tables import load_state
from torpor.schemas.records import Input


def _in(message_id: str, at: int, body: object, source: str = "user:u") -> Input:
    return Input(message_id, "t1", at, source, None, None, None, body)  # type: ignore[arg-type]


def _copy(store: MemoryStore) -> MemoryStore:
    clone = MemoryStore()
    clone.apply(list(store.iterate(b"")))
    return clone


class _Tearing(MemoryStore):
    """A store another thread commits to between two point reads: right after the first read
    of the thread's state row, the batch `pending` lands (the model stage reads the RocksDB
    store while the processor's loop applies checkpoints; two `get`s are no snapshot)."""

    def __init__(self, base: MemoryStore, pending: list[Change]) -> None:
        super().__init__()
        self.apply(list(base.iterate(b"")))
        self._pending: list[Change] | None = pending

    def get(self, key: bytes) -> bytes | None:
        value = super().get(key)
        if key == keys.state_key("t1") and self._pending is not None:
            pending, self._pending = self._pending, None
            self.apply(pending)
        return value


def _awaiting_model() -> MemoryStore:
    store = MemoryStore()
    out = step(store, [StepRecord(_in("m1", 5, create(config())), 0, 0)])
    assert [r.disposition for r in out.receipts] == ["applied"]
    state = load_state(store, "t1")
    assert state is not None and state.status is Status.AWAITING_MODEL
    return store


def test_a_state_read_torn_by_a_deletion_is_the_old_state_or_none_never_an_error() -> None:
    """8ad44e7: `load_state` reads S then F in two gets. Before, the S row alone held the
    state, so a reader racing a commit got the old state or the new one. Now a deletion
    committed between the two gets leaves S (old) and no F: `decode_state` raises
    ValueError ("a state row without its config inline, and no config row") in the model
    stage's `_prepare`/`resume`, or in metrics' `_is_parked`."""
    store = _awaiting_model()
    delete = _in("m2", 6, control("delete", reason="x"), "operator:o")
    deletion = step(_copy(store), [StepRecord(delete, 0, 1)])
    assert [r.disposition for r in deletion.receipts] == ["applied"]
    torn = _Tearing(store, list(deletion.changes))
    state = load_state(torn, "t1")  # raises ValueError today
    assert state is None or state.status is Status.AWAITING_MODEL


def test_a_state_read_torn_by_a_deletion_and_a_creation_never_mixes_two_lives() -> None:
    """The same race with the thread created again (another config) in the committed batch:
    the reader gets life 1's state (awaiting the model, its pending request) with life 2's
    config (its system prompt, tools, capability): the model stage would call the model for
    life 1's request with life 2's prompt and tools."""
    store = _awaiting_model()
    first = load_state(store, "t1")
    assert first is not None
    second_config = dataclasses.replace(config(), system_prompt="Life two: another tenant's prompt.")
    batch = step(_copy(store), [
        StepRecord(_in("m2", 6, control("delete", reason="x"), "operator:o"), 0, 1),
        StepRecord(_in("m3", 7, create(second_config)), 0, 2),
    ])
    assert [r.disposition for r in batch.receipts] == ["applied", "applied"]
    torn = _Tearing(store, list(batch.changes))
    state = load_state(torn, "t1")
    assert state is not None
    # One life or the other, never life 1's request under life 2's config:
    assert (state.pending_request == first.pending_request) == (state.config == first.config), (
        state.pending_request, state.config.system_prompt)


@pytest.mark.parametrize("before", ["the config row", "the answered row"])
def test_replay_of_a_store_last_written_before_a_side_row_compares_equal(before: str) -> None:
    """8ad44e7 reads state rows of the older form (config inline, no F row) and rewrites them
    at the thread's next input; `torpor replay` compares every row of a thread byte for byte
    (`thread_head`'s digest): a thread idle since the upgrade is reported as a mismatch.
    The same for the answered row (`WITHOUT_ANSWERED`): a row of the second form, no A row."""
    records = [StepRecord(_in("m1", 5, create(config())), 0, 0),
               StepRecord(_in("m2", 6, user("hi")), 0, 1)]
    live = MemoryStore()
    step(live, records)
    state = load_state(live, "t1")
    assert state is not None
    if before == "the config row":  # as the processor before 8ad44e7 wrote it
        live.apply(((keys.state_key("t1"), statecodec.encode(state)), (keys.config_key("t1"), None),
                    (keys.answered_key("t1"), None)))
    else:  # as it wrote it before the answered row: the config apart, the answered ids inline
        live.apply(((keys.state_key("t1"), second_form_row(state)), (keys.answered_key("t1"), None)))
    statecodec._STATES._by_thread.clear()  # a process that never wrote the rows it reads
    assert load_state(live, "t1") == state  # read as the same state
    replayed = MemoryStore()
    step(replayed, records)
    assert compare(thread_heads({0: replayed}), thread_heads({0: live})) == []


def test_replay_compares_the_seen_rows_a_deleted_thread_keeps() -> None:
    """83cddbf makes a deleted thread's seen rows load-bearing (they decide whether a copy of
    its creation is a duplicate or creates it again), but a list of the threads with a state
    row would never compare a deleted thread. A live store written before
    83cddbf (deleted threads forgot their seen rows) and its replay differ in what a captured
    creation does, and `compare` says nothing."""
    creation = _in("m1", 5, create(config()))
    records = [StepRecord(creation, 0, 0),
               StepRecord(_in("m2", 6, control("delete", reason="x"), "operator:o"), 0, 1)]
    live, replayed = MemoryStore(), MemoryStore()
    step(live, records)
    step(replayed, records)
    # As a processor before 83cddbf left it: no row of the deleted thread at all.
    live.apply([(k, None) for k, _ in list(live.iterate(keys.thread_prefix("t1")))])
    again = StepRecord(creation, 0, 2)
    live_says = [r.disposition for r in step(_copy(live), [again]).receipts]
    replay_says = [r.disposition for r in step(_copy(replayed), [again]).receipts]
    assert live_says != replay_says  # the stores judge the same copy differently
    assert compare(thread_heads({0: replayed}), thread_heads({0: live})) != []


# --- held against review 20's attacks ---------------------------------------------------


def test_a_thread_created_again_with_another_config_and_the_same_state_row_serves_the_new_config() -> None:
    """S rows byte-identical across lives (no history, no initial text): F and the memo tell them apart."""
    store = MemoryStore()
    a = dataclasses.replace(config(), system_prompt="life one")
    b = dataclasses.replace(config(), system_prompt="life two")
    step(store, [StepRecord(_in("m1", 5, create(a, initial=None)), 0, 0)])
    first_row = store.get(keys.state_key("t1"))
    step(store, [StepRecord(_in("m2", 6, control("delete", reason="x"), "operator:o"), 0, 1),
                 StepRecord(_in("m3", 5, create(b, initial=None)), 0, 2)])
    assert store.get(keys.state_key("t1")) == first_row  # the very same S row
    state = load_state(store, "t1")
    assert state is not None and state.config.system_prompt == "life two"
    step(store, [StepRecord(_in("m4", 7, user("hi")), 0, 3)])
    state = load_state(store, "t1")
    assert state is not None and state.config.system_prompt == "life two"
    assert store.get(keys.config_key("t1")) == statecodec.encode_state(state)[1]
    assert decode_fresh(store).config.system_prompt == "life two"


def decode_fresh(store: MemoryStore):  # type: ignore[no-untyped-def]
    raw, cfg, answered = (store.get(row("t1"))
                          for row in (keys.state_key, keys.config_key, keys.answered_key))
    assert raw is not None
    return statecodec.decode_state(raw, cfg, answered)  # no thread id: the memo is not asked


@pytest.mark.pure_only  # replaces step's `_size_problem`: compiled, step calls its own
def test_a_fold_that_raises_after_encoding_and_a_too_large_refusal_leave_the_rows_consistent(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torpor.processors.step as step_module
    store = MemoryStore()
    real = step_module._size_problem
    calls = {"n": 0}

    def flaky(rows, thread_id, out):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] in (1, 3):
            raise RuntimeError("after encode")
        if calls["n"] == 5:
            return "too large (forced)"
        return real(rows, thread_id, out)

    monkeypatch.setattr(step_module, "_size_problem", flaky)
    out = step(store, [StepRecord(_in("m1", 5, create(config())), 0, 0),       # raise, then ok (2)
                       StepRecord(_in("m2", 6, user("hi")), 0, 1),             # raise (3), ok (4)
                       StepRecord(_in("m3", 7, user("again")), 0, 2),          # refused (5)
                       StepRecord(_in("m4", 8, user("third")), 0, 3)])         # ok (6)
    assert out.receipts[0].disposition == "applied"
    state = load_state(store, "t1")
    assert state is not None and state == decode_fresh(store)
    assert store.get(keys.config_key("t1")) == statecodec.encode_state(state)[1]


def test_a_deleted_threads_applied_input_stays_spent_whatever_eight_other_senders_do() -> None:
    """docs/security.md (83cddbf): "every input it applied stays spent ... whether the thread is
    gone or was created anew". A seen row keeps the last `SENDERS_KEPT` (8) senders of an id:
    eight inputs of the new life under the id of life 1's operator stop, from eight sources a
    tenant's gateway key may sign (`user:*`), push the operator's digest out, and the
    captured stop, produced again byte for byte, stops the new life (review 19's finding 1).
    The same eviction works on a live thread (a user's captured message applied twice)."""
    from tests.processors.authority_rig import Rig
    from tests.processors.test_deleted_threads import OPERATOR, _again, _captured, _deleted
    from torpor.schemas.records import Control

    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    rig.complete("hi")
    stopped = rig.send(control("stop", reason="first life"), OPERATOR, message_id="op-stop")
    assert stopped.disposition == "applied"
    stop = _captured(rig, "t", Control)
    _deleted(rig)
    assert rig.send(create(config()), "user:alice", message_id="t-create-2").disposition == "applied"
    rig.complete("hi again")
    for n in range(8):
        said = rig.send(user(f"hello {n}"), f"user:x{n}", key_id="gateway-acme", message_id="op-stop")
        assert said.disposition != "duplicate", said
        if rig.state() is not None and rig.state().pending_request is not None:  # type: ignore[union-attr]
            rig.complete("ok")
    again = _again(rig, stop)
    assert again.disposition == "duplicate", (again.disposition, again.reason)
