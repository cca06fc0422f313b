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
import math
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
from torpor.processors.storedirs import partition_dirs, worker_dir, worker_dirs

# Options each worker gets its own value of: never copied from the supervisor's command line.
PER_WORKER: Final = frozenset({"workers", "instance", "store_dir", "metrics_port"})
MAX_WORKERS: Final = 64
WORKERS_ENV: Final = "TORPOR_PROCESSOR_WORKERS"  # `--workers` from the environment
# How long the children have to stop cleanly after a SIGTERM before they are killed.
STOP_SECONDS: Final = 60.0
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h


def chosen_workers(given: int | None, *, partitions: int, hosting: bool, until_idle: bool) -> int:
    """The workers to run: `given` (`--workers`), else `default_workers`, but one process when
    it hosts connectors (each worker would run every tool call: its connector is a group
    of its own) or exits once idle (a worker idle first would leave the loopbacks sent to
    its partitions unread)."""
    if given is not None:
        return given
    return 1 if hosting or until_idle else default_workers(partitions)


def default_workers(partitions: int) -> int:
    """Without `--workers`: the cores this process may use, at most one per partition."""
    return max(1, min(usable_cores(), partitions, MAX_WORKERS))


def usable_cores() -> int:
    """The cores this process may use: its affinity mask (taskset, cpusets), but no more than
    its cgroup's CPU quota rounded up (Docker's `--cpus`, a Kubernetes CPU limit), which
    the affinity mask does not show."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_cpu_quota(proc: Path = Path("/proc/self/cgroup"),
                     root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time this process's cgroup and its parents allow (the smallest), None if
    unlimited or unknown. cgroup v2: `cpu.max` ("QUOTA PERIOD" or "max PERIOD") from the
    process's own cgroup up to the root; v1: `cpu.cfs_quota_us` over `cpu.cfs_period_us`
    where the cpu controller is mounted (-1: unlimited)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2: one hierarchy, limits set at any level
            here = root / path.lstrip("/")
            while True:
                quota, _, period = _read(here / "cpu.max").partition(" ")
                share = _cpus(quota, period)
                if share is not None:
                    quotas.append(share)
                if here == root or root not in here.parents:
                    break
                here = here.parent
        elif "cpu" in controllers.split(","):  # v1: the controller's mount, as a container sees it
            for mount in (root / "cpu", root / controllers):
                share = _cpus(_read(mount / "cpu.cfs_quota_us"), _read(mount / "cpu.cfs_period_us"))
                if share is not None:
                    quotas.append(share)
                    break
    return min(quotas) if quotas else None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return ""


def _cpus(quota: str, period: str) -> float | None:
    """`quota` over `period` (microseconds), None for "max", -1 or anything unreadable: a
    file the kernel did not write as documented must not stop a processor from starting."""
    try:
        share = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return share if share > 0 else None


def layout_warning(store_dir: Path, workers: int) -> str | None:
    """What to say when `store_dir` holds stores this run will not use: those of one process
    (`partition-N`) under workers, or of workers (`w<k>/`) under one process or beyond this
    run's workers. A partition's owner restores its store from the changelog wherever it
    lives, so nothing is lost; the old stores only take disk space (and mislead a reader)."""
    single = bool(partition_dirs(store_dir))
    split = worker_dirs(store_dir)
    unused = [path.name for index, path in split.items() if workers == 1 or index >= workers]
    if workers > 1 and single:
        return (f"{store_dir} holds the stores of one processor process (partition-N), which "
                f"the {workers} workers do not use: they restore theirs from the changelog into "
                f"{store_dir}/w<k>. Remove the old ones once the workers run, or run --workers 1.")
    if unused:
        return (f"{store_dir} holds the stores of workers ({', '.join(unused)}) this run does not "
                f"use: its {'process restores' if workers == 1 else 'workers restore'} from the "
                f"changelog. Remove them once it runs, or run --workers {len(split)}.")
    return None


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
               "--store-dir", str(worker_dir(store_dir, index))]
        if metrics_port is not None:
            # 0 asks each child for a free port (each prints its own); else consecutive ports.
            own += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
        commands.append([sys.executable, "-m", "torpor", "processor", *shared, *own])
    return commands


def supervise(commands: Sequence[Sequence[str]], env: Mapping[str, str], stopping: list[int]) -> int:
    """Run the children until all end; the first non-zero status stops the others and is returned.

    `env`: variables each child gets on top of this process's environment (its memory share).
    `stopping`: the SIGTERM/SIGINT this process got so far (a stop asked for during its own
    startup: then no child starts), and those it gets while supervising. Once asked to stop,
    a child ended by that signal itself (one still starting, before its handler) stopped
    cleanly: the command exits 0, as one processor would.
    """
    environment = {**os.environ, **env}
    # Held until the end: a Popen collected while its child runs may reap it behind os.wait.
    children: list[subprocess.Popen[bytes]] = []
    running: set[int] = set()

    def stop(number: int, frame: object) -> None:
        stopping.append(number)
        # os.kill, not Popen.send_signal: that one may reap the child, and os.wait below must.
        for pid in list(running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)

    for signum in (signal.SIGTERM, signal.SIGINT):  # before any child starts: no stop is lost
        signal.signal(signum, stop)
    for command in commands:
        if stopping:
            break
        children.append(subprocess.Popen(command, env=environment, preexec_fn=end_with_parent))
        running.add(children[-1].pid)
    if stopping and running:  # a stop that came while a child was being started reaches it too
        stop(stopping[0], None)
    status = 0
    while running:
        pid, raw = os.wait()  # a signal runs `stop`, then the wait goes on (PEP 475)
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(raw)
        if stopping and -code in (signal.SIGTERM, signal.SIGINT):
            code = 0
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
