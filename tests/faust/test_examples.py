"""The Faust examples of `docs/faust/` against a real broker, as processes.

A processor (scripted model, key ring) asks for the `effect` tool; the tool is served by
`docs/faust/effect_connector.py`, a Faust worker, whose answers are signed with its own
key; `docs/faust/audit_app.py`, another Faust worker, writes every receipt and committed
event it reads to a file. The connector worker is killed twice with SIGKILL: once by the
`after_effect` fault (the effect done, its answer not produced: the reconciler finds it
after the restart), once by the test after the answer reached `inputs` (its outbox offset
possibly not committed: the journal keeps the redelivered dispatch from running again).
Each request's effect happens once, each answer is one input applied once, verified.

A dispatch written in an aborted transaction (a zombie processor's) is never performed:
`torpor.faust.App` reads the outbox read_committed. A record that is no dispatch does not
stop the connector, and another tool's dispatch is left to its own connector.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.processors.test_processor import REPO, TORPOR, Deployment, deployment
from tests.waiting import wait_until
from torpor.schemas.codec import encode_value
from torpor.schemas.keyring import KeyRing, KeyVersion, keyring_toml
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Dispatch,
    Input,
    TextBlock,
    ThreadConfig,
    ToolResult,
    ToolSpec,
    UserMessage,
)
from torpor.schemas.signer import Signer, SignerSettings, public_key_bytes, write_private_key

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

EXAMPLES: Final = REPO / "docs" / "faust"
SCRIPT: Final = """\
[thread]
id = "unused"

[[model]]
last_contains = "wrote 'second'"
turns = [{ text = "Done again." }]

[[model]]
last_contains = "wrote 'first'"
turns = [{ text = "The effect is done." }]

[[model]]
last_contains = "act again"
turns = [{ text = "Acting again.", calls = [{ name = "effect", arguments = { note = "second" } }] }]

[[model]]
last_contains = "please act"
turns = [{ text = "Acting.", calls = [{ name = "effect", arguments = { note = "first" } }] }]
"""


def _key(root: Path, key_id: str, source: str, tools: tuple[str, ...] = ("*",)) -> tuple[Path, KeyVersion]:
    key = Ed25519PrivateKey.generate()
    pem = root / f"{key_id}.pem"
    write_private_key(pem, key)
    return pem, KeyVersion(key_id=key_id, public_key=public_key_bytes(key), sources=(source,), tools=tools)


def _effect_spec() -> ToolSpec:
    """The example's own spec (importing the example builds its app; it opens nothing)."""
    path = EXAMPLES / "effect_connector.py"
    found = importlib.util.spec_from_file_location("effect_connector_example", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    spec = module.EFFECT_SPEC
    assert isinstance(spec, ToolSpec)
    return spec


def _performed(path: Path) -> list[str]:
    """The request ids in the effect file, one per effect, in order."""
    return [line.split(" ", 1)[0] for line in path.read_text().splitlines()] if path.exists() else []


def _worker(deployment: Deployment, example: str, name: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / example), "--datadir", str(deployment.root / f"{name}-data"),
            "worker", "--without-web", "--loglevel=info"]


def _results(deployment: Deployment, request_id: str) -> list[Input]:
    return [i for i in deployment.inputs()
            if isinstance(i.body, ToolResult) and i.body.request_id == request_id]


def _took_everything(deployment: Deployment) -> bool:
    """The example connector's group committed past the last dispatch of every outbox partition.

    The processor writes the outbox in transactions, so each partition ends with a commit
    marker, one offset past its last dispatch: that dispatch is taken when the committed
    offset reaches the marker's."""
    topic = deployment.topic("outbox")
    group = f"{deployment.prefix}faust-effect"  # the example's app id, Faust's group
    consumer = Consumer({"bootstrap.servers": deployment.bootstrap, "group.id": group})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        for found in committed:
            _, high = consumer.get_watermark_offsets(found, timeout=10)
            if high > 0 and found.offset < high - 1:
                return False
        return True
    finally:
        consumer.close()


