"""The verifiers of `torpor.processors.fold.verify`, and the fold's answer to each verdict.

Every verdict is checked twice: what `KeyringVerifier.verify` says, and, through `step`
over a real store, the receipt the input then gets and that history did not move.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.processors.fold_scenarios import OBJECT_SCHEMA, World, call, config, create, result, user
from torpor.processors.fold.authority import PUBLIC_TENANT
from torpor.processors.fold.state import PendingCall, ThreadState
from torpor.processors.fold.verify import KeyringVerifier, SourceVerifier
from torpor.processors.step import StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import load_state, read_entries
from torpor.processors.trust import trust_for, verifier_for
from torpor.schemas import signing
from torpor.schemas.errors import ConfigError
from torpor.schemas.keyring import KeyRing, KeyVersion, keyring_toml
from torpor.schemas.records import (
    Input,
    InputBody,
    ParentMessage,
    TextBlock,
    TimerFired,
    ToolResult,
    ToolSpec,
)
from torpor.schemas.signer import write_private_key
from torpor.streams.config import InputSettings

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
STRANGER = Ed25519PrivateKey.from_private_bytes(bytes(range(7, 39)))
LOOKUP = ToolSpec(
    name="lookup",
    description="returns a count",
    parameters=OBJECT_SCHEMA,
    result_schema=json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    passive=False,
    toolset="test",
)


def _raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _version(key_id: str, tools: tuple[str, ...], tenants: tuple[str, ...] = ("acme",),
             sources: tuple[str, ...] = ("connector:*",)) -> KeyVersion:
    return KeyVersion(key_id=key_id, public_key=_raw(KEY), sources=sources, tools=tools,
                      tenants=tenants, valid_from=0, valid_until=None)


RING = KeyRing((
    _version("tools-1", ("search", "lookup")),
    _version("fetch-only", ("fetch",)),
    _version("other-tenant", ("search",), tenants=("globex",)),
    _version("timer-1", ("timer",), sources=("timer",)),
))


def _waiting_world() -> tuple[World, ThreadState, dict[str, PendingCall]]:
    """Thread `t` with two calls pending: `search` (c1) and `lookup` (c2)."""
    world = World()
    world.send("t", create(config(tools=(*config().tools, LOOKUP), granted=("search", "lookup", "fetch"))))
    world.reply("t", "working", (call("c1", "search", {"q": "x"}), call("c2", "lookup")))
    state = world.state("t")
    return world, state, {c.call_id: c for c in state.pending_calls}


def _input(body: InputBody, source: str = "connector:tools", message_id: str = "r1") -> Input:
    return Input(message_id=message_id, thread_id="t", created_at=5_000_000, source=source,
                 expires_at=None, key_id=None, signature=None, body=body)


def _judge(record: Input, state: ThreadState | None) -> tuple[str, str]:
    verdict = KeyringVerifier(RING).verify(record, state)
    return verdict.provenance, verdict.reason


def test_source_verifier_is_development_mode_and_says_so() -> None:
    _, state, pending = _waiting_world()
    record = _input(result("c1", pending["c1"].request_id))
    verdict = SourceVerifier().verify(record, state)
    assert (verdict.provenance, verdict.reason) == ("unsigned", "no_keyring")


@pytest.mark.parametrize(("source", "key_id", "signature"), [
    ("processor", None, None),  # claims the processor, signs nothing
    ("connector:shell", "", bytes(64)),  # an empty key id, a signature of nobody's
    ("operator", "k" * 200_000, b"\x01" * 64),  # a huge key id
    ("user:u", "gateway-1", None),  # a key id without a signature
])
def test_source_verifier_says_the_same_whatever_an_input_claims(
        source: str, key_id: str | None, signature: bytes | None) -> None:
    # Development mode shares one verdict between the inputs without a key id: every input,
    # whatever it claims, is judged `unsigned`, `no_keyring`, with its own key id.
    _, state, pending = _waiting_world()
    record = dataclasses.replace(_input(result("c1", pending["c1"].request_id), source=source),
                                 key_id=key_id, signature=signature)
    verdicts = [SourceVerifier().verify(record, state), SourceVerifier().verify(record, None)]
    for verdict in verdicts:
        assert (verdict.provenance, verdict.reason, verdict.key_id) == ("unsigned", "no_keyring", key_id)
    with pytest.raises(dataclasses.FrozenInstanceError):  # a shared verdict no caller can change
        verdicts[0].key_id = "other"  # type: ignore[misc]


def test_a_correctly_signed_result_for_a_pending_call_is_verified() -> None:
    _, state, pending = _waiting_world()
    record = signing.sign(_input(result("c1", pending["c1"].request_id)), "tools-1", KEY)
    assert _judge(record, state) == ("verified", signing.SIGNATURE_OK)


def test_an_unsigned_connector_result_is_missing_its_signature() -> None:
    _, state, pending = _waiting_world()
    assert _judge(_input(result("c1", pending["c1"].request_id)), state) == ("unsigned", "missing_signature")


def test_user_text_to_a_public_thread_needs_no_signature() -> None:
    _, state, _ = _waiting_world()
    public = dataclasses.replace(state, config=dataclasses.replace(
        state.config, capability=dataclasses.replace(state.config.capability, tenant=PUBLIC_TENANT)))
    record = _input(user("one more thing"), source="user:alice")
    assert _judge(record, public) == ("unsigned", signing.SIGNATURE_NOT_REQUIRED)


def test_unsigned_user_text_to_a_tenants_thread_is_refused() -> None:
    _, state, _ = _waiting_world()  # tenant acme: its threads take user input only under its keys
    assert _judge(_input(user("one more thing"), source="user:alice"), state) == (
        "unsigned", "missing_signature")


def test_a_tampered_result_is_forged() -> None:
    _, state, pending = _waiting_world()
    record = signing.sign(_input(result("c1", pending["c1"].request_id, "genuine")), "tools-1", KEY)
    tampered = dataclasses.replace(record, body=result("c1", pending["c1"].request_id, "rm -rf /"))
    assert _judge(tampered, state) == ("forged", signing.BAD_SIGNATURE)


def test_a_key_the_ring_does_not_know_is_forged() -> None:
    _, state, pending = _waiting_world()
    record = signing.sign(_input(result("c1", pending["c1"].request_id)), "nobody", STRANGER)
    assert _judge(record, state) == ("forged", signing.UNKNOWN_KEY)


def test_a_valid_key_is_refused_for_a_tool_it_does_not_cover() -> None:
    _, state, pending = _waiting_world()
    record = signing.sign(_input(result("c1", pending["c1"].request_id)), "fetch-only", KEY)
    assert _judge(record, state) == ("forged", signing.KEY_NOT_ALLOWED_FOR_TOOL)


def test_a_key_of_another_tenant_is_refused() -> None:
    _, state, pending = _waiting_world()
    record = signing.sign(_input(result("c1", pending["c1"].request_id)), "other-tenant", KEY)
    assert _judge(record, state) == ("forged", signing.KEY_NOT_ALLOWED_FOR_TENANT)


def test_an_answer_to_another_dispatch_is_unbound() -> None:
    _, state, _ = _waiting_world()
    record = signing.sign(_input(result("c1", "an-earlier-attempt")), "tools-1", KEY)
    assert _judge(record, state) == ("unbound", "request_id_mismatch")


def test_a_call_the_thread_does_not_have_pending_is_left_to_the_fold() -> None:
    _, state, _ = _waiting_world()
    record = signing.sign(_input(result("c9", "whatever")), "tools-1", KEY)
    assert _judge(record, state) == ("verified", signing.SIGNATURE_OK)


@pytest.mark.parametrize(
    ("text", "why"),
    [('{"n": "many"}', "result_schema: "), ("not json", "result_schema: not JSON"),
     ("{}", "result_schema: ")],
)
def test_a_result_that_breaks_its_tool_result_schema_is_invalid(text: str, why: str) -> None:
    _, state, pending = _waiting_world()
    body = ToolResult(call_id="c2", request_id=pending["c2"].request_id, ok=True,
                      content=(TextBlock(text),), subscription=False)
    provenance, reason = _judge(signing.sign(_input(body), "tools-1", KEY), state)
    assert provenance == "invalid"
    assert reason.startswith(why)


def test_a_result_that_fits_its_schema_and_an_error_result_are_verified() -> None:
    _, state, pending = _waiting_world()
    good = ToolResult(call_id="c2", request_id=pending["c2"].request_id, ok=True,
                      content=(TextBlock('{"n": 3}'),), subscription=False)
    failed = ToolResult(call_id="c2", request_id=pending["c2"].request_id, ok=False,
                        content=(TextBlock("lookup service down"),), subscription=False)
    for body in (good, failed):
        assert _judge(signing.sign(_input(body), "tools-1", KEY), state)[0] == "verified"


def test_a_timer_is_checked_against_the_timer_tool_scope() -> None:
    world = World()
    world.send("t", create(config(granted=("search", "sleep"))))
    world.reply("t", "napping", (call("z1", "sleep", {"seconds": 60}),))
    (pending,) = world.state("t").pending_calls
    fired = _input(TimerFired(call_id="z1", request_id=pending.request_id, due_at=1), source="timer")
    assert _judge(signing.sign(fired, "timer-1", KEY), world.state("t")) == ("verified", signing.SIGNATURE_OK)
    assert _judge(signing.sign(fired, "tools-1", KEY), world.state("t"))[0] == "forged"


# --- through step: the receipt, and history that did not move ------------------------


def _stepped(records: list[Input]) -> tuple[MemoryStore, list[tuple[str, str | None]]]:
    """A store holding thread `t` with c1/c2 pending, then `records` folded over it."""
    world, _, _ = _waiting_world()
    store = MemoryStore()
    setup = [StepRecord(r, 0, i) for i, r in enumerate(world.inputs)]
    step(store, setup)  # development mode: the thread's own setup needs no signatures
    out = step(store, [StepRecord(r, 0, 100 + i) for i, r in enumerate(records)],
               verifier=KeyringVerifier(RING))
    return store, [(r.disposition, r.reason) for r in out.receipts]


def test_refused_inputs_get_a_receipt_and_leave_history_alone() -> None:
    world, _, pending = _waiting_world()
    request = pending["c1"].request_id
    refused = [
        _input(result("c1", request), message_id="unsigned"),
        dataclasses.replace(signing.sign(_input(result("c1", request), message_id="forged"), "tools-1", KEY),
                            body=result("c1", request, "tampered")),
        signing.sign(_input(result("c1", request), message_id="scope"), "fetch-only", KEY),
        signing.sign(_input(result("c1", "old-request"), message_id="unbound"), "tools-1", KEY),
    ]
    store, receipts = _stepped(refused)
    assert receipts == [
        ("rejected:unsigned", "missing_signature"),
        ("rejected:forged", "bad_signature"),
        ("rejected:forged", "key_not_allowed_for_tool"),
        ("rejected:unbound", "request_id_mismatch"),
    ]
    assert list(read_entries(store, "t")) == world.histories["t"]
    state = load_state(store, "t")
    assert state is not None and {c.call_id for c in state.pending_calls} == {"c1", "c2"}


def test_a_refused_id_is_not_remembered_so_the_genuine_record_still_applies() -> None:
    _, _, pending = _waiting_world()
    request = pending["c1"].request_id
    unsigned = _input(result("c1", request), message_id="same-id")
    genuine = signing.sign(unsigned, "tools-1", KEY)
    store, receipts = _stepped([unsigned, genuine])
    assert [d for d, _ in receipts] == ["rejected:unsigned", "applied"]
    state = load_state(store, "t")
    assert state is not None and [c.call_id for c in state.pending_calls] == ["c2"]


# --- verifier_for ----------------------------------------------------------------------


def test_verifier_for_without_a_key_ring_is_development_mode() -> None:
    assert isinstance(verifier_for(InputSettings()), SourceVerifier)


def test_verifier_for_reads_the_key_ring_file(tmp_path: Path) -> None:
    processor = Ed25519PrivateKey.generate()
    judge = verifier_for(InputSettings(keyring=_ring_with_processor(tmp_path, processor),
                                       processor_key_id="proc-1", processor_key=_pem(tmp_path, processor)))
    _, state, pending = _waiting_world()
    record = signing.sign(_input(result("c1", pending["c1"].request_id)), "tools-1", KEY)
    assert judge.verify(record, state).provenance == "verified"


def test_a_key_ring_without_a_processor_key_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "ring.toml"
    path.write_text(keyring_toml(RING), encoding="utf-8")
    with pytest.raises(ConfigError, match="no key of its own"):
        verifier_for(InputSettings(keyring=path))


def test_verifier_for_names_an_unreadable_key_ring(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        verifier_for(InputSettings(keyring=tmp_path / "missing.toml"))


# --- the processor's own key ---------------------------------------------------------


def _pem(tmp_path: Path, key: Ed25519PrivateKey, name: str = "proc.pem") -> Path:
    path = tmp_path / name
    path.unlink(missing_ok=True)  # a test may write the processor's key more than once
    write_private_key(path, key)
    return path


def _ring_with_processor(tmp_path: Path, key: Ed25519PrivateKey, source: str = "processor") -> Path:
    path = tmp_path / "ring.toml"
    entry = KeyVersion(key_id="proc-1", public_key=_raw(key), sources=(source,))
    path.write_text(keyring_toml(KeyRing((*RING.entries, entry))), encoding="utf-8")
    return path


def test_with_a_processor_key_unsigned_processor_inputs_are_refused(tmp_path: Path) -> None:
    processor = Ed25519PrivateKey.generate()
    settings = InputSettings(keyring=_ring_with_processor(tmp_path, processor), processor_key_id="proc-1",
                             processor_key=_pem(tmp_path, processor))
    judge = verifier_for(settings)
    _, state, _ = _waiting_world()
    loopback = _input(ParentMessage(parent_thread_id="p", spawn_call_id="s", text="hi"), source="processor")
    assert (judge.verify(loopback, state).provenance, judge.verify(loopback, state).reason) == (
        "unsigned", "missing_signature")
    signer = trust_for(settings).signer
    assert signer is not None
    assert judge.verify(signer.sign(loopback), state).provenance == "verified"
    # The processor may not write user text, signed or not: no role may claim another's body.
    assert judge.verify(signer.sign(_input(user("hi"), source="processor")), state).reason \
        == "source_not_allowed"


def test_a_processor_key_missing_from_the_ring_is_a_config_error(tmp_path: Path) -> None:
    processor = Ed25519PrivateKey.generate()
    ring = _ring_with_processor(tmp_path, Ed25519PrivateKey.generate())  # another public key
    with pytest.raises(ConfigError, match="has no version of key 'proc-1'"):
        trust_for(InputSettings(keyring=ring, processor_key_id="proc-1",
                                       processor_key=_pem(tmp_path, processor)))
    wrong_source = _ring_with_processor(tmp_path, processor, source="connector:*")
    with pytest.raises(ConfigError, match="allowed for source 'processor'"):
        trust_for(InputSettings(keyring=wrong_source, processor_key_id="proc-1",
                                       processor_key=_pem(tmp_path, processor)))


def test_a_processor_key_needs_its_file_and_a_key_ring(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TORPOR_PROCESSOR_KEY"):
        InputSettings(keyring=tmp_path / "ring.toml", processor_key_id="proc-1")
    with pytest.raises(ConfigError, match="TORPOR_KEYRING"):
        InputSettings(processor_key_id="proc-1", processor_key=tmp_path / "proc.pem")
