"""Attacks on forks through `step` under a key ring (review of issue 20's fork, helper-21).

Each test is one attempt to get more out of a fork than the operator asked for, or to
make one fork control cost the processor more than one bounded receipt: what the
processor's own loopback becomes once it is signed and reaches the new thread's door,
how much of a huge source history a refused fork reads, forks of forks, of children and
of threads with pending work.
"""

from __future__ import annotations

from collections.abc import Iterator

from tests.processors.authority_rig import KEYS, RING, Rig, _key, _raw
from tests.processors.fold_scenarios import call, config, create, user
from torpor.processors.admission import Refused, admit
from torpor.processors.step import StepRecord
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore
from torpor.schemas import signing
from torpor.schemas.codec import default_codec, encode_value
from torpor.schemas.keyring import KeyRing, KeyVersion
from torpor.schemas.records import (
    ApprovalDecision,
    ApprovalRequest,
    Control,
    Dispatch,
    Input,
    TextBlock,
    ToolResult,
    ToolResultEntry,
)
from torpor.streams.config import MAX_INPUT_BYTES_CEILING

OPERATOR = "operator:ops"


def fork(at_seq: int | None, new_id: str | None = "fork-1", model: str | None = None) -> Control:
    return Control(command="fork", call_id=None, model=model, reason=None, new_thread_id=new_id,
                   at_seq=at_seq)


def _signed_on_the_wire(loopback: Input) -> bytes:
    """The bytes the processor produces for `loopback`: signed with its key, then framed."""
    return encode_value(signing.sign(loopback, "proc-1", KEYS["proc-1"]))


def _talked(fill: int) -> Rig:
    """`t`: #0 user "a" * 120,000, #1 the answer, #2 user "b" * `fill`."""
    rig = Rig()
    assert rig.send(create(config(), initial="a" * 120_000), "user:alice").disposition == "applied"
    assert rig.complete("ok").disposition == "applied"
    assert rig.send(user("b" * fill), "user:alice").disposition == "applied"
    return rig


def _fill_for(target: int) -> int:
    """The `fill` whose fork at entry 2 makes a creation of `target` bytes before signing (the
    size grows byte for byte with the text: measured once, on a fork well under the ceiling)."""
    rig = _talked(120_000)
    assert rig.send(fork(2), OPERATOR).disposition == "applied"
    [made] = rig.loopbacks
    return 120_000 + target - len(encode_value(made))


def test_a_fork_applied_on_its_source_is_never_parked_at_the_new_thread_s_door() -> None:
    """A fork control is either refused whole on the source (`rejected:too_large`) or its
    creation, signed by the processor as it goes out, is admitted on the new thread: an
    `applied` fork whose creation the door then parks as oversized leaves the operator a
    fork that was accepted and never made."""
    made_one = False
    for below in (0, 1, 8, 64, 200, 400):
        rig = _talked(_fill_for(MAX_INPUT_BYTES_CEILING - below))
        receipt = rig.send(fork(2), OPERATOR)
        if receipt.disposition == "rejected:too_large":
            assert rig.loopbacks == []
            continue
        assert receipt.disposition == "applied", receipt
        [made] = rig.loopbacks
        assert len(encode_value(made)) == MAX_INPUT_BYTES_CEILING - below
        wire = _signed_on_the_wire(made)
        admitted = admit(default_codec(), "inputs", wire, 0, 0, MAX_INPUT_BYTES_CEILING)
        assert not isinstance(admitted, Refused), (
            f"fork applied {below} bytes under the ceiling unsigned; {len(wire)} bytes signed: "
            f"{admitted.error}")
        [created] = rig.deliver_loopbacks()
        assert created.disposition == "applied", created
        made_one = True
    assert made_one, "a fork a few hundred bytes under the ceiling is made"


