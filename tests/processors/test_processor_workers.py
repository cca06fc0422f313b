"""`torpor processor --workers N`: N processes of one app share the partitions, supervised by one.

Against the real broker, with the scripted model and the echo connector:
- two workers split the three partitions between them (each restores at least one into
  its own store), every conversation completes exactly once, and a SIGTERM to the
  supervisor stops both cleanly (exit 0);
- a SIGKILLed supervisor takes its workers with it (they get SIGTERM, Linux's
  PR_SET_PDEATHSIG): nothing is left holding the partitions;
- a worker killed with SIGKILL makes the supervisor stop the other one and exit with the
  killed one's status (137); started again with the same names, the workers finish
  every conversation exactly once.
- without `--workers` (and without TORPOR_PROCESSOR_WORKERS, which the test session pins
  to 1) the command runs `default_workers(partitions)` workers, one per usable core but no
  more than the partitions, each given its share of the `[memory]` budgets.
The options handed down to the workers are checked without a broker.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path

import click
import psutil
import pytest

import torpor.cli.workers as workers_module
from tests.processors.test_processor import (
    PARTITIONS,
    REPO,
    TORPOR,
    Deployment,
    Tail,
    _assert_exactly_once,
    _conversation,
    deployment,
)
from tests.waiting import wait_until
from torpor.cli.processor import processor
from torpor.cli.workers import WORKERS_ENV, default_workers, given_options, worker_commands

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

__all__ = ["deployment"]  # the fixture, shared with test_processor

FINAL = "The echo said ping."


def _workers(deployment: Deployment, name: str) -> psutil.Process:
    started = deployment.start(deployment.processor_args("p0", "--workers", "2"), name)
    return psutil.Process(started.pid)


def _children(supervisor: psutil.Process) -> list[psutil.Process]:
    wait_until(lambda: len(supervisor.children()) == 2, timeout=60, message="two worker processes")
    return supervisor.children()


def _answered(finals: Tail, threads: list[str]) -> bool:
    return {thread for thread, text in finals.answers() if text == FINAL} >= set(threads)


def _restored_partitions(store: Path) -> set[str]:
    return {p.name for p in store.iterdir() if p.is_dir()} if store.exists() else set()


def test_two_workers_split_the_partitions_and_every_turn_completes_exactly_once(
    deployment: Deployment,
) -> None:
    supervisor = _workers(deployment, "processor")
    workers = _children(supervisor)
    # The first worker to join takes every partition; the second's join moves some over.
    stores = deployment.root / "stores-p0"
    wait_until(lambda: all(_restored_partitions(stores / w) for w in ("w0", "w1")), timeout=120,
               message=lambda: f"both workers own partitions; log:\n{deployment.log('processor')[-3000:]}")
    threads = [f"workers-{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    for thread_id in threads:
        deployment.send(*_conversation(thread_id, "please ping"))
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}"], "echo")
    finals = Tail(deployment.bootstrap, deployment.topic("events"))
    wait_until(lambda: _answered(finals, threads), timeout=240,
               message=lambda: f"every final answer; log:\n{deployment.log('processor')[-3000:]}")

    log = deployment.log("processor")
    assert "processor p0-w0 started" in log and "processor p0-w1 started" in log, log[-3000:]
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=120) == 0, deployment.log("processor")[-3000:]
    assert not any(w.is_running() for w in workers)
    echo.send_signal(signal.SIGTERM)
    assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]
    _assert_exactly_once(deployment)


def test_a_killed_worker_stops_the_other_and_a_restart_finishes_every_turn_exactly_once(
    deployment: Deployment,
) -> None:
    threads = [f"killed-{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    for thread_id in threads:
        deployment.send(*_conversation(thread_id, "please ping slowly"))
    receipts = Tail(deployment.bootstrap, deployment.topic("receipts"))
    supervisor = _workers(deployment, "processor-0")
    victim, survivor = _children(supervisor)
    wait_until(lambda: receipts.count() >= 24, timeout=180, message="the first receipts")
    victim.send_signal(signal.SIGKILL)
    assert supervisor.wait(timeout=120) == 128 + signal.SIGKILL, deployment.log("processor-0")[-3000:]
    wait_until(lambda: not survivor.is_running(), timeout=60, message="the other worker stopped")
    log = deployment.log("processor-0")
    assert "ended with status 137: stopping the others" in log, log[-3000:]

    deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}"], "echo")
    _workers(deployment, "processor-1")
    finals = Tail(deployment.bootstrap, deployment.topic("events"))
    wait_until(lambda: _answered(finals, threads), timeout=240,
               message=lambda: f"every final answer after the restart; log:\n"
                               f"{deployment.log('processor-1')[-3000:]}")
    _assert_exactly_once(deployment)


def test_a_killed_supervisor_leaves_no_worker_behind(deployment: Deployment) -> None:
    supervisor = _workers(deployment, "processor")
    workers = _children(supervisor)
    wait_until(lambda: deployment.log("processor").count(" started in group") == 2, timeout=120,
               message="both workers started")
    supervisor.send_signal(signal.SIGKILL)
    wait_until(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers),
               timeout=120, message=lambda: f"the workers ended; log:\n{deployment.log('processor')[-3000:]}")
    assert deployment.log("processor").count(" stopped: ") == 2, deployment.log("processor")[-3000:]


def test_without_workers_the_command_runs_one_per_core_up_to_the_partitions_each_with_its_memory_share(
    deployment: Deployment,
) -> None:
    env = {name: value for name, value in deployment.env.items() if name != WORKERS_ENV}
    env.update(TORPOR_BLOCK_CACHE_MIB="100", TORPOR_HISTORY_CACHE_ENTRIES="1001")
    log = open(deployment.root / "processor.log", "wb")  # noqa: SIM115
    started = subprocess.Popen(deployment.processor_args("p0"), cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    deployment.processes.append(started)
    expected = default_workers(PARTITIONS)
    wait_until(lambda: deployment.log("processor").count(" started in group") == expected, timeout=120,
               message=lambda: f"{expected} processor(s) started; log:\n"
                               f"{deployment.log('processor')[-3000:]}")
    supervisor = psutil.Process(started.pid)
    if expected == 1:  # a one-core machine: this process folds, nothing is supervised
        assert supervisor.children() == [] and "processor p0 started" in deployment.log("processor")
    else:
        workers = supervisor.children()
        assert len(workers) == expected
        for worker in workers:
            inherited = worker.environ()
            assert inherited["TORPOR_BLOCK_CACHE_MIB"] == str(100 // expected)
            assert inherited["TORPOR_HISTORY_CACHE_ENTRIES"] == str(1001 // expected)
            assert inherited["TORPOR_CONSUMER_PREFETCH_MIB"] == "16"  # per consumer: not split
        assert all(f"processor p0-w{k} started" in deployment.log("processor") for k in range(expected))
    started.send_signal(signal.SIGTERM)
    assert started.wait(timeout=120) == 0, deployment.log("processor")[-3000:]


def test_the_default_is_the_usable_cores_but_no_more_than_the_partitions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for cores, partitions, expected in ((2, 6, 2), (8, 3, 3), (1, 6, 1), (200, 500, 64)):
        monkeypatch.setattr(workers_module, "usable_cores", lambda cores=cores: cores)
        assert default_workers(partitions) == expected


def test_workers_get_the_given_options_but_their_own_instance_stores_and_metrics_port(tmp_path: Path) -> None:
    script = tmp_path / "rules.toml"
    script.write_text("")
    ctx = processor.make_context("processor", [
        "--instance", "p", "--workers", "3", "--until-idle", "--script", str(script),
        "--connector", "a:A", "--connector", "b:B", "--store-dir", str(tmp_path / "s"),
        "--metrics-port", "9100",
    ])
    shared = given_options(ctx)
    assert shared == ["--until-idle", "--script", str(script), "--connector", "a:A", "--connector", "b:B"]
    commands = worker_commands(ctx, 3, "p", tmp_path / "s", 9100)
    tails = [command[command.index("processor") + 1 + len(shared):] for command in commands]
    assert tails == [["--workers", "1", "--instance", f"p-w{k}", "--store-dir", str(tmp_path / "s" / f"w{k}"),
                      "--metrics-port", str(9100 + k)] for k in range(3)]
    # 0 asks every worker for a free port of its own.
    assert all(c[-1] == "0" for c in worker_commands(ctx, 3, "p", tmp_path / "s", 0))


def test_workers_out_of_range_are_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(click.BadParameter):
        processor.make_context("processor", ["--instance", "p", "--workers", "0"])
    ctx = processor.make_context("processor", ["--instance", "p", "--workers", "3",
                                               "--metrics-port", "65534"])
    with pytest.raises(click.BadParameter, match="give a port up to 65533"):
        worker_commands(ctx, 3, "p", tmp_path, 65534)
