"""`torpor processor --workers N`: what each worker's command line means once the worker
parses it, in the environment it inherits (helper-21's review of issue 18's supervisor);
how many workers the command chooses, what it refuses before touching the broker, and
how the supervisor takes a stop (helper-34's review of the default).

No broker and no process is started: each worker's command line is parsed by the
`processor` command itself, with the supervisor's environment, exactly as the child will.
A worker must be a plain processor with the supervisor's options (never a supervisor
itself: that would start workers of workers without end), whatever the values look like.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import click
import psutil
import pytest
from click.testing import CliRunner

from tests.waiting import wait_until
from torpor.cli import main, workers
from torpor.cli.processor import processor
from torpor.cli.workers import (
    PER_WORKER,
    cgroup_cpu_quota,
    chosen_workers,
    layout_warning,
    supervise,
    worker_commands,
)
from torpor.processors.replay import open_stores
from torpor.processors.store.kv import RocksStore
from torpor.schemas.errors import ConfigError


def _parsed(command: list[str], env: dict[str, str]) -> dict[str, object]:
    """The parameters `command` (a worker's argv) gives the `processor` command under `env`."""
    args = command[command.index("processor") + 1:]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        ctx = processor.make_context("processor", list(args))
    return dict(ctx.params)


def _supervisor(args: list[str], env: dict[str, str]) -> click.Context:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        return processor.make_context("processor", args)


def test_a_worker_is_never_a_supervisor_when_the_workers_come_from_the_environment(tmp_path: Path) -> None:
    """TORPOR_PROCESSOR_WORKERS=3 starts a supervisor of three workers. The workers inherit
    that environment: unless their command line says otherwise, each reads the variable,
    becomes a supervisor of three more, and so on without end (a fork bomb)."""
    env = {"TORPOR_PROCESSOR_WORKERS": "3"}
    ctx = _supervisor(["--instance", "p"], env)
    assert ctx.params["workers"] == 3
    for command in worker_commands(ctx, 3, "p", tmp_path / "s", None):
        assert _parsed(command, env)["workers"] == 1, command


def test_each_worker_parses_back_the_supervisor_s_options_whatever_their_values(tmp_path: Path) -> None:
    script = tmp_path / "rules.toml"
    script.write_text("")
    given = ["--instance", "p", "--workers", "2", "--until-idle", "--script", str(script),
             "--app", "--until-idle", "--default-model", "-x", "--openai-base-url", "",
             "--connector", "--instance=evil", "--connector", "b:B", "--bootstrap", "h:1,h:2",
             "--log-level", "debug", "--metrics-host", "0.0.0.0"]
    ctx = _supervisor(given, {})
    assert ctx.params["app"] == "--until-idle" and ctx.params["default_model"] == "-x"
    for index, command in enumerate(worker_commands(ctx, 2, "p", tmp_path / "s", None)):
        params = _parsed(command, {})
        assert params["instance"] == f"p-w{index}" and params["store_dir"] == tmp_path / "s" / f"w{index}"
        assert params["workers"] == 1
        same = {name: value for name, value in ctx.params.items() if name not in PER_WORKER}
        assert {name: params[name] for name in same} == same


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cgroup_quota_is_the_smallest_limit_on_the_way_up(tmp_path: Path) -> None:
    proc, root = tmp_path / "cgroup", tmp_path / "fs"
    proc.write_text("0::/a/b\n")
    assert cgroup_cpu_quota(proc, root) is None  # no cpu.max anywhere: unlimited
    _tree(root, {"a/cpu.max": "150000 100000\n", "a/b/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(proc, root) == 1.5
    _tree(root, {"a/b/cpu.max": "50000 100000\n"})
    assert cgroup_cpu_quota(proc, root) == 0.5
    # cgroup v1, as a container sees its own: -1 is unlimited.
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/\n")
    _tree(root, {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(proc, root) is None
    _tree(root, {"cpu,cpuacct/cpu.cfs_quota_us": "250000\n"})
    assert cgroup_cpu_quota(proc, root) == 2.5
    assert cgroup_cpu_quota(tmp_path / "absent", root) is None
    # What the kernel does not write is no limit, never an error at start.
    for garbled in ("abc 100000\n", "100000 0\n", "100000\n", "\n"):
        proc.write_text("0::/\n")
        _tree(root, {"cpu.max": garbled})
        assert cgroup_cpu_quota(proc, root) is None, garbled


def test_the_usable_cores_are_the_affinity_within_the_quota_rounded_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    affinity = len(os.sched_getaffinity(0))
    for quota, expected in ((None, affinity), (0.5, 1), (1.5, min(affinity, 2)), (1000.0, affinity)):
        monkeypatch.setattr(workers, "cgroup_cpu_quota", lambda quota=quota: quota)
        assert workers.usable_cores() == expected


def test_one_process_is_the_default_when_it_hosts_connectors_or_exits_once_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    assert chosen_workers(None, partitions=6, hosting=False, until_idle=False) == 4
    assert chosen_workers(None, partitions=3, hosting=False, until_idle=False) == 3
    assert chosen_workers(None, partitions=6, hosting=True, until_idle=False) == 1
    assert chosen_workers(None, partitions=6, hosting=False, until_idle=True) == 1
    assert chosen_workers(2, partitions=6, hosting=False, until_idle=True) == 2  # said: kept


def test_stores_of_the_other_layout_are_named_with_what_to_do(tmp_path: Path) -> None:
    assert layout_warning(tmp_path / "absent", 2) is None
    (tmp_path / "partition-0").mkdir()
    assert layout_warning(tmp_path, 1) is None
    said = layout_warning(tmp_path, 2)
    assert said is not None and "one processor process (partition-N)" in said and "--workers 1" in said
    (tmp_path / "partition-0").rmdir()
    for name in ("w0", "w1", "w2", "w3"):
        (tmp_path / name).mkdir()
    assert layout_warning(tmp_path, 4) is None
    said = layout_warning(tmp_path, 2)
    assert said is not None and "(w2, w3)" in said and "--workers 4" in said
    said = layout_warning(tmp_path, 1)
    assert said is not None and "(w0, w1, w2, w3)" in said and "process restores" in said


@pytest.mark.parametrize(("args", "says"), [
    (["--workers", "2", "--connector", "torpor.connectors.echo:EchoTool"],
     "a hosted --connector runs in one process"),
    (["--workers", "3", "--metrics-port", "65534"], "give a port up to 65533"),
])
def test_workers_that_cannot_run_are_refused_before_any_topic_is_touched(
        tmp_path: Path, args: list[str], says: str) -> None:
    # Nothing listens at the bootstrap: a command that reached for the broker would wait
    # there a minute and say so, not this.
    result = CliRunner().invoke(main, ["processor", "--instance", "p0", "--store-dir", str(tmp_path),
                                       "--bootstrap", "127.0.0.1:9", *args])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())


def test_a_stop_asked_for_before_the_workers_start_starts_none() -> None:
    # `false` ends with 1: a child started would make the status 1.
    assert supervise([["false"], ["false"]], {}, [signal.SIGTERM]) == 0


def test_workers_ended_by_the_stop_itself_stopped_cleanly() -> None:
    """A worker still starting has no handler yet: the SIGTERM passed on ends it with the
    signal's own status, which is what a stop asked for, not a failure (exit 0)."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    me = psutil.Process()

    def stop_when_both_run() -> None:
        wait_until(lambda: len([c for c in me.children() if c.name() == "sleep"]) == 2, 60, "two workers")
        os.kill(os.getpid(), signal.SIGTERM)  # to the supervisor: it passes it on

    stopper = threading.Thread(target=stop_when_both_run, daemon=True)
    stopper.start()
    try:
        assert supervise([["sleep", "600"], ["sleep", "600"]], {}, []) == 0
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    stopper.join(timeout=60)


def test_reading_the_stores_of_workers_names_each_worker_s_directory(tmp_path: Path) -> None:
    RocksStore(tmp_path / "w1" / "partition-0").close()
    with pytest.raises(ConfigError, match=r"processor's workers' \(w1\): give one of them, e\.g\. .*w1"):
        open_stores(tmp_path)
    with pytest.raises(ConfigError, match="no partition-N stores under"):
        open_stores(tmp_path / "w0")
    stores = open_stores(tmp_path / "w1")
    assert list(stores) == [0]
    for store in stores.values():
        store.close()
