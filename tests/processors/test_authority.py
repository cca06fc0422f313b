"""The trust boundary, tried as an attacker who may write to `inputs` (issue 16).

Every test goes through `step` with a `KeyringVerifier`, exactly as the processor folds:
an input arrives with some source, some key and some signature; the receipt, the
thread's state and history, and the outbox say what it achieved. The expectations are
written out here, not read from `torpor.processors.fold.authority`, so a wrong table fails.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.processors.authority_rig import KEYS, RING, Rig
from tests.processors.fold_scenarios import call, completion, config, control, create, result, user
from torpor.processors import step as step_module
from torpor.processors.fold import transitions as fold_module
from torpor.processors.fold.authority import AUTHORITY, PUBLIC_TENANT
from torpor.processors.fold.state import ThreadState
from torpor.processors.step import StepRecord
from torpor.schemas import signing
from torpor.schemas.records import (
    ApprovalDecision,
    ApprovalRequest,
    Capability,
    ChildReport,
    InputBody,
    ParentLink,
    ParentMessage,
    TextBlock,
    TimerFired,
    ToolEvent,
)
from torpor.streams.partitioner import partition_for

# The table, written out: who may produce each body.
ALLOWED: dict[str, set[str]] = {
    "CreateThread": {"user", "operator", "processor"},
    "UserMessage": {"user", "operator"},
    "Completion": {"processor"},
    "ToolResult": {"connector"},
    "ToolEvent": {"connector"},
    "ApprovalRequest": {"connector"},
    "ApprovalDecision": {"user", "operator"},
    "TimerFired": {"timer"},
    "ChildReport": {"processor"},
    "ParentMessage": {"processor"},
    "Control": {"operator", "processor"},
}


def _role(source: str) -> str:
    return source.split(":", 1)[0]


def _created(rig: Rig) -> None:
    assert rig.send(create(config()), "user:alice").disposition == "applied"


def _awaiting_search(rig: Rig) -> str:
    """Thread `t` (tenant acme) with call c1 to `search` pending; returns its request id."""
    _created(rig)
    state = rig.state()
    assert state is not None and state.pending_request is not None
    answer = completion(state.pending_request, "looking", (call("c1", "search", {"q": "x"}),))
    assert rig.send(answer, "processor", message_id=state.pending_request).disposition == "applied"
    pending = rig.state()
    assert pending is not None and pending.status.value == "awaiting_tools"
    return pending.pending_calls[0].request_id


def _unchanged(rig: Rig, before: ThreadState | None, history: list[object], dispatches: int) -> None:
    assert rig.state() == before
    assert rig.history() == history
    assert len(rig.dispatches) == dispatches


def test_the_table_covers_every_body_type() -> None:
    bodies = {t.__name__ for t in typing.get_args(InputBody)}
    assert {t.__name__ for t in AUTHORITY} == bodies == set(ALLOWED)
    assert {name: {r.value for r in row.roles} for name, row in
            ((t.__name__, a) for t, a in AUTHORITY.items())} == ALLOWED


# --- 1. operator commands --------------------------------------------------------------


@pytest.mark.parametrize("command", ["delete", "stop", "park", "set_model"])
@pytest.mark.parametrize(("source", "key_id", "why"), [
    ("user:attacker", None, "source_not_allowed"),
    ("user:attacker", "gateway-acme", "source_not_allowed"),
    ("operator:root", None, "missing_signature"),
    ("operator:root", "tools-1", "key_not_allowed_for_source"),
    ("connector:tools", "tools-1", "source_not_allowed"),
    ("nobody", None, "unknown_source"),
])
def test_a_control_not_signed_by_an_operator_key_changes_nothing(
        command: str, source: str, key_id: str | None, why: str) -> None:
    rig = Rig()
    _created(rig)
    before, history = rig.state(), rig.history()
    body = control(command, model="evil:model" if command == "set_model" else None)
    receipt = rig.send(body, source, key_id)
    assert receipt.disposition.startswith("rejected:") and receipt.reason == why
    _unchanged(rig, before, history, 0)
    # The partition keeps moving: an operator's real command applies right after.
    assert rig.send(control("park", reason="checked"), "operator:ops").disposition == "applied"


# --- 2. tool results -----------------------------------------------------------------


@pytest.mark.parametrize(("source", "key_id"), [
    ("user:attacker", None), ("user:alice", "gateway-acme"), ("operator:ops", "operator-1"),
    ("processor", "proc-1"), ("connector:tools", None), ("connector:tools", "timer-1"),
])
def test_a_result_not_signed_by_the_calls_connector_is_not_what_the_model_sees(
        source: str, key_id: str | None) -> None:
    rig = Rig()
    request_id = _awaiting_search(rig)
    before, history, sent = rig.state(), rig.history(), len(rig.dispatches)
    receipt = rig.send(result("c1", request_id, "attacker's text"), source, key_id)
    assert receipt.disposition.startswith("rejected:")
    _unchanged(rig, before, history, sent)
    assert rig.send(result("c1", request_id, "the real answer"), "connector:tools").disposition == "applied"


# --- 3. completions --------------------------------------------------------------------


@pytest.mark.parametrize(("source", "key_id"), [
    ("user:attacker", None), ("user:alice", "gateway-acme"), ("operator:ops", "operator-1"),
    ("processor", None), ("connector:tools", "tools-1"),
])
def test_a_completion_not_signed_by_the_processor_dispatches_nothing(source: str, key_id: str | None) -> None:
    rig = Rig()
    _created(rig)
    before, history = rig.state(), rig.history()
    assert before is not None and before.pending_request is not None
    forged = completion(before.pending_request, "", (call("c9", "search", {"q": "rm -rf /"}),))
    receipt = rig.send(forged, source, key_id, message_id=before.pending_request)
    assert receipt.disposition.startswith("rejected:")
    _unchanged(rig, before, history, 0)


# --- 4. capabilities are granted, not claimed ---------------------------------------


def _claiming(tenant: str, scopes: tuple[str, ...], parent: ParentLink | None = None,
              tools: tuple[str, ...] | None = None) -> InputBody:
    base = config()
    return create(dataclasses.replace(base, parent=parent, capability=Capability(
        tenant=tenant, tools=base.capability.tools if tools is None else tools, scopes=scopes,
        expires_at=None)))


@pytest.mark.parametrize(("body", "source", "key_id", "why"), [
    (_claiming("victim-tenant", ("admin", "payments:write")), "user:attacker", None, "missing_signature"),
    (_claiming(PUBLIC_TENANT, ("admin",)), "user:attacker", None, "scope_not_granted"),
    (_claiming("acme", ("read", "admin")), "user:alice", "gateway-acme", "scope_not_granted"),
    (_claiming("victim-tenant", ()), "user:alice", "gateway-acme", "tenant_not_granted"),
    (_claiming("acme", ("read",), ParentLink("victim", "victim", "s1", "child", 1)), "user:alice",
     "gateway-acme", "source_not_allowed"),
    (_claiming("acme", ("read",)), "processor", "proc-1", "source_not_allowed"),
])
def test_a_thread_cannot_claim_authority_its_creators_key_does_not_grant(
        body: InputBody, source: str, key_id: str | None, why: str) -> None:
    rig = Rig()
    receipt = rig.send(body, source, key_id)
    assert receipt.disposition.startswith("rejected:") and receipt.reason == why
    assert rig.state() is None and rig.history() == []


def test_a_granted_capability_is_what_the_dispatches_carry() -> None:
    rig = Rig()
    _awaiting_search(rig)  # created by the acme gateway with scope read
    assert [d.capability for d in rig.dispatches] == [
        Capability(tenant="acme", tools=config().capability.tools, scopes=("read",), expires_at=None)]


def test_an_unsigned_user_gets_a_public_thread_and_may_talk_to_it() -> None:
    rig = Rig()
    assert rig.send(_claiming(PUBLIC_TENANT, (), tools=()), "user:anyone", None).disposition == "applied"
    assert rig.send(user("hello"), "user:anyone", None).disposition in ("applied", "deferred")
    # ...but not to a tenant's thread.
    assert rig.send(create(config()), "user:alice", thread="acme-thread").disposition == "applied"
    receipt = rig.send(user("let me in"), "user:anyone", None, thread="acme-thread")
    assert (receipt.disposition, receipt.reason) == ("rejected:unsigned", "missing_signature")


def test_an_unsigned_thread_holds_only_the_tools_the_ring_makes_public() -> None:
    receipt = Rig().send(_claiming(PUBLIC_TENANT, (), tools=("search",)), "user:anyone", None)
    assert (receipt.disposition, receipt.reason) == ("rejected:forged", "tool_not_granted")
    public = Rig(ring=dataclasses.replace(RING, public_tools=("search",)))
    assert public.send(_claiming(PUBLIC_TENANT, (), tools=("search",)), "user:anyone", None).disposition \
        == "applied"
    receipt = public.send(_claiming(PUBLIC_TENANT, (), tools=("search", "fetch")), "user:anyone", None,
                          thread="t2")
    assert (receipt.disposition, receipt.reason) == ("rejected:forged", "tool_not_granted")


# --- 5, 6, 9. the door: ids, record keys, partitions ------------------------------------


@pytest.mark.parametrize(("thread", "message_id", "why"), [
    ("", "m1", "invalid_thread_id"),
    ("t\nFORGED 12:00:00 operator approved", "m1", "invalid_thread_id"),
    ("x" * 257, "m1", "invalid_thread_id"),
    ("t\x1b[31m", "m1", "invalid_thread_id"),
    ("t", "", "invalid_message_id"),
    ("t", "m\r1", "invalid_message_id"),
    ("t", "m" * 100_000, "invalid_message_id"),
])
def test_a_bad_id_gets_one_receipt_and_the_batch_goes_on(thread: str, message_id: str, why: str) -> None:
    rig = Rig()
    bad = rig.envelope(user("hi"), "user:alice", thread=thread, message_id=message_id)
    good = signing.sign(rig.envelope(create(config()), "user:alice", thread="ok"), "gateway-acme",
                        KEYS["gateway-acme"])
    out = rig.fold(StepRecord(bad, 0, 10), StepRecord(good, 0, 11))
    assert [(r.disposition, r.input_offset) for r in out.receipts] == [
        (f"rejected:{why}", 10), ("applied", 11)]
    refused = out.receipts[0]
    assert refused.provenance == "unchecked" and refused.reason is not None
    assert "\n" not in refused.reason and "\r" not in refused.reason and "\x1b" not in refused.reason
    assert len(refused.reason) < 300
    assert rig.state("ok") is not None and out.changes  # only the good input wrote rows


def test_a_record_whose_key_is_not_its_thread_id_is_refused() -> None:
    rig = Rig()
    record = signing.sign(rig.envelope(create(config()), "user:alice", thread="t"), "gateway-acme",
                          KEYS["gateway-acme"])
    out = rig.fold(StepRecord(record, 0, 1, key=b"other"))
    assert [r.disposition for r in out.receipts] == ["rejected:key_mismatch"]
    assert rig.state() is None


def test_a_thread_produced_to_another_partition_is_refused_there() -> None:
    rig = Rig()
    home = partition_for(b"t", 6)
    elsewhere = (home + 1) % 6
    record = signing.sign(rig.envelope(create(config()), "user:alice"), "gateway-acme", KEYS["gateway-acme"])
    out = rig.fold(StepRecord(record, elsewhere, 1, key=b"t"), partitions=6)
    assert [(r.disposition, r.reason) for r in out.receipts] == [
        ("rejected:wrong_partition", f"thread 't' belongs on partition {home}")]
    assert rig.state() is None
    assert [r.disposition for r in rig.fold(StepRecord(record, home, 2, key=b"t"), partitions=6).receipts] \
        == ["applied"]


@pytest.mark.pure_only  # replaces step's `fold`: compiled, step calls its own
def test_when_even_parking_fails_the_input_gets_a_receipt_and_step_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_fold(*_: object) -> object:
        raise RuntimeError("a bug in the fold")

    def broken_park(*_: object) -> object:
        raise RuntimeError("a bug in the last resort")

    rig = Rig()
    _created(rig)
    monkeypatch.setattr(step_module, "fold", broken_fold)
    monkeypatch.setattr(step_module, "park_on_failure", broken_park)
    poison = signing.sign(rig.envelope(user("boom"), "user:alice"), "gateway-acme", KEYS["gateway-acme"])
    out = rig.fold(StepRecord(poison, 0, 7))
    assert [(r.disposition, r.input_offset) for r in out.receipts] == [("parked", 7)]
    assert out.receipts[0].reason is not None and "a bug in the last resort" in out.receipts[0].reason
    assert [p.record.input.message_id for p in out.parked] == [poison.message_id]
    assert fold_module.fold is not broken_fold  # the real fold is untouched for other tests


# --- the property: nothing that needs a signer is folded without its key --------------


def _bodies(request_id: str) -> Iterator[InputBody]:
    yield user("hi")
    yield control("stop")
    yield control("park")
    yield result("c1", request_id, "42")
    yield completion("tp_unknown", "", (call("c2", "search"),))
    yield ToolEvent(call_id="c1", request_id=request_id, sequence=0, associative=True, final=False,
                    content=(TextBlock("tick"),))
    yield TimerFired(call_id="c1", request_id=request_id, due_at=0)
    yield ApprovalRequest(approval_id="a1", call_id="c1", request_id=request_id, prompt="ok?",
                          choices=("yes", "no"), default_choice=None, expires_at=None)
    yield ApprovalDecision(approval_id="a1", choice="yes", decided_by="user:alice")
    yield ChildReport(child_thread_id="c", spawn_call_id="s", kind="report", text="done")
    yield ParentMessage(parent_thread_id="p", spawn_call_id="s", text="go")
    yield _claiming("acme", ("read",))


SOURCES = ["user:alice", "user:attacker", "operator:ops", "connector:tools", "connector:other", "timer",
           "processor", "nobody", ""]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_nothing_that_needs_a_signer_is_folded_without_its_key(data: st.DataObject) -> None:
    rig = Rig()
    request_id = _awaiting_search(rig)
    for _ in range(data.draw(st.integers(1, 4))):
        body = data.draw(st.sampled_from(list(_bodies(request_id))))
        source = data.draw(st.sampled_from(SOURCES))
        key_id = data.draw(st.sampled_from([None, *KEYS, "unknown-key"]))
        record = rig.envelope(body, source)
        if key_id in KEYS:
            record = signing.sign(record, key_id, KEYS[key_id])
        elif key_id is not None:
            record = dataclasses.replace(record, key_id=key_id, signature=bytes(64))
        if data.draw(st.booleans()) and record.signature is not None:  # tamper after signing
            record = dataclasses.replace(record, source=data.draw(st.sampled_from(SOURCES)))
        before, history = rig.state(), rig.history()
        out = rig.fold(StepRecord(record))  # never raises
        [receipt] = out.receipts
        if receipt.disposition.startswith("rejected:") or receipt.disposition == "duplicate":
            assert (rig.state(), rig.history()) == (before, history)
            continue
        # Folded (applied, deferred, stale, ...): the role may produce the body, and a key
        # of the ring allowed for exactly this source signed exactly these bytes.
        assert _role(record.source) in ALLOWED[type(body).__name__], (record, receipt)
        assert record.key_id is not None and record.signature is not None, (record, receipt)
        version = RING.version_at(record.key_id, record.created_at)
        assert version is not None and version.may_sign_source(record.source)
        assert signing.verify(record, RING).is_verified


@pytest.mark.parametrize(("source", "key_id", "disposition"), [
    ("user:alice", None, "rejected:unsigned"),  # users need not sign text, but a decision is authority
    ("user:alice", "gateway-globex", "rejected:forged"),  # a gateway of another tenant
    ("connector:tools", "tools-1", "rejected:forged"),
    ("user:alice", "gateway-acme", "applied"),
    ("operator:ops", "operator-1", "applied"),
])
def test_an_approval_is_decided_only_under_a_key_of_the_threads_tenant_or_an_operators(
        source: str, key_id: str | None, disposition: str) -> None:
    rig = Rig()
    request_id = _awaiting_search(rig)
    asked = ApprovalRequest(approval_id="a1", call_id="c1", request_id=request_id, prompt="deploy?",
                            choices=("yes", "no"), default_choice=None, expires_at=None)
    assert rig.send(asked, "connector:tools").disposition == "applied"
    before = rig.state()
    receipt = rig.send(ApprovalDecision(approval_id="a1", choice="yes", decided_by=source), source, key_id)
    assert receipt.disposition == disposition, receipt
    if disposition != "applied":
        assert rig.state() == before
