"""`step`: the fold's batch entry point, interpreting every effect over a store."""

from __future__ import annotations

import pytest

from tests.processors.fold_scenarios import call, completion, config, control, create, user
from torpor.processors import step as step_module
from torpor.processors.fold.state import Status, ThreadState
from torpor.processors.fold.verify import SourceVerifier
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore, Overlay, Store
from torpor.processors.store.statecodec import decode_entry
from torpor.processors.store.tables import awaiting_requests, load_state, read_entries, visible_entries
from torpor.schemas.records import (
    FORGED,
    UNSIGNED,
    CreateThread,
    HistoryEntry,
    Input,
    InputBody,
    SummaryEntry,
    TextBlock,
    UserEntry,
)
from torpor.schemas.signing import Verdict


def envelope(
    message_id: str, body: InputBody, thread: str = "t1", source: str = "user:u", at: int = 1_000
) -> Input:
    return Input(message_id, thread, at, source, None, None, None, body)


class Feed:
    """Numbers the inputs of one partition, as a consumer would read them."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self, *inputs: Input) -> list[StepRecord]:
        records = []
        for item in inputs:
            records.append(StepRecord(item, partition=0, offset=self.offset))
            self.offset += 1
        return records


def created(store: Store, feed: Feed) -> StepOutput:
    return step(store, feed(envelope("m-create", create())))


def test_create_writes_state_history_seen_and_the_awaiting_index() -> None:
    store, feed = MemoryStore(), Feed()
    out = created(store, feed)
    assert [r.disposition for r in out.receipts] == ["applied"]
    assert (out.receipts[0].input_partition, out.receipts[0].input_offset) == (0, 0)
    state = load_state(store, "t1")
    assert state is not None and state.status is Status.AWAITING_MODEL
    seen = store.get(keys.seen_key("t1", "m-create"))  # the digest of the input that took the id
    assert seen is not None and len(seen) == 16
    assert [e.seq for e in read_entries(store, "t1")] == list(range(state.history_len))
    (request,) = out.completions
    assert request.request_id == state.pending_request
    assert list(awaiting_requests(store)) == [request]
    # The changes are exactly the rows now in the store (they double as the changelog).
    assert all(store.get(k) == v for k, v in out.changes)


def test_a_completion_commits_the_turn_and_clears_the_awaiting_index() -> None:
    store, feed = MemoryStore(), Feed()
    (request,) = created(store, feed).completions
    answer = envelope(request.request_id, completion(request.request_id, "hello back"), source="processor")
    out = step(store, feed(answer))
    assert [r.disposition for r in out.receipts] == ["applied"]
    state = load_state(store, "t1")
    assert state is not None and state.status is Status.IDLE
    assert list(awaiting_requests(store)) == []
    assert (keys.awaiting_model_key("t1"), None) in out.changes


def test_a_redelivered_input_is_a_duplicate_and_writes_no_history() -> None:
    store, feed = MemoryStore(), Feed()
    created(store, feed)
    before = load_state(store, "t1")
    out = step(store, feed(envelope("m-create", create())))
    assert [r.disposition for r in out.receipts] == ["duplicate"]
    assert not any(k.startswith(keys.history_prefix("t1")) for k, _ in out.changes)
    assert load_state(store, "t1") == before


def test_writes_stay_in_the_overlay_until_it_commits() -> None:
    base, feed = MemoryStore(), Feed()
    overlay = Overlay(base)
    out = created(overlay, feed)
    assert len(base) == 0 and overlay.changes() == out.changes
    overlay.commit()
    assert load_state(base, "t1") is not None


@pytest.mark.pure_only  # replaces step's `fold`: compiled, step calls its own
def test_a_fold_that_keeps_raising_is_retried_then_parked(monkeypatch: pytest.MonkeyPatch) -> None:
    store, feed = MemoryStore(), Feed()
    created(store, feed)
    calls: list[int] = []
    real = step_module.fold

    def broken(state, item, facts):  # type: ignore[no-untyped-def]
        if item.message_id == "m-poison":
            calls.append(facts.attempt)
            raise RuntimeError("boom")
        return real(state, item, facts)

    monkeypatch.setattr(step_module, "fold", broken)
    out = step(
        store, feed(envelope("m-poison", user("hi")), envelope("m-after", user("still here"))), max_attempts=3
    )
    assert calls == [0, 1, 2]
    assert [r.disposition for r in out.receipts] == ["parked", "parked"]
    assert out.receipts[0].retry_count == 3 and "boom" in (out.receipts[0].reason or "")
    assert [(r.input_partition, r.input_offset) for r in out.receipts] == [(0, 1), (0, 2)]
    assert [p.record.input.message_id for p in out.parked] == ["m-poison"]
    state = load_state(store, "t1")
    assert state is not None and state.status is Status.PARKED


@pytest.mark.pure_only  # replaces step's `fold`: compiled, step calls its own
def test_a_fold_that_fails_once_succeeds_on_retry_with_the_attempt_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, feed = MemoryStore(), Feed()
    real = step_module.fold
    failures = iter([True])

    def flaky(state, item, facts):  # type: ignore[no-untyped-def]
        if next(failures, False):
            raise OSError("transient")
        return real(state, item, facts)

    monkeypatch.setattr(step_module, "fold", flaky)
    out = created(store, feed)
    assert [r.disposition for r in out.receipts] == ["applied"] and out.receipts[0].retry_count == 1
    assert out.parked == ()


def test_spawn_child_reads_the_parents_history_from_the_store() -> None:
    store, feed = MemoryStore(), Feed()
    (request,) = created(store, feed).completions
    spawn = call("c1", "spawn_thread", {"instructions": "look around"})
    out = step(
        store,
        feed(envelope(request.request_id, completion(request.request_id, "", (spawn,)), source="processor")),
    )
    (child,) = [i for i in out.loopbacks if isinstance(i.body, CreateThread)]
    assert isinstance(child.body, CreateThread)
    parent_rows = list(read_entries(store, "t1"))
    assert child.body.inherited == tuple(parent_rows[: len(child.body.inherited)])
    assert child.body.inherited  # the child starts with the conversation so far
    assert child.body.config.parent is not None and child.body.config.parent.parent_thread_id == "t1"


def test_model_visible_history_starts_at_the_latest_summary() -> None:
    store = MemoryStore()
    overlay = Overlay(store)

    def entry(seq: int, body: UserEntry | SummaryEntry) -> HistoryEntry:
        return HistoryEntry(seq=seq, created_at=seq, input_id=f"m{seq}", body=body)

    said = [entry(i, UserEntry((TextBlock(f"line {i}"),), False)) for i in range(5)]
    summary = entry(5, SummaryEntry("the gist of 0..2", up_to_seq=3))
    from torpor.processors.store.statecodec import encode_entry

    for item in (*said, summary):
        overlay.put(keys.history_key("t1", item.seq), encode_entry(item))
    overlay.put(keys.summary_key("t1"), keys.encode_seq(5))
    seen = visible_entries(overlay, "t1", 0, 6)
    assert [e.seq for e in seen] == [5, 3, 4]
    assert [e.seq for e in visible_entries(overlay, "t1", 0, 4)] == [0, 1, 2, 3]  # summary out of range
    assert decode_entry(overlay.get(keys.history_key("t1", 5)) or b"") == summary


def test_deleting_a_thread_tombstones_every_row_but_its_seen_rows() -> None:
    store, feed = MemoryStore(), Feed()
    created(store, feed)
    out = step(store, feed(envelope("m-delete", control("delete"), source="operator:o")))
    assert [r.disposition for r in out.receipts] == ["applied"]
    assert load_state(store, "t1") is None
    left = [
        k
        for k, _ in store.iterate(keys.thread_prefix("t1"))
        if not k.startswith(keys.thread_prefix("t1") + keys.SEEN)
    ]
    assert left == []
    seen = keys.thread_prefix("t1") + keys.SEEN
    assert [k for k, _ in store.iterate(seen)], "seen rows stay: a copy of an applied input is a duplicate"
    assert not [k for k, v in out.changes if k.startswith(seen) and v is None]
    assert (keys.state_key("t1"), None) in out.changes


def test_the_verifier_decides_provenance() -> None:
    class Forged:
        def verify(self, record: Input, state: ThreadState | None, at: int | None = None) -> Verdict:
            return Verdict(FORGED, "bad_signature")

    out = step(MemoryStore(), Feed()(envelope("m1", create())), verifier=Forged())
    assert [(r.disposition, r.reason) for r in out.receipts] == [("rejected:forged", "bad_signature")]
    verdict = SourceVerifier().verify(envelope("m2", user("x"), source="connector:c"), None)
    assert (verdict.provenance, verdict.reason) == (UNSIGNED, "no_keyring")


def test_replaying_the_same_inputs_writes_the_same_bytes() -> None:
    def run(store: Store) -> tuple[tuple[bytes, bytes | None], ...]:
        feed = Feed()
        (request,) = created(store, feed).completions
        out = step(
            store,
            feed(
                envelope(request.request_id, completion(request.request_id, "hi"), source="processor"),
                envelope("m-user", user("more"), at=2_000),
            ),
        )
        return out.changes

    assert run(MemoryStore()) == run(MemoryStore())


def test_an_unknown_thread_gets_a_rejection_receipt_and_no_rows() -> None:
    out = step(MemoryStore(), Feed()(envelope("m1", user("hello?"))))
    assert [r.disposition for r in out.receipts] == ["rejected:unknown_thread"]
    assert out.changes == ()


def test_a_first_user_message_may_create_the_thread_with_the_default_config() -> None:
    store = MemoryStore()
    out = step(
        store, Feed()(envelope("m1", user("hello"))), default_config=config(allow_implicit_create=True)
    )
    assert [r.disposition for r in out.receipts] == ["applied"] and load_state(store, "t1") is not None
