"""`torpor processor --workers N`: N processor processes of one app, supervised by this one.

A Python process folds on one core (the GIL), so a machine's cores are used by more
processes, each one an ordinary instance of the same consumer group: the partitions are
spread over them, each has its own transactional id and static member id
(`<instance>-w<k>`) and its own stores (`<store-dir>/w<k>`), exactly what N separate
`torpor processor` commands would have. Nothing new is shared between them, so
exactly-once and restore are the single instance's.

Without `--workers` the command runs one worker per usable core, but no more workers
than `inputs` has partitions (a worker without a partition only waits). The `[memory]`
budgets are the whole command's: each worker is given its `MemorySettings.share`, so two
workers hold the caches one process would.

The supervisor is small on purpose: it starts the N children with the command line it
was given (but `--workers`, `--instance`, `--store-dir` and `--metrics-port`, which differ
per child: each is told `--workers 1`, over a TORPOR_PROCESSOR_WORKERS it inherits),
passes SIGTERM/SIGINT on, and when one child ends with a non-zero status it stops the
others and ends with that status: restarting is the job of whatever runs
the command (systemd, Kubernetes), which then restarts all N with their same names.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import click
from click.core import ParameterSource

from torpor.cli.logs import announce

# Options each worker gets its own value of: never copied from the supervisor's command line.
PER_WORKER: Final = frozenset({"workers", "instance", "store_dir", "metrics_port"})
MAX_WORKERS: Final = 64
WORKERS_ENV: Final = "TORPOR_PROCESSOR_WORKERS"  # `--workers` from the environment
# How long the children have to stop cleanly after a SIGTERM before they are killed.
STOP_SECONDS: Final = 60.0
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h


def default_workers(partitions: int) -> int:
    """Without `--workers`: the cores this process may run on, at most one per partition."""
    return max(1, min(usable_cores(), partitions, MAX_WORKERS))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as a container or taskset sets it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_name(instance: str, index: int) -> str:
    """The k-th worker's instance name: its transactional id and static member id derive from it."""
    return f"{instance}-w{index}"


def given_options(ctx: click.Context) -> list[str]:
    """The command line options the user gave (not defaults, not the environment's), but PER_WORKER."""
    args: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if (not isinstance(param, click.Option) or name is None or name in PER_WORKER
                or ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE):
            continue
        value = ctx.params[name]
        flag = param.opts[0]
        if param.is_flag:
            if param.secondary_opts and not value:
                args.append(param.secondary_opts[0])
            elif value:
                args.append(flag)
        elif param.multiple:
            for item in value:
                args += [flag, str(item)]
        elif value is not None:
            args += [flag, str(value)]
    return args


def worker_commands(ctx: click.Context, workers: int, instance: str, store_dir: Path,
                    metrics_port: int | None) -> list[list[str]]:
    """The N children's command lines: the same options, each its own instance, stores and port."""
    if metrics_port and metrics_port + workers - 1 > 65535:
        raise click.BadParameter(f"with --workers {workers} the last worker's port would be "
                                 f"{metrics_port + workers - 1}: give a port up to {65536 - workers}",
                                 param_hint="--metrics-port")
    shared = given_options(ctx)
    commands = []
    for index in range(workers):
        # `--workers 1` said, not left out: a worker inherits the environment, and
        # TORPOR_PROCESSOR_WORKERS there would make it a supervisor of workers of its own.
        own = ["--workers", "1", "--instance", worker_name(instance, index),
               "--store-dir", str(store_dir / f"w{index}")]
        if metrics_port is not None:
            # 0 asks each child for a free port (each prints its own); else consecutive ports.
            own += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
        commands.append([sys.executable, "-m", "torpor", "processor", *shared, *own])
    return commands


def supervise(commands: Sequence[Sequence[str]], env: Mapping[str, str]) -> int:
    """Run the children until all end; the first non-zero status stops the others and is returned.

    `env`: variables each child gets on top of this process's environment (its memory share).
    """
    environment = {**os.environ, **env}
    # Held until the end: a Popen collected while its child runs may reap it behind os.wait.
    children = [subprocess.Popen(command, env=environment, preexec_fn=end_with_parent)
                for command in commands]
    running = {child.pid for child in children}

    def stop(number: int, frame: object) -> None:
        # os.kill, not Popen.send_signal: that one may reap the child, and os.wait below must.
        for pid in list(running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    status = 0
    while running:
        pid, raw = os.wait()  # a signal runs `stop`, then the wait goes on (PEP 475)
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(raw)
        if code != 0 and not status:
            status = code if code > 0 else 128 - code  # killed by signal n: 128 + n, as a shell says
            announce(f"processor worker {pid} ended with status {status}: stopping the others",
                     logging.ERROR)
            stop(signal.SIGTERM, None)
            _kill_after(STOP_SECONDS, running)
    return status


def end_with_parent() -> None:
    """In the child before exec (`preexec_fn`): SIGTERM it when its parent dies, even by SIGKILL (Linux).

    Without it a killed supervisor (or demo) leaves its workers running unsupervised,
    holding their partitions, and the restarted supervisor's workers wait for them.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _kill_after(seconds: float, running: set[int]) -> None:
    """SIGKILL whichever pid of `running` a SIGTERM did not end within `seconds` (a hung client)."""
    def kill() -> None:
        for pid in list(running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(seconds, kill)
    timer.daemon = True
    timer.start()
