"""The fault harness: real processes, a broker of its own, kills at precise points, then audit.

Contract of `run_soak(SoakConfig) -> SoakReport`:

1. It starts its OWN broker (`torpor broker start --dir <broker_dir> --port <free>`), never
   the shared one, and a unique topic prefix; an echo connector (`torpor connector
   run-echo`) and the processor (`torpor processor --instance p0 --script <rules>`).
2. It drives `threads` threads, started in waves (one wave per kill, so every kill has
   fresh work), through a two-round tool-calling conversation: round one calls `echo`
   twice, round two (sent by the harness once round one is answered) once more.
3. `kills` times it restarts p0 with `TORPOR_FAULT=<point>:<n>` (torpor.streams.faults)
   and waits for it to SIGKILL itself there; the first kills cover every point of
   `faults.POINTS` once (then points are drawn from the seed). `during_restore` is
   preceded by wiping p0's stores (a lost disk), so the restore has records to apply;
   `on_revoke` is reached by a SIGTERM once the processor has folded something.
4. Optionally: one broker restart (stop + start on the same dir and port) under a running
   processor; and one zombie: p0 SIGSTOPs itself mid-transaction (`mid_transaction:1:stop`)
   while p1 (same group) runs, p1 takes the partitions after the session timeout and
   commits; p0 stays stopped past the transaction timeout, then gets SIGCONT and must be
   fenced: either exit 2 with a `fatal:` line, or have its transaction refused by the
   broker (it aborts and rejoins as a new member; librdkafka and Kafka 4 recover a
   timed-out transactional producer by bumping its epoch, so this is what happens).
5. Like a supervisor (systemd, Kubernetes), it restarts a service that exits when it
   should be running: the echo connector throughout, the processors during the broker
   restart and the final wait (not during the kills and the zombie, whose exits are the
   point). Each restart is reported (`SoakReport.restarts`), not counted as a failure:
   exiting is what a fenced or hung processor must do; the audit judges the outcome.
6. After the run, read_committed: every input record has exactly one receipt and each
   message id exactly one decisive (not duplicate/stale) one; no outbox request id twice;
   each thread's hash head (from the changelog, and from its last receipt) equals a fresh
   re-fold of `inputs` with `step` into a `MemoryStore`; every conversation ended.

Failures of those checks are listed in `SoakReport.problems` (empty: passed); the
harness itself raises only when it cannot run (a broker that does not start).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.faults.diagnosis import describe, fate
from tests.waiting import wait_until
from torpor.connectors.echo import ECHO_SPEC
from torpor.processors.fold.state import Status
from torpor.processors.step import StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import load_state
from torpor.schemas.codec import decode_value, encode_value
from torpor.schemas.records import (
    AssistantEntry,
    Budgets,
    Capability,
    CreateThread,
    Dispatch,
    Input,
    Receipt,
    TextBlock,
    ThreadConfig,
    ThreadEvent,
    UserMessage,
)
from torpor.streams import faults
from torpor.streams.admin import ensure_topics
from torpor.streams.broker import broker_status
from torpor.streams.config import TRANSACTION_TIMEOUT_MS, KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.restore import CHECKPOINT_KEY

REPO: Final = Path(__file__).resolve().parents[2]
TORPOR: Final = str(Path(sys.executable).with_name("torpor"))
PARTITIONS: Final = 3

ROUND_ONE: Final = "round one please"
ROUND_TWO: Final = "round two please"
END_ONE: Final = "Round one done."
END_TWO: Final = "Round two done."

# First matching rule answers (last history entry). One turn per rule, so an answer does
# not depend on the scripted model's in-memory cursors, which a restart resets.
SCRIPT: Final = f"""\
[thread]
id = "unused"

[[model]]
last_contains = "echo: r1-b"
turns = [{{ text = "{END_ONE}" }}]

[[model]]
last_contains = "echo: r1-a"
turns = [{{ text = "Second call.", calls = [{{ name = "echo", arguments = {{ text = "r1-b" }} }}] }}]

[[model]]
last_contains = "echo: r2-a"
turns = [{{ text = "{END_TWO}" }}]

[[model]]
last_contains = "{ROUND_ONE}"
turns = [{{ text = "First call.", calls = [{{ name = "echo", arguments = {{ text = "r1-a" }} }}] }}]

