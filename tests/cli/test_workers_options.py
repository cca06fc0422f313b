"""`torpor processor --workers N`: what each worker's command line means once the worker
parses it, in the environment it inherits (helper-21's review of issue 18's supervisor).

No broker and no process is started: each worker's command line is parsed by the
`processor` command itself, with the supervisor's environment, exactly as the child will.
A worker must be a plain processor with the supervisor's options (never a supervisor
itself: that would start workers of workers without end), whatever the values look like.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from torpor.cli.processor import processor
from torpor.cli.workers import PER_WORKER, worker_commands


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