class _CountingStore(MemoryStore):
    """A `MemoryStore` that counts the history bytes of thread `t` anyone iterates over."""

    def __init__(self) -> None:
        super().__init__()
        self.history_bytes_read = 0

    def iterate(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for key, value in super().iterate(prefix, start):
            if key.startswith(keys.history_prefix("t")):
                self.history_bytes_read += len(value)
            yield key, value


def test_a_fork_of_a_history_many_times_one_input_reads_about_one_input_of_it() -> None:
    """A fork whose prefix cannot fit one input is refused (`rejected:too_large`); deciding
    that must not read the whole prefix into memory. A long-lived thread's history has no
    bound (gigabytes, over months), and a process that runs out of memory on a `fork`
    control meets the same control again after its restart: one record would stop the
    partition for good."""
    store = _CountingStore()
    rig = Rig(store=store)
    assert rig.send(create(config(), initial="x"), "user:alice").disposition == "applied"
    assert rig.complete("ok").disposition == "applied"
    for n in range(26):
        assert rig.send(user(f"{n % 10}" * 50_000), "user:alice").disposition == "applied"
        assert rig.complete("ok").disposition == "applied"
    before = rig.state()
    assert before is not None
    total = sum(len(raw) for _, raw in MemoryStore.iterate(store, keys.history_prefix("t")))
    assert total > 4 * MAX_INPUT_BYTES_CEILING
    store.history_bytes_read = 0
    receipt = rig.send(fork(before.history_len - 1), OPERATOR)
    assert receipt.disposition == "rejected:too_large", receipt
    assert receipt.reason is not None and f"{MAX_INPUT_BYTES_CEILING}" in receipt.reason
    assert rig.loopbacks == [] and rig.state() == before
    assert store.history_bytes_read <= 2 * MAX_INPUT_BYTES_CEILING, (
        f"{store.history_bytes_read} bytes of history read to refuse a fork, of {total}")


def _busy_source(rig: Rig) -> Dispatch:
    """`t` (tenant acme) with a call to search pending under an approval, and a child."""
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    calls = (call("c1", "search", {"q": "x"}), call("s1", "spawn_thread", {"instructions": "dig"}))
    assert rig.complete("looking", calls).disposition == "applied"
    [dispatch] = [d for d in rig.dispatches if d.kind == "invoke"]
    asked = ApprovalRequest(approval_id="a1", call_id="c1", request_id=dispatch.request_id, prompt="ok?",
                            choices=("yes", "no"), default_choice=None, expires_at=None)
    assert rig.send(asked, "connector:tools").disposition == "applied"
    return dispatch


def test_a_fork_of_a_thread_with_pending_work_inherits_its_words_not_its_authority() -> None:
    """The source has a call pending under an approval and a child. The fork has its
    entries, and none of that: the approval cannot be decided there, the call's real
    result cannot land there, and it is a root thread with the source's grant, no more."""
    rig = Rig()
    dispatch = _busy_source(rig)
    source = rig.state()
    assert source is not None and source.approvals and source.children and source.pending_calls
    rig.loopbacks.clear()  # the child's creation: not this test's
    assert rig.send(fork(source.history_len - 1), OPERATOR).disposition == "applied"
    [created] = rig.deliver_loopbacks()
    assert created.disposition == "applied", created
    made = rig.state("fork-1")
    assert made is not None
    assert (made.pending_calls, made.approvals, made.children, made.subscriptions, made.deferred) == (
        (), (), (), (), ())
    assert made.config.parent is None and made.config.capability == source.config.capability
    opened = [b for b in rig.history("fork-1") if isinstance(b, ToolResultEntry) and b.call_id == "c1"]
    assert [b.origin for b in opened] == ["builtin"]  # answered as forked, not by the tool
    before = rig.dispatches[:]
    decision = ApprovalDecision(approval_id="a1", choice="yes", decided_by="operator:ops")
    assert rig.send(decision, OPERATOR, thread="fork-1").disposition == "rejected:unknown_approval"
    answer = ToolResult(call_id="c1", request_id=dispatch.request_id, ok=True, content=(TextBlock("42"),),
                        subscription=False)
    assert rig.send(answer, "connector:tools", thread="fork-1").disposition == "stale"
    assert rig.dispatches == before and rig.state("fork-1") == made
    assert rig.state() == source  # the source is untouched: its approval still waits there


def test_an_operator_key_of_another_tenant_cannot_fork_a_thread() -> None:
    """Operator keys may be scoped to tenants; a fork copies a thread's grant into a new
    thread, so it is judged like any control on the source: by the source's tenant."""
    globex_ops = _key(20)
    ring = KeyRing((*RING.entries, KeyVersion("ops-globex", _raw(globex_ops), sources=("operator:*",),
                                               tenants=("globex",))))
    rig = Rig(ring=ring)
    _talked_small(rig)
    before = rig.state()
    record = signing.sign(rig.envelope(fork(1), "operator:globex-ops"), "ops-globex", globex_ops)
    [receipt] = rig.fold(StepRecord(record, appended_at=rig.clock)).receipts
    assert (receipt.disposition, receipt.reason) == ("rejected:forged", "key_not_allowed_for_tenant")
    assert rig.loopbacks == [] and rig.state() == before and rig.state("fork-1") is None


def _talked_small(rig: Rig) -> None:
    assert rig.send(create(config()), "user:alice").disposition == "applied"
    assert rig.complete("first answer").disposition == "applied"


def test_a_fork_of_a_fork_of_a_child_is_a_root_thread_with_the_child_s_grant() -> None:
    rig = Rig()
    _busy_source(rig)
    [child_creation] = rig.loopbacks
    assert rig.deliver_loopbacks()[0].disposition == "applied"
    child_id = child_creation.thread_id
    child = rig.state(child_id)
    assert child is not None and child.config.parent is not None
    assert rig.send(fork(0, "fork-of-child"), OPERATOR, thread=child_id).disposition == "applied"
    assert rig.deliver_loopbacks()[0].disposition == "applied"
    assert rig.send(fork(0, "fork-of-fork"), OPERATOR, thread="fork-of-child").disposition == "applied"
    assert rig.deliver_loopbacks()[0].disposition == "applied"
    for thread in ("fork-of-child", "fork-of-fork"):
        made = rig.state(thread)
        assert made is not None and made.config.parent is None
        assert made.config.capability == child.config.capability
    # A fork may not take a derived id (a child's): refused on the source, nothing made.
    assert rig.send(fork(0, child_id), OPERATOR).disposition == "rejected:invalid_fork_id"
    assert rig.send(fork(0, "tp_" + "0" * 32), OPERATOR).disposition == "rejected:invalid_fork_id"
    assert rig.loopbacks == []


def test_a_fork_cannot_talk_to_the_children_of_its_source() -> None:
    """The fork's history names the source's child (its spawn call and answer), but the
    child is the source's: a message from the fork's model to it is refused, nothing sent."""
    rig = Rig()
    _busy_source(rig)
    [child_creation] = rig.loopbacks
    rig.deliver_loopbacks()
    source = rig.state()
    assert source is not None
    assert rig.send(fork(source.history_len - 1), OPERATOR).disposition == "applied"
    rig.deliver_loopbacks()
    speak = call("m1", "send_message_to_child", {"thread_id": child_creation.thread_id, "text": "psst"})
    assert rig.complete("", (speak,), thread="fork-1").disposition == "applied"
    assert [lb for lb in rig.loopbacks if lb.thread_id == child_creation.thread_id] == []
    [answer] = [b for b in rig.history("fork-1") if isinstance(b, ToolResultEntry) and b.call_id == "m1"]
    assert not answer.ok