[[model]]
last_contains = "{ROUND_TWO}"
turns = [{{ text = "Another call.", calls = [{{ name = "echo", arguments = {{ text = "r2-a" }} }}] }}]
"""

# The group session must time out for the zombie's partitions to move; the default
# (45 s) would make the zombie phase long. Heartbeats must stay well under it.
PROCESSOR_CONFIG: Final = """\
[kafka.librdkafka]
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 1000
"""

# The harness's own clients outlive the broker restart, as Torpor's do: configured like
# them (streams.config), without librdkafka's re-bootstrap, which leaves references to the
# brokers it drops (confluentinc/librdkafka#5511).
SURVIVES_RESTART: Final = {"metadata.recovery.strategy": "none"}


@dataclass(frozen=True, slots=True)
class SoakConfig:
    kills: int
    threads: int
    seed: int
    root: Path
    broker_dir: Path
    zombie: bool = True
    broker_restart: bool = True
    # How long one kill may take to be reached before the harness gives up on it.
    kill_timeout: float = 60.0
    # How long the conversations may take to end after the last fault.
    finish_timeout: float = 240.0
    # librdkafka `debug` contexts for the processors and the connector (e.g. "cgrp,eos"):
    # their logs then show what a client waits for. None: no debug output.
    librdkafka_debug: str | None = None


@dataclass(slots=True)
class SoakReport:
    seed: int
    kills: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    inputs: int = 0
    receipts: int = 0
    threads: int = 0
    dispatches: int = 0
    seconds: float = 0.0
    zombie: str = "not run"
    broker_restart: str = "not run"
    # Services that exited while they should have run, and were restarted (supervisor).
    restarts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"seed {self.seed}: {sum(self.kills.values())} kills in {self.seconds:.1f}s",
            "kills per point: " + ", ".join(f"{p}={self.kills[p]}" for p in faults.POINTS),
            f"missed (point not reached in time): {dict(self.missed) or 'none'}",
            f"threads {self.threads}, inputs {self.inputs}, receipts {self.receipts}, "
            f"dispatches {self.dispatches}",
            f"zombie: {self.zombie}",
            f"broker restart: {self.broker_restart}",
            "restarted by the supervisor: " + ("; ".join(self.restarts) or "none"),
            "result: " + ("PASS" if not self.problems else "FAIL\n  " + "\n  ".join(self.problems)),
        ]
        return "\n".join(lines)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # Not our child: once it exits it may linger as a zombie until init reaps it.
    return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _config() -> ThreadConfig:
    return ThreadConfig(
        model="scripted", system_prompt="You are a soak-test agent.", tools=(ECHO_SPEC,),
        capability=Capability(tenant="soak", tools=("echo",), scopes=("soak",), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False,
    )


def _user(thread_id: str, message_id: str, created_at: int, text: str) -> Input:
    return Input(message_id=message_id, thread_id=thread_id, created_at=created_at, source="user:soak",
                 expires_at=None, key_id=None, signature=None, body=UserMessage((TextBlock(text),)))


def _create(thread_id: str) -> Input:
    return Input(message_id=f"{thread_id}-create", thread_id=thread_id, created_at=1_000, source="user:soak",
                 expires_at=None, key_id=None, signature=None, body=CreateThread(_config(), (), ()))


def read_all(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every committed record of `topic` as (partition, offset, key, value), read_committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": 2})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(topic, p, low))
        found: list[tuple[int, int, bytes | None, bytes | None]] = []
        if not starts:
            return found
        consumer.assign(starts)
        deadline = time.monotonic() + 120
        while ends and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None:
                    found.append((message.partition() or 0, message.offset() or 0, message.key(),
                                  message.value()))
            for position in consumer.position([TopicPartition(topic, p) for p in list(ends)]):
                if position.offset >= ends[position.partition]:
                    del ends[position.partition]
        if ends:
            raise AssertionError(f"could not read {topic} to its end: {ends}")
        return found
    finally:
        consumer.close()


class Soak:
    """One soak run's broker, topics, processes and conversations."""

    def __init__(self, config: SoakConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self.rng = random.Random(config.seed)
        self.root = config.root
        self.root.mkdir(parents=True, exist_ok=True)
        self.prefix = f"soak.{config.seed}.{uuid.uuid4().hex[:8]}."
        self.app = f"app-{self.prefix}"
        self.port = free_port()
        self.bootstrap = ""
        self.report = SoakReport(config.seed, threads=config.threads)
        (self.root / "script.toml").write_text(SCRIPT)
        debug = "" if config.librdkafka_debug is None else f'"debug" = "{config.librdkafka_debug}"\n'
        (self.root / "processor.toml").write_text(PROCESSOR_CONFIG + debug)
        (self.root / "connector.toml").write_text("[kafka.librdkafka]\n" + debug)
        self.threads = [f"soak-{i:03d}-{uuid.uuid4().hex[:4]}" for i in range(config.threads)]
        self.started: list[str] = []
        self.round_two_sent: set[str] = set()
        self.answers: dict[str, list[str]] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._events: Consumer | None = None
        self._producer: Producer | None = None
        self._logs = 0
        self._restarted: subprocess.Popen[bytes] | None = None
        self._restart_logs: tuple[Path, ...] = ()
        # name: (process, its log, how to start it again); supervised while `supervising`
        # (processors) or always (the connector).
        self.services: dict[str, tuple[subprocess.Popen[bytes], Path, Callable[[], tuple[
            subprocess.Popen[bytes], Path]]]] = {}
        self.supervising = False
        self.began = time.monotonic()

    # --- processes ------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != faults.ENV}
        return {**env, "TORPOR_BOOTSTRAP": self.bootstrap, "TORPOR_TOPIC_PREFIX": self.prefix,
                "TORPOR_PARTITIONS": str(PARTITIONS)}

    def broker(self, action: str) -> str:
        args = [TORPOR, "broker", action, "--dir", str(self.config.broker_dir)]
        if action == "start":
            args += ["--port", str(self.port)]
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"torpor broker {action} failed: {done.stderr[-2000:]}")
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    def start(self, args: list[str], name: str,
              fault: str | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        self._logs += 1
        path = self.root / f"{self._logs:03d}-{name}.log"
        env = self.env if fault is None else {**self.env, faults.ENV: fault}
        with open(path, "wb") as log:
            process = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        self.logs.append((process, path))
        return process, path

    def processor(self, instance: str, fault: str | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        # One process, said here too: `python -m tests.faults.soak` runs without the
        # test session's TORPOR_PROCESSOR_WORKERS=1, and a kill must reach the one that folds.
        return self.start([TORPOR, "processor", "--instance", instance, "--app", self.app, "--workers", "1",
                           "--store-dir", str(self.root / f"stores-{instance}"),
                           "--script", str(self.root / "script.toml"),
                           "--config", str(self.root / "processor.toml")],
                          f"processor-{instance}", fault)

    def echo(self) -> tuple[subprocess.Popen[bytes], Path]:
        started = self.start([TORPOR, "connector", "run-echo", "--group", f"echo-{self.prefix}",
                              "--journal-dir", str(self.root / "echo-journal"),
                              "--config", str(self.root / "connector.toml")], "echo")
        self.services["echo"] = (*started, self.echo)
        return started

    def supervised(self, instance: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Processor `instance`, restarted by `supervise` if it exits while supervising."""
        started = self.processor(instance)
        self.services[instance] = (*started, lambda: self.supervised(instance))
        return started

    def unsupervise(self, name: str) -> None:
        """The harness stops or kills `name` on purpose from here on."""
        self.services.pop(name, None)

    def supervise(self) -> None:
        """Restart what exited while it should run, as a supervisor would, and report it."""
        for name, (process, log, start) in list(self.services.items()):
            if process.poll() is None or (name != "echo" and not self.supervising):
                continue
            last = [line for line in _text(log).splitlines() if line.strip()][-1:] or ["(no output)"]
            self.report.restarts.append(f"{name} {fate(process)} at {time.monotonic() - self.began:.0f}s "
                                        f"({last[0][:200]}); restarted")
            self.say(f"  supervisor: {self.report.restarts[-1]}")
            start()

    # --- conversations ---------------------------------------------------------------

    def send(self, *records: Input) -> None:
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random",
                                       "enable.idempotence": True, "log_level": 2, **SURVIVES_RESTART})
        for record in records:
            self._producer.produce(f"{self.prefix}inputs", key=record.thread_id.encode(),
                                   value=encode_value(record))
        if self._producer.flush(60) != 0:
            raise RuntimeError("inputs could not be delivered within 60 s")

    def start_wave(self, count: int) -> None:
        """Start `count` more threads; past the planned ones, new ones, so a kill has work."""
        while len(self.threads) < len(self.started) + count:
            self.threads.append(f"soak-{len(self.threads):03d}x-{uuid.uuid4().hex[:4]}")
        self.report.threads = len(self.threads)
        wave = self.threads[len(self.started):len(self.started) + count]
        for thread_id in wave:
            self.send(_create(thread_id), _user(thread_id, f"{thread_id}-one", 2_000, ROUND_ONE))
        self.started.extend(wave)

    def drive(self) -> int:
        """Read new committed turns; send round two where round one ended. Returns threads ended."""
        if self._events is None:
            self._events = Consumer({"bootstrap.servers": self.bootstrap,
                                     "group.id": f"drive-{uuid.uuid4().hex}",
                                     "isolation.level": "read_committed", "enable.auto.commit": False,
                                     "auto.offset.reset": "earliest", "log_level": 2, **SURVIVES_RESTART})
            self._events.subscribe([f"{self.prefix}events"])
        for message in self._events.consume(1000, timeout=0.2):
            if message.error() is not None:
                continue
            event = decode_value(message.value() or b"", ThreadEvent)
            if event.kind == "turn_committed" and event.entry is not None and isinstance(event.entry.body,
                                                                                           AssistantEntry):
                text = " ".join(b.text for b in event.entry.body.content if isinstance(b, TextBlock))
                self.answers.setdefault(event.thread_id, []).append(text)
        for thread_id in self.started:
            if END_ONE in self.answers.get(thread_id, ()) and thread_id not in self.round_two_sent:
                self.send(_user(thread_id, f"{thread_id}-two", 3_000, ROUND_TWO))
                self.round_two_sent.add(thread_id)
        return sum(1 for t in self.threads if END_TWO in self.answers.get(t, ()))

    def wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Drive the conversations until `condition()` or `timeout`; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drive()
            self.supervise()
            if condition():
                return True
        return False

    # --- phases -----------------------------------------------------------------------

    def schedule(self) -> list[str]:
        points = list(faults.POINTS)
        self.rng.shuffle(points)
        # The first cycle has no changelog to restore and no store yet.
        while points[0] == "during_restore":
            self.rng.shuffle(points)
        while len(points) < self.config.kills:
            points.append(self.rng.choice(faults.POINTS))
        return points[:self.config.kills]

    def kill_at(self, point: str, wave: int) -> None:
        nth = 1 if point in ("during_restore", "on_revoke") else self.rng.randint(1, 3)
        if point == "during_restore":
            shutil.rmtree(self.root / "stores-p0", ignore_errors=True)  # a lost disk: rebuild
        self.start_wave(wave)
        process, log = self.processor("p0", f"{point}:{nth}")
        if point == "on_revoke":
            # A revoke happens at a clean stop: SIGTERM once it folds (a receipt is out).
            self.wait(lambda: "partition restored" in _text(log) or process.poll() is not None,
                      self.config.kill_timeout)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        reached = self.wait(lambda: process.poll() is not None, self.config.kill_timeout)
        text = log.read_text(errors="replace")
        if reached and process.returncode == -signal.SIGKILL and f"fault: SIGKILL at {point}" in text:
            self.report.kills[point] += 1
            return
        if not reached:
            process.kill()
            process.wait(30)
            self.report.missed[point] += 1
            self.say(f"  {point}:{nth} not reached in {self.config.kill_timeout:.0f}s (killed from outside)")
            return
        self.report.problems.append(f"p0 with fault {point}:{nth} exited {process.returncode} "
                                    f"without the fault; log {log}: {text[-1500:]}")

    def restart_broker(self, processor: subprocess.Popen[bytes], processor_log: Path) -> None:
        """Stop the broker and start it again on the same data dir and port, its data kept.

        `torpor broker start` formats a fresh log at every start (streams/broker.py), which
        would lose every topic, so the broker's own command line is run again instead.
        """
        before = self.drive()
        state = broker_status(self.config.broker_dir)
        if state is None:
            raise RuntimeError(f"no broker runs from {self.config.broker_dir}")
        argv = Path(f"/proc/{state.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(state.pid, signal.SIGTERM)
        wait_until(lambda: not _running(state.pid), timeout=60, message="the broker stops")
        with open(self.config.broker_dir / "restarted.log", "ab") as log:
            self._restarted = subprocess.Popen([a.decode() for a in argv], cwd=self.config.broker_dir,
                                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
        wait_until(lambda: f"{self.prefix}inputs" in admin.list_topics(timeout=5).topics, timeout=90,
                   message=f"the restarted broker answers on port {self.port} with the topics kept")
        fate = "kept running" if processor.poll() is None else f"exited {processor.returncode}"
        self.report.broker_restart = (f"stopped (SIGTERM) and restarted on port {self.port}, data kept; "
                                      f"the processor {fate}"
                                      f"; {before} threads had ended before it")
        self._restart_logs = (processor_log, self.services["echo"][1])

    def broker_watch_lines(self) -> str:
        """What the processor and the connector said about the broker restart (streams.kafkalog)."""
        said = []
        for path in self._restart_logs:
            lines = [line.split(": ", 1)[-1] for line in _text(path).splitlines()
                     if "torpor.kafka.broker" in line]
            said.append(f"{path.name}: {' / '.join(lines) or 'nothing'}")
        return "; ".join(said)

    def stop_broker(self) -> None:
        if self._restarted is not None:
            self._restarted.terminate()
            try:
                self._restarted.wait(60)
            except subprocess.TimeoutExpired:
                self._restarted.kill()
        else:
            self.broker("stop")

    def zombie(self) -> None:
        p1, log1 = self.processor("p1")
        # p1 serves on after this phase: supervised from then on, like any processor.
        self.services["p1"] = (p1, log1, lambda: self.supervised("p1"))
        self.wait(lambda: "partition restored" in _text(log1), 60)
        zombie, log0 = self.processor("p0", "mid_transaction:1:stop")
        self.wait(lambda: "partition restored" in _text(log0) or zombie.poll() is not None, 60)
        # Work for the partitions p0 took back, so it opens a transaction there.
        owned = {int(m) for m in re.findall(r"partition restored .* partition=(\d+)", _text(log0))}
        extra = [self._thread_on(p) for p in sorted(owned) for _ in range(2)]
        self.threads.extend(extra)
        self.report.threads = len(self.threads)
        self.start_wave(len(self.threads) - len(self.started))
        stopped = self.wait(lambda: "fault: SIGSTOP at mid_transaction" in _text(log0), 90)
        if not stopped:
            self.report.zombie = "p0 never reached mid_transaction (no work assigned to it)"
            self.report.problems.append(self.report.zombie)
            zombie.kill()
            return
        paused = time.monotonic()
        restored = _text(log1).count("partition restored")
        took = self.wait(lambda: _text(log1).count("partition restored") > restored, 90)
        progressed_from = self.drive()
        # p1 must have committed something of the taken partitions before p0 resumes.
        committed = self.wait(lambda: self.drive() > progressed_from or self.finished(), 90)
        # Past the transaction timeout the broker aborts the zombie's open transaction and
        # bumps its producer epoch: what fences it, beyond its group membership expiring.
        self.wait(lambda: time.monotonic() - paused > TRANSACTION_TIMEOUT_MS / 1000 + 5, 60)
        zombie.send_signal(signal.SIGCONT)

        def after_stop() -> str:
            return _text(log0).split("fault: SIGSTOP at mid_transaction", 1)[1]

        settled = self.wait(lambda: zombie.poll() is not None or "aborting checkpoint" in after_stop(), 60)
        fatal = [line for line in after_stop().splitlines() if line.startswith("fatal:")]
        aborted = [line for line in after_stop().splitlines() if "aborting checkpoint" in line]
        # Two outcomes fence the zombie: its producer is fenced (exit 2), or the broker
        # refuses its transaction (expired membership, an aborted transaction) and it aborts,
        # drops its overlay and rejoins the group as a new member. The audit then shows
        # whether anything it had folded leaked.
        if zombie.poll() == 2 and fatal:
            outcome = f"exited 2: {fatal[0][:160]}"
        elif aborted:
            outcome = f"kept running, its transaction refused: {aborted[0].split('WARNING ', 1)[-1][:200]}"
        else:
            outcome = f"neither fenced nor refused (exit {zombie.poll()})"
        self.report.zombie = (f"paused {time.monotonic() - paused:.0f}s; p1 took the partitions: {took}, "
                              f"committed meanwhile: {committed}; after SIGCONT p0 {outcome}")
        if not (took and committed and settled and (fatal or aborted)):
            self.report.problems.append(f"zombie not fenced: {self.report.zombie}; log {log0}")
        if zombie.poll() is None:
            zombie.kill()

    def _thread_on(self, partition: int) -> str:
        while True:
            thread_id = f"soak-z{partition}-{uuid.uuid4().hex[:6]}"
            if partition_for(thread_id.encode(), PARTITIONS) == partition:
                return thread_id

    def finished(self) -> bool:
        return all(END_TWO in self.answers.get(t, ()) for t in self.threads)

    def kill_processes(self) -> None:
        """Kill every process still running and close the events reader (the end of a run)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(30)
        if self._events is not None:
            self._events.close()

    def diagnosis(self) -> str:
        """Where the conversations stand and what each process last said (`tests.faults.diagnosis`)."""
        unfinished = {t: self.answers.get(t, []) for t in self.threads
                      if END_TWO not in self.answers.get(t, ())}
        shown = dict(list(unfinished.items())[:8])
        # The connector and the processors still running, or the last to exit: who stalled.
        runs = [(p, path) for p, path in self.logs if "echo" in path.name or p.poll() is None]
        runs += [run for run in self.logs[-2:] if run not in runs]
        return (f"{len(unfinished)} conversations unfinished, answers so far: {shown}\n"
                f"processes:\n{describe(sorted(runs, key=lambda run: run[1].name))}")

    # --- the audit --------------------------------------------------------------------

    def audit(self) -> None:
        problems = self.report.problems
        inputs_raw = read_all(self.bootstrap, f"{self.prefix}inputs")
        inputs = [(p, o, decode_value(v or b"", Input)) for p, o, _, v in inputs_raw]
        receipts = [decode_value(v or b"", Receipt) for _, _, _, v in read_all(self.bootstrap,
                                                                                f"{self.prefix}receipts")]
        dispatches = [decode_value(v or b"", Dispatch) for _, _, _, v in read_all(self.bootstrap,
                                                                                   f"{self.prefix}outbox")]
        self.report.inputs, self.report.receipts = len(inputs), len(receipts)
        self.report.dispatches = len(dispatches)
        copies = Counter(i.message_id for _, _, i in inputs)
        per_input = Counter(r.input_id for r in receipts)
        if per_input != copies:
            diff = {m: (copies.get(m, 0), per_input.get(m, 0)) for m in set(copies) | set(per_input)
                    if copies.get(m, 0) != per_input.get(m, 0)}
            problems.append(f"inputs (copies, receipts) differ: {dict(list(diff.items())[:10])}")
        decisive = Counter(r.input_id for r in receipts if r.disposition not in ("duplicate", "stale"))
        twice = {m: n for m, n in decisive.items() if n != 1}
        lost = set(copies) - set(decisive)
        if twice or lost:
            problems.append(f"folded more than once: {twice}; never folded: {sorted(lost)[:10]}")
        request_ids = Counter(d.request_id for d in dispatches)
        doubled = {r: n for r, n in request_ids.items() if n > 1}
        if doubled:
            problems.append(f"dispatched twice: {doubled}")
        # A fresh re-fold of the inputs, partition by partition in offset order.
        refold: dict[int, MemoryStore] = {}
        for partition in sorted({p for p, _, _ in inputs}):
            store = refold[partition] = MemoryStore()
            ordered = sorted((o, i) for p, o, i in inputs if p == partition)  # offsets are unique
            step(store, [StepRecord(i, partition, o) for o, i in ordered])
        # The live table, as the changelog holds it (what every restore rebuilds).
        live = MemoryStore()
        for _, _, key, value in read_all(self.bootstrap, f"{self.prefix}changelog"):
            if key is not None and key != CHECKPOINT_KEY:
                live.apply(((key, value),))
        last_receipt: dict[str, str] = {}
        for receipt in receipts:
            if receipt.disposition not in ("duplicate", "stale"):
                last_receipt[receipt.thread_id] = receipt.history_after
        for thread_id in self.threads:
            states = [load_state(store, thread_id) for store in refold.values()]
            fresh = next((s for s in states if s is not None), None)
            current = load_state(live, thread_id)
            if fresh is None or current is None:
                problems.append(f"{thread_id}: missing (re-fold {fresh}, live {current})")
                continue
            if fresh.head != current.head or fresh.history_len != current.history_len:
                problems.append(f"{thread_id}: live head {current.head[:12]}/{current.history_len} != "
                                f"re-fold {fresh.head[:12]}/{fresh.history_len}")
            if last_receipt.get(thread_id) != fresh.head:
                problems.append(f"{thread_id}: last receipt head {str(last_receipt.get(thread_id))[:12]} != "
                                f"re-fold {fresh.head[:12]}")
            if fresh.status is not Status.IDLE or END_TWO not in self.answers.get(thread_id, ()):
                problems.append(f"{thread_id}: did not reach its end (status {fresh.status}, "
                                f"answers {self.answers.get(thread_id)})")


def run_soak(config: SoakConfig, say: Callable[[str], None] = print) -> SoakReport:
    """Run one soak (module docstring) and return its report; always stops what it started."""
    soak = Soak(config, say)
    began = time.monotonic()
    try:
        soak.bootstrap = soak.broker("start")
        say(f"broker {soak.bootstrap} in {config.broker_dir}, topic prefix {soak.prefix}, seed {config.seed}")
        settings = Settings(kafka=KafkaSettings(bootstrap_servers=soak.bootstrap),
                            topics=TopicSettings(prefix=soak.prefix, partitions=PARTITIONS))
        admin = AdminClient({"bootstrap.servers": soak.bootstrap, "log_level": 2})
        ensure_topics(admin, settings, Deadline.after(60))
        soak.echo()
        waves = max(1, len(soak.threads) // (config.kills + 2))
        for index, point in enumerate(soak.schedule()):
            # Once the planned threads are all started, each kill still gets a fresh one.
            wave = waves if len(soak.started) < len(soak.threads) else 1
            say(f"kill {index + 1}/{config.kills}: {point}")
            soak.kill_at(point, wave)
        soak.supervised("p0")
        if config.broker_restart:
            soak.supervising = True
            soak.start_wave(waves)
            # Under a processor that folds, not one still starting (its imports take
            # seconds on a loaded machine): restored, and a few seconds of work.
            log = soak.services["p0"][1]
            if not soak.wait(lambda: "partition restored" in _text(log), config.kill_timeout):
                soak.report.problems.append(f"p0 did not restore its partitions before the broker restart; "
                                            f"log {log}")
            soak.wait(lambda: False, 3.0)
            say("broker restart")
            soak.restart_broker(soak.services["p0"][0], soak.services["p0"][1])
            soak.supervise()
            # Some work after the restart, and the time for a processor that exits on it to
            # be seen and restarted, before the zombie phase takes the processors over.
            soak.start_wave(1)
            soak.wait(lambda: False, 15.0)
            soak.supervising = False
            soak.report.broker_restart += f"; said: {soak.broker_watch_lines()}"
        if config.zombie:
            say("zombie")
            processor = soak.services["p0"][0]
            soak.unsupervise("p0")
            processor.send_signal(signal.SIGTERM)
            processor.wait(60)
            soak.zombie()
        soak.start_wave(len(soak.threads) - len(soak.started))
        running = [p for p in soak.processes if p.poll() is None and p is not soak.services["echo"][0]]
        if not running:
            soak.supervised("p0")
        soak.supervising = True
        if not soak.wait(soak.finished, config.finish_timeout):
            ended = soak.drive()
            soak.report.problems.append(f"only {ended} of {len(soak.threads)} conversations ended "
                                        f"within {config.finish_timeout:.0f}s; {soak.diagnosis()}")
        soak.supervising = False
        soak.services.clear()  # stopping on purpose from here
        for process in soak.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in soak.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        soak.audit()
    except BaseException:
        # Interrupted (pytest-timeout, ^C) or the harness failed: say what the processes
        # were doing before the cleanup below kills them.
        say(f"soak interrupted after {time.monotonic() - began:.0f}s; {soak.diagnosis()}")
        raise
    finally:
        soak.kill_processes()
        soak.report.seconds = time.monotonic() - began
        if soak.bootstrap:
            try:
                soak.stop_broker()
            except RuntimeError as error:
                say(f"broker stop: {error}")
    return soak.report
