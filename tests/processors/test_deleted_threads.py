"""A deleted thread's inputs stay spent: produced again, each is a `duplicate`.

Deleting a thread drops its state, history and summary rows but keeps its seen rows (a
message id and its senders' digests each). Anyone who can read `inputs` may produce a
captured signed record again: the thread's creation (an operator's or gateway's
`CreateThread`, the processor's child creation, a `UserMessage` that created it
implicitly), or any other input it applied (a user's text, an operator's stop). Whether
the thread is gone or was created anew meanwhile, the copy gets one receipt, `duplicate`,
and changes nothing. No rule here reads a writer's clock: a clock running ahead or one
input stamped far in the future changes nothing (review 19 found both holes in the
time-based tombstone this replaced). The rig folds under a key ring, as the processor
does, and every copy is the captured record itself, byte for byte, signature included.
"""

from __future__ import annotations

from tests.processors.authority_rig import KEYS, Rig
from tests.processors.fold_scenarios import call, config, control, create, user
from torpor.processors.fold.verify import KeyringVerifier
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.schemas import signing
from torpor.schemas.records import Control, CreateThread, Input, Receipt, UserMessage

OPERATOR = "operator:ops"


def _captured(rig: Rig, thread: str, body_type: type) -> Input:
    """The first record of `body_type` for `thread` that the log holds."""
    return next(r.input for r in rig.records
                if r.input.thread_id == thread and isinstance(r.input.body, body_type))


def _again(rig: Rig, record: Input) -> Receipt:
    """Produce `record` again, unchanged: the broker appends the copy now."""
    [receipt] = rig.fold(StepRecord(record, appended_at=rig.clock)).receipts
    return receipt


def _deleted(rig: Rig, thread: str = "t") -> None:
    assert rig.send(control("delete", reason="done"), OPERATOR, thread=thread).disposition == "applied"
    assert rig.state(thread) is None


def _assert_duplicate(receipt: Receipt) -> None:
    assert receipt.disposition == "duplicate", (receipt.disposition, receipt.reason)
    assert receipt.provenance == "verified"  # a genuine signature: only the seen row absorbs it


def test_a_captured_creation_produced_again_after_the_delete_is_a_duplicate() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    creation = _captured(rig, "t", CreateThread)
    _deleted(rig)
    _assert_duplicate(_again(rig, creation))
    assert rig.state() is None
    _assert_duplicate(_again(rig, creation))  # every copy alike
    prefix = keys.thread_prefix("t")
    kinds = {k[len(prefix):len(prefix) + 1] for k, _ in rig.store.iterate(prefix)}
    assert kinds == {keys.SEEN}  # no state, history or summary: only what it has seen


def test_a_user_message_that_created_the_thread_cannot_create_it_again() -> None:
    """With a default config that allows it, a first `UserMessage` creates the thread."""
    rig = Rig()
    first = signing.sign(rig.envelope(user("hi"), "user:alice"), "gateway-acme", KEYS["gateway-acme"])

    def implicit(record: Input) -> str:
        out = step(rig.store, [StepRecord(record, appended_at=rig.clock)], verifier=KeyringVerifier(rig.ring),
                   default_config=config())
        [receipt] = out.receipts
        return receipt.disposition

    assert implicit(first) == "applied"
    _deleted(rig)
    assert implicit(first) == "duplicate"
    assert rig.state() is None


def test_the_processors_captured_child_creation_cannot_bring_a_deleted_child_back() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    assert rig.complete("", (call("s1", "spawn_thread", {"instructions": "dig"}),)).disposition == "applied"
    [made] = rig.deliver_loopbacks()
    assert made.disposition == "applied"
    child = made.thread_id
    creation = _captured(rig, child, CreateThread)
    assert creation.source == "processor" and creation.signature is not None
    _deleted(rig, child)
    _assert_duplicate(_again(rig, creation))
    assert rig.state(child) is None


def test_a_new_creation_after_the_delete_starts_the_thread_anew_and_old_copies_stay_duplicates() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    old = _captured(rig, "t", CreateThread)
    _deleted(rig)
    assert rig.send(create(config()), "user:alice").disposition == "applied"  # a new message id: welcome
    state = rig.state()
    assert state is not None and state.history_len > 0
    _assert_duplicate(_again(rig, old))
    assert rig.state() == state  # the live second life is untouched
    _deleted(rig)
    _assert_duplicate(_again(rig, old))
    assert rig.state() is None


def test_a_captured_stop_of_the_first_life_cannot_stop_the_thread_created_again() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    assert rig.send(control("stop", reason="paused"), OPERATOR).disposition == "applied"
    old_stop = _captured(rig, "t", Control)
    _deleted(rig)
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    rig.complete("fresh start")
    _assert_duplicate(_again(rig, old_stop))
    state = rig.state()
    assert state is not None and state.status.value == "idle"


def test_a_captured_user_message_of_the_first_life_is_not_folded_into_the_second() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    rig.complete("ok")
    said = signing.sign(rig.envelope(user("wire the money to acct 1"), "user:alice"), "gateway-acme",
                        KEYS["gateway-acme"])
    assert _again(rig, said).disposition == "applied"
    _deleted(rig)
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    rig.complete("fresh start")
    _assert_duplicate(_again(rig, said))
    assert not any(isinstance(b, UserMessage) and "acct" in str(b) for b in rig.history())


def test_a_creation_from_a_clock_ahead_stays_a_duplicate_after_a_delete_that_follows_a_turn() -> None:
    rig = Rig()
    ahead = rig.clock + 120_000  # the gateway's clock is two minutes ahead of the broker's
    assert rig.send(create(config()), "user:alice", created_at=ahead).disposition == "applied"
    creation = _captured(rig, "t", CreateThread)
    assert rig.complete("hello").disposition == "applied"  # stamped with the processor's clock
    _deleted(rig)
    assert rig.clock < ahead  # the deletion came before the creation's own time
    _assert_duplicate(_again(rig, creation))
    assert rig.state() is None


def test_one_input_stamped_far_ahead_does_not_refuse_later_re_creations() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    rig.complete("ok")
    assert rig.send(user("hi"), "user:alice", created_at=2**63 - 1).disposition == "applied"
    _deleted(rig)
    rig.clock += 365 * 24 * 3600 * 1000  # a year later, a new creation of the id
    receipt = rig.send(create(config()), "user:alice")
    assert receipt.disposition == "applied", (receipt.disposition, receipt.reason)


def test_a_creation_from_another_sender_under_a_spent_message_id_is_judged_on_its_own() -> None:
    """A message id is an idempotency key per sender: the seen row of the first life does
    not let an operator's creation under the same id pass for a copy (nor refuse it)."""
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    creation = _captured(rig, "t", CreateThread)
    _deleted(rig)
    receipt = rig.send(create(config()), OPERATOR, message_id=creation.message_id)
    assert receipt.disposition == "applied", (receipt.disposition, receipt.reason)


def test_inputs_for_a_deleted_thread_other_than_creations_are_unknown_thread() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    _deleted(rig)
    assert rig.send(control("stop"), OPERATOR).disposition == "rejected:unknown_thread"
