"""Forks through `step`, the processor's own entry point, under a key ring (as an attacker too).

The operator's signed `fork` control is folded on the source's store; the shell reads the
source's rows and makes the fork's `CreateThread`, which the processor signs and folds
on the new thread. Its stored rows are the source's prefix, byte for byte; re-folding the
recorded records gives every thread the same head and rows. Whoever is not an operator
asking, or not the processor creating, gets one `rejected:` receipt that says why, and a
fork too large for one input is refused whole on the source.
"""

from __future__ import annotations

from tests.processors.authority_rig import Rig
from tests.processors.fold_scenarios import config, create, user
from torpor.processors.fold.history import chain
from torpor.processors.fold.verify import KeyringVerifier
from torpor.processors.replay import compare, thread_heads
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import read_entries
from torpor.schemas.records import Control, CreateThread, ForkOrigin, Receipt
from torpor.streams.config import MAX_INPUT_BYTES_CEILING

OPERATOR = "operator:ops"


def fork(at_seq: int | None, new_id: str | None = "fork-1", model: str | None = None) -> Control:
    return Control(command="fork", call_id=None, model=model, reason=None, new_thread_id=new_id,
                   at_seq=at_seq)


def _talked(rig: Rig) -> None:
    """`t`: #0 user "hello", #1 the answer, #2 user "again", #3 the second answer."""
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    assert rig.complete("first answer").disposition == "applied"
    assert rig.send(user("again"), "user:alice").disposition == "applied"
    assert rig.complete("second answer").disposition == "applied"


def _rows(rig: Rig, thread: str) -> list[bytes]:
    return [raw for _, raw in rig.store.iterate(keys.history_prefix(thread))]


def test_a_signed_fork_makes_a_thread_whose_rows_are_the_source_s_prefix_and_replays_exactly() -> None:
    rig = Rig()
    _talked(rig)
    source_rows = _rows(rig, "t")
    receipt = rig.send(fork(2, model="openai:other"), OPERATOR)
    assert receipt.disposition == "applied" and receipt.provenance == "verified"
    assert [lb.thread_id for lb in rig.loopbacks] == ["fork-1"]
    made = rig.loopbacks[0]
    assert isinstance(made.body, CreateThread)
    assert made.body.fork == ForkOrigin("t", 2, receipt.input_id, OPERATOR)
    [created] = rig.deliver_loopbacks()
    assert (created.disposition, created.provenance) == ("applied", "verified")
    assert _rows(rig, "fork-1")[:3] == source_rows[:3] and _rows(rig, "t") == source_rows
    state = rig.state("fork-1")
    assert state is not None and state.model == "openai:other" and state.status.value == "awaiting_model"
    assert state.head == chain(tuple(read_entries(rig.store, "t", 0, 3)))
    assert state.config.capability == config().capability  # the source's grant, never more

    # The fork goes on like any thread; then the whole log, re-folded, gives the same rows.
    assert rig.complete("another answer", thread="fork-1").disposition == "applied"
    again = MemoryStore()
    for record in rig.records:
        step(again, [record], verifier=KeyringVerifier(rig.ring))
    replayed, live = thread_heads({0: again}), thread_heads({0: rig.store})
    assert set(live) == {"t", "fork-1"} and compare(replayed, live) == []


def _refused(rig: Rig, receipt: Receipt, disposition: str, reason: str) -> None:
    assert receipt.disposition == disposition, receipt
    assert receipt.reason is not None and reason in receipt.reason, receipt.reason
    assert rig.loopbacks == [] and rig.state("fork-1") is None


def test_a_fork_control_from_anyone_but_an_operator_key_is_forged() -> None:
    for source, key_id, why in (("user:alice", "honest", "source_not_allowed"),
                                ("processor", "honest", "source_not_allowed"),
                                ("connector:tools", "honest", "source_not_allowed"),
                                ("operator:ops", None, "missing_signature"),
                                ("operator:ops", "tools-1", "key_not_allowed_for_source")):
        rig = Rig()
        _talked(rig)
        before = rig.state()
        receipt = rig.send(fork(1), source, key_id)
        _refused(rig, receipt, f"rejected:{'unsigned' if key_id is None else 'forged'}", why)
        assert rig.state() == before


def _fork_creation(rig: Rig) -> CreateThread:
    origin = ForkOrigin(source_thread_id="t", at_seq=1, control_id="m-x", requested_by=OPERATOR)
    return CreateThread(config=config(), inherited=tuple(read_entries(rig.store, "t", 0, 2)), initial=(),
                        fork=origin)


def test_a_fork_creation_from_outside_the_processor_is_forged_whatever_it_carries() -> None:
    for source, key_id, why in (("operator:ops", "honest", "source_not_allowed"),
                                ("user:alice", "honest", "source_not_allowed"),
                                ("processor", None, "missing_signature"),
                                ("processor", "operator-1", "key_not_allowed_for_source")):
        rig = Rig()
        _talked(rig)
        receipt = rig.send(_fork_creation(rig), source, key_id, thread="fork-1")
        _refused(rig, receipt, f"rejected:{'unsigned' if key_id is None else 'forged'}", why)


def test_a_fork_onto_a_thread_that_exists_is_refused_there() -> None:
    rig = Rig()
    _talked(rig)
    assert rig.send(create(config(), initial="mine"), "user:alice", thread="taken").disposition == "applied"
    before = rig.state("taken")
    assert rig.send(fork(1, "taken"), OPERATOR).disposition == "applied"
    [refused] = rig.deliver_loopbacks()
    assert refused.disposition == "rejected:thread_exists" and refused.thread_id == "taken"
    assert rig.state("taken") == before


def test_a_fork_too_large_for_one_input_is_refused_whole_on_the_source() -> None:
    rig = Rig()
    assert rig.send(create(config(), initial="x" * 100_000), "user:alice").disposition == "applied"
    assert rig.complete("a").disposition == "applied"
    for n in range(3):
        assert rig.send(user(f"{n}" * 100_000), "user:alice").disposition == "applied"
        assert rig.complete("b").disposition == "applied"
    before = rig.state()
    assert before is not None and before.history_len == 8
    small = rig.send(fork(1), OPERATOR)
    assert small.disposition == "applied"
    rig.loopbacks.clear()
    receipt = rig.send(fork(7, "fork-2"), OPERATOR)
    assert receipt.disposition == "rejected:too_large", receipt
    assert receipt.reason is not None and f"more than {MAX_INPUT_BYTES_CEILING}" in receipt.reason
    assert rig.loopbacks == [] and rig.state() == before
    assert rig.send(user("still here"), "user:alice").disposition == "applied"  # the partition goes on


def test_unknown_source_thread_and_out_of_range_seq_get_one_receipt_each() -> None:
    rig = Rig()
    out = rig.fold(StepRecord(rig.envelope(fork(0), OPERATOR, thread="nobody")))
    assert [r.disposition for r in out.receipts] == ["rejected:unsigned"]  # unsigned operator: refused first
    assert rig.send(fork(0), OPERATOR, thread="nobody").disposition == "rejected:unknown_thread"
    _talked(rig)
    receipt = rig.send(fork(99), OPERATOR)
    assert receipt.disposition == "rejected:fork_seq_out_of_range"
    assert "it has 4 entries" in (receipt.reason or "")
    assert rig.loopbacks == []
