"""A deleted thread stays deleted against copies of the inputs that created it.

Deleting a thread drops every row it had, its seen rows too, so the message ids it
applied are forgotten. Without a tombstone, anyone who can read `inputs` could produce a
captured signed creation again (an operator's or gateway's `CreateThread`, the
processor's child creation, a `UserMessage` that created the thread implicitly) and the
thread would be back, with the creator's authority. The rig folds under a key ring, as
the processor does, and every copy here is the captured record itself, byte for byte,
signature included.
"""

from __future__ import annotations

from tests.processors.authority_rig import KEYS, Rig
from tests.processors.fold_scenarios import call, config, control, create, user
from torpor.processors.fold.verify import KeyringVerifier
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.schemas import signing
from torpor.schemas.records import CreateThread, Input, Receipt

OPERATOR = "operator:ops"


def _captured(rig: Rig, thread: str, body_type: type) -> Input:
    """The first record of `body_type` for `thread` that the log holds."""
    return next(r.input for r in rig.records
                if r.input.thread_id == thread and isinstance(r.input.body, body_type))


def _captured_last(rig: Rig, thread: str) -> Input:
    """The latest `CreateThread` for `thread` that the log holds."""
    return next(r.input for r in reversed(rig.records)
                if r.input.thread_id == thread and isinstance(r.input.body, CreateThread))


def _again(rig: Rig, record: Input) -> Receipt:
    """Produce `record` again, unchanged: the broker appends the copy now."""
    [receipt] = rig.fold(StepRecord(record, appended_at=rig.clock)).receipts
    return receipt


def _deleted(rig: Rig, thread: str = "t") -> None:
    assert rig.send(control("delete", reason="done"), OPERATOR, thread=thread).disposition == "applied"
    assert rig.state(thread) is None


def test_a_captured_creation_produced_again_after_the_delete_is_refused() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    creation = _captured(rig, "t", CreateThread)
    _deleted(rig)
    receipt = _again(rig, creation)
    assert receipt.disposition == "rejected:thread_deleted", receipt
    assert receipt.provenance == "verified"  # the signature is genuine: only the tombstone refuses it
    assert receipt.reason is not None and "deleted" in receipt.reason
    assert rig.state() is None
    # Nothing remembered for the copy: a second copy is answered the same way.
    assert _again(rig, creation).disposition == "rejected:thread_deleted"
    left = [k for k, _ in rig.store.iterate(keys.thread_prefix("t"))
            if not k.startswith(keys.thread_prefix("t") + keys.SEEN)]
    assert left == [keys.deleted_key("t")]


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
    assert implicit(first) == "rejected:thread_deleted"
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
    assert _again(rig, creation).disposition == "rejected:thread_deleted"
    assert rig.state(child) is None


def test_a_creation_made_after_the_delete_starts_the_thread_anew_and_old_copies_stay_refused() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    old = _captured(rig, "t", CreateThread)
    _deleted(rig)
    assert rig.send(create(config()), "user:alice").disposition == "applied"  # made later: welcome
    state = rig.state()
    assert state is not None and state.history_len > 0
    _deleted(rig)
    assert _again(rig, old).disposition == "rejected:thread_deleted"
    assert rig.state() is None


def _recreated_then_deleted_behind(appended: bool) -> tuple[Rig, Input, int]:
    """`t` created, deleted, created again (`again`), then deleted by an operator whose
    clock is 500 ms behind the first deletion; the broker appends that deletion now
    (`appended`) or, as in local mode, keeps no append time."""
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    _deleted(rig)
    first_delete = rig.clock
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    again = _captured_last(rig, "t")
    assert again.created_at > first_delete
    delete = signing.sign(rig.envelope(control("delete"), OPERATOR, created_at=first_delete - 500),
                          "operator-1", KEYS["operator-1"])
    [receipt] = rig.fold(StepRecord(delete, appended_at=rig.clock if appended else None)).receipts
    assert receipt.disposition == "applied" and rig.state() is None
    return rig, again, keys.decode_time(rig.store.get(keys.deleted_key("t")) or b"")


def test_a_deleter_whose_clock_is_behind_still_covers_the_creation_it_deletes() -> None:
    """Without an append time the tombstone is the re-creation's time (its last entry),
    not the deleter's: a copy of the re-creation stays refused."""
    rig, again, tombstone = _recreated_then_deleted_behind(appended=False)
    assert tombstone == again.created_at
    assert _again(rig, again).disposition == "rejected:thread_deleted"
    assert rig.state() is None


def test_the_brokers_append_time_of_the_deletion_covers_a_deleter_whose_clock_is_behind() -> None:
    rig, again, tombstone = _recreated_then_deleted_behind(appended=True)
    assert tombstone == rig.clock > again.created_at  # when the broker appended the deletion
    assert _again(rig, again).disposition == "rejected:thread_deleted"
    assert rig.state() is None


def test_inputs_for_a_deleted_thread_other_than_creations_are_unknown_thread() -> None:
    rig = Rig()
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    _deleted(rig)
    assert rig.send(control("stop"), OPERATOR).disposition == "rejected:unknown_thread"
