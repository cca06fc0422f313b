"""Local mode end to end: the bundled demo scenario, its transcript, receipts and replay.

The demo is the acceptance of local mode: an agent calls an async tool, spawns two
children that report back, receives a threaded and an associative subscription event,
is interrupted by user text, asks for and receives an approval, sleeps a second and
wakes, and is stopped. Re-folding the recorded inputs must give the same rows, byte for
byte, and the same hash-chain heads.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from bench.workload import BenchModel, ForgetfulBenchTool, agent_id, create_input, turn_input
from tests.processors.test_store import wal_bytes
from torpor.cli.local import DEMO, LocalRun, play
from torpor.cli.scenario import load, parse
from torpor.processors.fold.state import Status
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore, RocksStore
from torpor.processors.store.statecodec import decode_state
from torpor.processors.store.tables import load_state
from torpor.processors.storedirs import partition_dir
from torpor.schemas.records import (
    ApprovalDecision,
    ApprovalRequest,
    ChildReport,
    Control,
    CreateThread,
    Input,
    TimerFired,
    ToolEvent,
    ToolResult,
    UserMessage,
)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-store")


@pytest.fixture(scope="module")
def demo(store_dir: Path) -> LocalRun:
    # A store directory of the test's (kept after the run closes): the rows it holds are
    # what the refold below must give.
    return asyncio.run(play(load(DEMO), LocalConfig(store="rocks", store_dir=store_dir), echo=False))


def bodies(run: LocalRun) -> list[Input]:
    return [r.value for r in run.runtime.inputs()]


def test_the_demo_shows_every_step(demo: LocalRun) -> None:
    inputs = bodies(demo)
    root = demo.thread_id
    text = "\n".join(demo.transcript.lines)
    results = [i.body for i in inputs if isinstance(i.body, ToolResult)]
    assert any("echo: ping" in json.dumps(str(r.content)) for r in results)
    children = [i.body for i in inputs if isinstance(i.body, CreateThread) and i.body.config.parent]
    kinds = Counter(c.config.parent.kind for c in children if c.config.parent)
    assert kinds == {"child": 2, "event": 1}
    reports = [i.body for i in inputs if isinstance(i.body, ChildReport) and i.thread_id == root]
    assert {r.text for r in reports} >= {
        "region eu-west healthy",
        "region us-east healthy",
        "the alert was a false alarm",
    }
    events = [i.body for i in inputs if isinstance(i.body, ToolEvent)]
    assert sorted(e.associative for e in events) == [False, True]
    assert any(isinstance(r, ToolResult) and r.subscription for r in results)
    assert "· interrupted" in text and "dispatch               cancel echo" in text
    assert any(isinstance(i.body, ApprovalRequest) for i in inputs)
    assert any(isinstance(i.body, ApprovalDecision) and i.body.choice == "approve" for i in inputs)
    assert "deployed web" in text
    assert any(isinstance(i.body, TimerFired) for i in inputs) and "Awake again" in text
    assert any(isinstance(i.body, Control) and i.body.command == "stop" for i in inputs)
    assert "· stopped" in text
    said = [i.body for i in inputs if isinstance(i.body, UserMessage)]
    assert len(said) == 4


def test_the_timer_waited_for_the_wall_clock(demo: LocalRun) -> None:
    inputs = bodies(demo)
    (fired,) = [i for i in inputs if isinstance(i.body, TimerFired)]
    assert isinstance(fired.body, TimerFired) and fired.created_at >= fired.body.due_at


def test_every_input_has_exactly_one_receipt(demo: LocalRun) -> None:
    receipts = demo.runtime.log.read_all(demo.runtime.topics.receipts)
    by_position = Counter((r.value.input_partition, r.value.input_offset) for r in receipts)
    positions = {(r.partition, r.offset): r.value.message_id for r in demo.runtime.inputs()}
    assert set(by_position) == set(positions) and set(by_position.values()) == {1}
    for receipt in receipts:
        assert (
            positions[(receipt.value.input_partition, receipt.value.input_offset)] == receipt.value.input_id
        )


def test_refolding_the_recorded_inputs_gives_the_same_rows_and_heads(demo: LocalRun, store_dir: Path) -> None:
    runtime = demo.runtime
    live: dict[bytes, bytes] = {}
    for partition in range(runtime.config.partitions):
        store = RocksStore(partition_dir(store_dir, partition))
        try:
            live.update(store.iterate(b""))
        finally:
            store.close()
    # The run's own bookkeeping (the input offset it reached) is not the fold's.
    offsets = {k: v for k, v in live.items() if k.startswith(keys.meta_key(b""))}
    assert offsets and all(k.startswith(keys.meta_key(keys.META_INPUT_OFFSET)) for k in offsets)
    live = {k: v for k, v in live.items() if k not in offsets}
    replayed = MemoryStore()
    for partition in range(runtime.config.partitions):
        records = runtime.log.read(runtime.topics.inputs, partition, 0)
        step(replayed, [StepRecord(r.value, r.partition, r.offset) for r in records])
    assert live == dict(replayed.iterate(b""))
    heads = {}
    for record in runtime.log.read_all(runtime.topics.receipts):
        heads[record.value.thread_id] = record.value.history_after
    for thread_id, head in heads.items():
        state = load_state(replayed, thread_id)
        assert state is not None and state.head == head
    root = demo.thread_id
    root_state = decode_state(live[keys.state_key(root)], live.get(keys.config_key(root)),
                              live.get(keys.answered_key(root)))
    assert root_state.status is Status.STOPPED


def test_a_scenario_with_a_flaky_model_retries_and_continues() -> None:
    scenario = parse(
        {
            "thread": {"id": "solo", "tools": ["echo"]},
            "model": [
                {"thread": "solo", "turns": [{"text": "fine", "transient_failures": 1}, {"text": "again"}]}
            ],
            "steps": [{"say": "hello"}, {"wait": "idle"}, {"say": "more"}, {"wait": "idle"}],
        }
    )
    run = asyncio.run(play(scenario, LocalConfig(store="memory"), echo=False))
    events = [r.value.kind for r in run.runtime.log.read_all(run.runtime.topics.events)]
    assert "completion_retried" in events
    assert any("fine" in line for line in run.transcript.lines) and any(
        "again" in line for line in run.transcript.lines
    )


def test_threads_spread_over_partitions_keep_one_receipt_per_input() -> None:
    scenario = parse(
        {
            "thread": {"id": "spread", "tools": []},
            "model": [
                {
                    "thread": "spread",
                    "last_contains": "go",
                    "turns": [
                        {
                            "text": "spawning",
                            "calls": [
                                {"name": "spawn_thread", "arguments": {"instructions": f"task {i}"}}
                                for i in range(4)
                            ],
                        }
                    ],
                },
                {
                    "kind": "child",
                    "turns": [{"calls": [{"name": "close_thread", "arguments": {"report": "done"}}]}],
                },
            ],
            "steps": [{"say": "go"}, {"wait": "idle"}],
        }
    )
    run = asyncio.run(play(scenario, LocalConfig(store="memory", partitions=3), echo=False))
    receipts = run.runtime.log.read_all(run.runtime.topics.receipts)
    assert len(receipts) == len(run.runtime.inputs())
    reports = [i for i in bodies(run) if isinstance(i.body, ChildReport)]
    assert len(reports) == 4
    assert len({r.partition for r in run.runtime.inputs()}) > 1


def test_torpor_local_run_prints_the_transcript_and_a_summary() -> None:
    from click.testing import CliRunner

    from torpor.cli import main

    result = CliRunner().invoke(main, ["local", "run", str(DEMO), "--store", "memory"])
    assert result.exit_code == 0, result.output
    assert "agent/child-1" in result.output and "approval?" in result.output
    assert "receipts" in result.output.splitlines()[-1]


def test_a_malformed_scenario_is_refused_with_the_entry_named() -> None:
    from torpor.cli.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=r"\[\[steps\]\] #1"):
        parse({"thread": {"id": "x"}, "steps": [{"dance": True}]})
    with pytest.raises(ScenarioError, match=r"\[thread\]"):
        parse({"steps": []})


@pytest.mark.parametrize("own_directory", [True, False])
def test_local_modes_own_temp_store_keeps_no_write_ahead_log_and_a_given_directory_does(
    tmp_path: Path, own_directory: bool
) -> None:
    """A temp directory is removed on close and never opened again: a log would protect
    nothing. A directory the caller gives may be opened again: its log stays on."""
    given = None if own_directory else tmp_path / "stores"
    config = LocalConfig(store="rocks", partitions=2, store_dir=given)

    async def run() -> Path:
        runtime: LocalRuntime
        tool = ForgetfulBenchTool(lambda record: runtime.send(record), now_ms)
        runtime = LocalRuntime(BenchModel(), tool, config)
        try:
            agents = [agent_id(i) for i in range(4)]
            for thread_id in agents:
                runtime.send(create_input(thread_id, now_ms()))
                runtime.send(turn_input(thread_id, 1, now_ms()))
            await runtime.run_until_idle(60)
            root = runtime.store_root
            assert root is not None and root.is_dir()
            assert all(any(load_state(store, t) is not None for store in runtime.stores) for t in agents)
            assert (wal_bytes(root) == 0) is own_directory
            return root
        finally:
            await runtime.close()

    root = asyncio.run(run())
    assert root.exists() is not own_directory  # the temp directory went with the runtime