def test_a_faust_connector_killed_and_restarted_performs_each_effect_once(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _effect_spec()
    faust_pem, faust_key = _key(tmp_path, "faust-1", "connector:effect", ("effect",))
    proc_pem, proc_key = _key(tmp_path, "proc-1", "processor")
    gateway_pem, gateway_key = _key(tmp_path, "gateway-1", "user:*")
    gateway = Signer.from_settings(SignerSettings("gateway-1", gateway_pem))
    ring = tmp_path / "keyring.toml"
    ring.write_text(keyring_toml(KeyRing((faust_key, proc_key, gateway_key))))
    effects, audit = tmp_path / "effects.txt", tmp_path / "audit.jsonl"
    for name, value in {"TORPOR_KEYRING": str(ring), "TORPOR_PROCESSOR_KEY_ID": "proc-1",
                        "TORPOR_PROCESSOR_KEY": str(proc_pem), "TORPOR_SIGNING_KEY_ID": "faust-1",
                        "TORPOR_SIGNING_KEY": str(faust_pem), "EFFECT_FILE": str(effects),
                        "AUDIT_FILE": str(audit), "TORPOR_JOURNAL_DIR": str(tmp_path / "journal")}.items():
        monkeypatch.setenv(name, value)
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    thread = f"faust-{uuid.uuid4().hex[:8]}"
    config = ThreadConfig(
        model="scripted", system_prompt="Use the tool.", tools=(spec,),
        capability=Capability(tenant="test", tools=("effect",), scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False)

    def user(label: str, body: CreateThread | UserMessage) -> Input:
        return gateway.sign(Input(f"{thread}-{label}", thread, int(time.time() * 1000), "user:test", None,
                                  None, None, body))

    deployment.send(user("create", CreateThread(config, (), ())),
                    user("ask", UserMessage((TextBlock("please act"),))))
    processor = deployment.start([
        TORPOR, "processor", "--instance", "p0", "--app", f"app-{deployment.prefix}",
        "--store-dir", str(tmp_path / "stores"), "--script", str(script)], "processor")
    auditor = deployment.start(_worker(deployment, "audit_app.py", "audit"), "audit")

    # 1. Killed between the effect and its answer (the fault kills the worker with SIGKILL).
    monkeypatch.setenv("TORPOR_CONNECTOR_FAULT", "after_effect")
    crashing = deployment.start(_worker(deployment, "effect_connector.py", "effect"), "effect-0")
    wait_until(lambda: crashing.poll() is not None, timeout=180,
               message=lambda: f"the fault's kill; worker log:\n{deployment.log('effect-0')[-3000:]}")
    assert crashing.returncode == -signal.SIGKILL, deployment.log("effect-0")[-3000:]
    (first,) = [d.request_id for d in deployment.dispatches() if d.thread_id == thread]
    assert _performed(effects) == [first]
    assert not _results(deployment, first)

    monkeypatch.delenv("TORPOR_CONNECTOR_FAULT")
    worker = deployment.start(_worker(deployment, "effect_connector.py", "effect"), "effect-1")
    wait_until(lambda: "The effect is done." in deployment.answers(thread), timeout=180,
               message=lambda: f"the first answer; worker log:\n{deployment.log('effect-1')[-3000:]}")
    assert _performed(effects) == [first]  # reconciled, not performed again
    assert "1 effects reconciled" in deployment.log("effect-1")

    # 2. Killed after the answer reached `inputs`, its dispatch's offset maybe uncommitted.
    deployment.send(user("again", UserMessage((TextBlock("act again"),))))
    wait_until(lambda: len(_performed(effects)) == 2 and _results(deployment, _performed(effects)[1]),
               timeout=180, message=lambda: f"the second answer; worker log:\n"
                                            f"{deployment.log('effect-1')[-3000:]}")
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    second = _performed(effects)[1]
    restarted = deployment.start(_worker(deployment, "effect_connector.py", "effect"), "effect-2")
    wait_until(lambda: "Done again." in deployment.answers(thread), timeout=180,
               message=lambda: f"the last answer; worker log:\n{deployment.log('effect-2')[-3000:]}")
    # Before counting effects: the restarted worker has taken every dispatch again that its
    # predecessor took but had not committed (else a duplicate could still be coming).
    wait_until(lambda: _took_everything(deployment), timeout=180,
               message=lambda: f"the restarted worker's commit; log:\n{deployment.log('effect-2')[-3000:]}")

    assert _performed(effects) == [first, second]  # one effect per dispatch, across both kills
    assert deployment.answers(thread) == ["Acting.", "The effect is done.", "Acting again.", "Done again."]
    receipts = deployment.receipts()
    for request_id, text in ((first, "wrote 'first' (found after a restart)"), (second, "wrote 'second'")):
        results = _results(deployment, request_id)
        assert {r.message_id for r in results} == {results[0].message_id}  # any copy is the same input
        body = results[0].body
        assert isinstance(body, ToolResult) and body.content == (TextBlock(text),)
        assert {(r.source, r.key_id) for r in results} == {("connector:effect", "faust-1")}
        applied = [r for r in receipts if r.input_id == results[0].message_id and r.disposition == "applied"]
        assert len(applied) == 1 and applied[0].provenance == "verified"

    # The audit app saw, through the Faust codec, one receipt for each input.
    def audited() -> Counter[str] | None:
        lines = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
        seen = Counter(line["input_id"] for line in lines if line["topic"] == "receipts")
        return seen if set(seen) >= {r.input_id for r in receipts} else None

    seen = wait_until(audited, timeout=120, message=lambda: f"the audit; log:\n"
                                                            f"{deployment.log('audit')[-3000:]}")
    assert seen == Counter(r.input_id for r in receipts)
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    turns = [line["text"] for line in lines if line["topic"] == "events"
             and line["thread_id"] == thread and line["kind"] == "turn_committed"]
    assert turns == deployment.answers(thread)

    for process in (processor, restarted, auditor):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_only_committed_decodable_dispatches_of_its_own_tools_are_performed(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = tmp_path / "effects.txt"
    monkeypatch.setenv("EFFECT_FILE", str(effects))
    monkeypatch.setenv("TORPOR_JOURNAL_DIR", str(tmp_path / "journal"))
    capability = Capability(tenant="test", tools=("effect",), scopes=(), expires_at=None)

    def dispatch(request_id: str, tool: str = "effect") -> bytes:
        return encode_value(Dispatch(
            request_id=request_id, thread_id="zombie-thread", call_id=request_id, tool=tool,
            arguments=json.dumps({"note": request_id}), capability=capability, attempt=0, created_at=1,
            deadline=None, kind="invoke"))

    # On one partition, in order: a zombie processor's aborted transaction, a record that is
    # no Dispatch, a dispatch for another connector's tool, then a committed dispatch.
    zombie = Producer({"bootstrap.servers": deployment.bootstrap,
                       "transactional.id": f"zombie-{deployment.prefix}"})
    outbox, key = deployment.topic("outbox"), b"zombie-thread"
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(outbox, key=key, value=dispatch("aborted"))
    zombie.flush(30)
    zombie.abort_transaction(30)
    zombie.begin_transaction()
    zombie.produce(outbox, key=key, value=b"\xc3\x01not a dispatch")
    zombie.produce(outbox, key=key, value=dispatch("other-tool", tool="echo"))
    zombie.produce(outbox, key=key, value=dispatch("committed"))
    zombie.commit_transaction(30)

    worker = deployment.start(_worker(deployment, "effect_connector.py", "effect"), "effect")
    wait_until(lambda: _performed(effects) == ["committed"] and _results(deployment, "committed"),
               timeout=180,
               message=lambda: f"the committed dispatch's answer; worker log:\n"
                               f"{deployment.log('effect')[-3000:]}")
    assert not _results(deployment, "aborted") and not _results(deployment, "other-tool")
    log = deployment.log("effect")
    assert "undecodable record skipped" in log and "unknown schema fingerprint" in log
    assert "Crashed" not in log  # skipped by the topic, not thrown into the agent
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
