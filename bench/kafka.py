"""`python -m bench.kafka`: the issue-7 workload through the real broker, then the raw limit.

Contract. With a topic prefix of its own (`bench.<random>.`), starts one
`torpor processor` (exactly-once, the scripted model driven by a script this module
writes: twelve 94-character chunks, a `run_command` call unless the last entry is a
tool result, usage zero) and one `torpor connector run bench.workload:BenchTool`. A
producer sends the agents' inputs in waves; each turn waits until every input of the
wave has its receipt (read_committed). After each wave it samples the processor's RSS
(psutil on its pid and its workers; the processor collects its own garbage, this cannot
force it), what its bounded caches hold (scraped from each worker's `/metrics`,
`torpor_cache_bytes`: the processor runs with `--metrics-port 0`, each worker on a free
port it logs, and `/metrics` on, as a deployment would)
and the store directory. Then it reads every topic, counts the completions (exit 1 if they
are not agents * turns * 2), sizes the processor's output records, and runs
`bench.passthrough` on a copy of the inputs with outputs of the same counts and sizes,
reporting Torpor's completions/s as a ratio of the pass-through's. Writes `kafka.csv`,
`kafka-summary.csv` and `kafka-rss.png` into `--out`. `--bootstrap` defaults to
`.torpor/BOOTSTRAP`; without either it starts `torpor broker start --dir
.torpor/bench-broker`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Final

import psutil
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from bench import figures, passthrough
from bench.measure import cpu_seconds, dir_bytes, rss_bytes, scraped_cache_bytes
from bench.topics import create_topics, delete_topics, produce_queued, read_topic
from bench.workload import (
    ARGUMENTS,
    CHUNKS,
    SUMMARY_LINE,
    TOOL,
    agent_id,
    create_input,
    turn_input,
)
from torpor.cli.workers import WORKERS_ENV, chosen_workers
from torpor.processors.processor import ProcessorConfig
from torpor.schemas import signing
from torpor.schemas.codec import decode_value, encode_value
from torpor.schemas.records import Completion, Input, Receipt
from torpor.schemas.signer import load_private_key
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import make_admin
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.restore import CHECKPOINT_KEY
from torpor.streams.topics import Topic, TopicNames

REPO: Final = Path(__file__).resolve().parents[1]
TORPOR: Final = str(Path(sys.executable).with_name("torpor"))
OUTPUT_TOPICS: Final = (Topic.OUTBOX, Topic.EVENTS, Topic.RECEIPTS, Topic.CHANGELOG, Topic.PARKED)
SUMMARY_COLUMNS: Final = (
    *figures.RUN_COLUMNS,
    "partitions",
    "workers",
    *figures.MEASURED_COLUMNS,
    "processor_cpu_seconds",
    "changelog_bytes_per_agent",
    "checkpoint_records",
    "passthrough_seconds",
    "passthrough_completions_per_s",
    "passthrough_cpu_us_per_completion",
    "ratio_to_passthrough",
)
TURN_TIMEOUT_S: Final = 600.0
SETTLE_TIMEOUT_S: Final = 60.0


def metrics_pages(workers: int, processor: subprocess.Popen[bytes], log: Path) -> list[str]:
    """The `/metrics` address of each worker, once all of them logged theirs (`metrics on
    http://...`, once its server listens): `--metrics-port 0` lets each take a free port."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while len(found := re.findall(r"metrics on (http://\S+/metrics)", log.read_text())) < workers:
        if processor.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(found)} of {workers} workers serve /metrics:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return found


def settle(pids: list[int]) -> None:
    """Wait until the processes have finished starting (their CPU time stops rising for
    half a second, or `SETTLE_TIMEOUT_S` passed), so their imports and start-up are not
    counted as CPU spent on the workload."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = sum(cpu_seconds(p) for p in pids)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(cpu_seconds(p) for p in pids)
        if now - last < 0.02:
            return
        last = now


def processor_workers(partitions: int) -> int:
    """How many workers `torpor processor` runs without `--workers` (TORPOR_PROCESSOR_WORKERS, else
    its default): the bench passes the number on, so that its figures say how many ran."""
    given = os.environ.get(WORKERS_ENV, "").strip()  # click reads it so for the command
    return chosen_workers(int(given) if given else None, partitions=partitions,
                          hosting=False, until_idle=False)


def wait_for_workers(pid: int, workers: int, admin: AdminClient, group: str) -> None:
    """Wait until `torpor processor --workers` has started its worker processes and the
    group is stable with each of them holding partitions: a worker joining mid-wave moves
    partitions (restores, re-issued model calls), which is not the steady state measured."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while len(psutil.Process(pid).children()) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the processor did not start {workers} workers")
        time.sleep(0.2)
    while True:
        (future,) = admin.describe_consumer_groups([group], request_timeout=10).values()
        try:
            described = future.result(timeout=10)
        except KafkaException:  # the group is not there yet
            described = None
        if described is not None and described.state == ConsumerGroupState.STABLE and \
                sum(1 for m in described.members if m.assignment.topic_partitions) == workers:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the processor group did not settle with {workers} members")
        time.sleep(0.2)


def script(turns: int) -> str:
    """The scenario file whose [[model]] rules make the processor's scripted model the workload's."""
    chunks = ", ".join(f'"{c}"' for c in CHUNKS)
    answer = f"{{ chunks = [{chunks}], usage = [0, 0, 0] }}"
    call = (
        f'{{ chunks = [{chunks}], usage = [0, 0, 0], calls = [{{ name = "{TOOL}", '
        f'arguments = {{ command = "cargo test --workspace" }} }}] }}'
    )
    assert '"cargo test --workspace"' in ARGUMENTS
    # Each (rule, thread) walks its turns in order: one entry per turn of the run.
    return (
        f'[thread]\nid = "unused"\n\n[[model]]\nlast_contains = "{SUMMARY_LINE[:40]}"\n'
        f"turns = [{', '.join([answer] * turns)}]\n\n[[model]]\nturns = [{', '.join([call] * turns)}]\n"
    )


def start_broker() -> str:
    done = subprocess.run(
        [TORPOR, "broker", "start", "--dir", ".torpor/bench-broker"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return done.stdout.strip().splitlines()[-1]


def default_bootstrap() -> str:
    found = REPO / ".torpor" / "BOOTSTRAP"
    return found.read_text().strip() if found.exists() else start_broker()


class Receipts:
    """Counts committed `applied` receipts. A duplicate (a model answer given twice when a
    partition moved to another worker) is not progress: counted, the driver would send the
    next turn before every thread finished this one, and interrupt it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self._consumer.subscribe([topic])
        self.count = 0

    def wait_for(self, target: int, processor: subprocess.Popen[bytes], log: Path) -> None:
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while self.count < target:
            if processor.poll() is not None:
                raise RuntimeError(
                    f"the processor exited ({processor.returncode}):\n{log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count} of {target} receipts after {TURN_TIMEOUT_S}s")
            # Drain what is fetched, else wait for one record: consume() blocks its whole
            # timeout unless the batch fills, which would add that much to every turn.
            batch = self._consumer.consume(5000, timeout=0) or self._consumer.consume(1, timeout=0.05)
            self.count += sum(1 for m in batch if m.error() is None
                              and decode_value(m.value() or b"", Receipt).disposition == "applied")

    def close(self) -> None:
        self._consumer.close()


class KeyedRun:
    """`--signed`: a key ring as a deployment has one, so every input is signed and checked.

    The processor signs its loopbacks (the model's completions) with its key, the
    connector its answers with `connector:bench`'s, and the driver the workload's inputs
    with a gateway key for `user:*` (the threads' tenant and tool come from it); the
    processor verifies each one against the ring, as in production.
    """

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        keys, ring = work / "keys", work / "keyring.toml"
        for key_id, source in (("bench-proc", "processor"), ("bench-tool", "connector:bench"),
                               ("bench-gw", "user:*")):
            made = subprocess.run([TORPOR, "keys", "new", "--id", key_id, "--source", source, "--scope", "*",
                                   "--out-dir", str(keys), "--keyring", str(ring)],
                                  env=env, capture_output=True, text=True, check=False)
            if made.returncode != 0:
                raise RuntimeError(f"torpor keys new --id {key_id}: {made.stderr}")
        self.processor_env = {"TORPOR_KEYRING": str(ring), "TORPOR_PROCESSOR_KEY_ID": "bench-proc",
                              "TORPOR_PROCESSOR_KEY": str(keys / "bench-proc.pem")}
        self.connector_env = {"TORPOR_SIGNING_KEY_ID": "bench-tool",
                              "TORPOR_SIGNING_KEY": str(keys / "bench-tool.pem")}
        self._gateway = load_private_key(keys / "bench-gw.pem")

    def sign(self, record: Input) -> Input:
        return signing.sign(record, "bench-gw", self._gateway)


def run(
    bootstrap: str, agents: int, turns: int, wave: int, partitions: int, work: Path, keep_topics: bool,
    workers: int = 1, signed: bool = False,
) -> tuple[list[figures.WaveRow], dict[str, object]]:
    prefix = f"bench.{uuid.uuid4().hex[:10]}."
    settings = Settings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix, partitions=partitions),
    )
    names = TopicNames.for_prefix(prefix)
    admin = make_admin(settings)
    ensure_topics(admin, settings, Deadline.after(60))
    pt_topics = [f"{prefix}pt.{t}" for t in (Topic.INPUTS, *OUTPUT_TOPICS)]
    (work / "script.toml").write_text(script(turns))
    env = {
        **os.environ,
        "TORPOR_BOOTSTRAP": bootstrap,
        "TORPOR_TOPIC_PREFIX": prefix,
        "TORPOR_PARTITIONS": str(partitions),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    store_dir = work / "stores"
    processes: list[subprocess.Popen[bytes]] = []
    keyed = KeyedRun(work, env) if signed else None

    def start(args: list[str], name: str, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(work / f"{name}.log", "wb") as log:
            process = subprocess.Popen(args, cwd=REPO, env={**env, **(extra or {})}, stdout=log,
                                       stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    rows: list[figures.WaveRow] = []
    try:
        processor = start(
            [
                TORPOR,
                "processor",
                "--instance",
                "bench",
                "--app",
                f"app-{prefix}",
                "--store-dir",
                str(store_dir),
                "--script",
                str(work / "script.toml"),
                "--workers",
                str(workers),
                "--metrics-port",
                "0",
                "--log-level",
                "warning",
            ],
            "processor",
            keyed.processor_env if keyed else None,
        )
        connector = start(
            [
                TORPOR,
                "connector",
                "run",
                "bench.workload:BenchTool",
                "--group",
                f"conn-{prefix}",
                "--journal-dir",
                str(work / "journal"),
                "--log-level",
                "warning",
            ],
            "connector",
            keyed.connector_env if keyed else None,
        )
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "partitioner": "murmur2_random",
                "linger.ms": 5,
                "enable.idempotence": True,
            }
        )
        receipts = Receipts(bootstrap, names.of(Topic.RECEIPTS))
        expected = 0

        def send(records: list[Input]) -> None:
            for record in records if keyed is None else [keyed.sign(r) for r in records]:
                producer.produce(
                    names.of(Topic.INPUTS), key=record.thread_id.encode(), value=encode_value(record)
                )
                producer.poll(0)
            producer.flush(60)

        if workers > 1:  # the supervisor's workers: their CPU and RSS are the processor's
            wait_for_workers(processor.pid, workers, admin, f"app-{prefix}")
        pages = metrics_pages(workers, processor, work / "processor.log")
        settle([processor.pid, connector.pid])
        cpu_started = (cpu_seconds(processor.pid, descendants=True), cpu_seconds(connector.pid))
        started = time.perf_counter()
        for first in range(0, agents, wave):
            ids = [agent_id(i) for i in range(first, min(agents, first + wave))]
            wave_started = time.perf_counter()
            now = int(time.time() * 1000)
            send([create_input(t, now) for t in ids])
            expected += len(ids)
            for turn in range(1, turns + 1):
                send([turn_input(t, turn, int(time.time() * 1000)) for t in ids])
                expected += 4 * len(ids)  # user text, completion, tool result, completion
                receipts.wait_for(expected, processor, work / "processor.log")
            seconds = time.perf_counter() - wave_started
            done = 2 * turns * len(ids)  # checked against the topic below
            rss, store = rss_bytes(processor.pid, descendants=True), dir_bytes(store_dir)
            caches = scraped_cache_bytes(pages)
            rows.append(figures.wave_row(len(rows), first + len(ids), done, seconds, rss, caches, store))
            print(
                f"wave {len(rows) - 1}: {first + len(ids)} agents in {seconds:.2f}s ({done / seconds:,.0f}"
                f" completions/s), processor rss {rows[-1]['rss_bytes'] / 2**20:.1f} MiB",
                flush=True,
            )
        seconds = time.perf_counter() - started
        processor_cpu = cpu_seconds(processor.pid, descendants=True) - cpu_started[0]
        cpu = processor_cpu + cpu_seconds(connector.pid) - cpu_started[1]  # not the broker's
        receipts.close()
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=120)

        inputs = read_topic(bootstrap, names.of(Topic.INPUTS))
        answered: set[str] = set()  # by message id: a model answer given twice counts once
        for _, _, value in inputs:
            record = decode_value(value, Input)
            if isinstance(record.body, Completion) and record.body.error is None:
                answered.add(record.message_id)
        completions = len(answered)
        summary = figures.summarize("kafka", agents, turns, wave, completions, seconds, rows, cpu)
        outputs: dict[str, list[tuple[int, int]]] = defaultdict(list)
        changelog_bytes = 0
        checkpoint_records = 0  # one per partition a transaction covered: how finely commits cut
        for topic in OUTPUT_TOPICS:
            for _, key, value in read_topic(bootstrap, names.of(topic)):
                outputs[f"{prefix}pt.{topic}"].append((len(key), len(value)))
                if topic is Topic.CHANGELOG:
                    changelog_bytes += len(key) + len(value)
                    checkpoint_records += key == CHECKPOINT_KEY

        create_topics(admin, pt_topics, partitions)
        for partition, key, value in inputs:
            produce_queued(producer, pt_topics[0], key, value, partition)
            producer.poll(0)
        producer.flush(120)
        config = ProcessorConfig(instance="unused", store_dir=work)
        pt_cpu = cpu_seconds()  # the pass-through runs in this process, librdkafka's threads too
        pt_seconds = passthrough.run(
            settings,
            pt_topics[0],
            passthrough.apportion(outputs, len(inputs)),
            commit_interval=config.commit_interval,
            commit_every=config.commit_every,
        )
        pt_cpu = cpu_seconds() - pt_cpu
        pt_rate = completions / pt_seconds if pt_seconds else 0.0
        pt_cpu_each = round(pt_cpu / completions * 1e6, 1) if completions else ""
        rate = float(summary["completions_per_s"])  # type: ignore[arg-type]
        summary.update(
            {
                "partitions": partitions,
                "workers": workers,
                "processor_cpu_seconds": round(processor_cpu, 3),
                "changelog_bytes_per_agent": round(changelog_bytes / agents, 1),
                "checkpoint_records": checkpoint_records,
                "passthrough_seconds": round(pt_seconds, 3),
                "passthrough_completions_per_s": round(pt_rate, 1),
                "passthrough_cpu_us_per_completion": pt_cpu_each,
                "ratio_to_passthrough": round(rate / pt_rate, 3) if pt_rate else "",
            }
        )
        return rows, summary
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        if not keep_topics:
            delete_topics(admin, [*names.all(), *pt_topics])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--bootstrap", default=None, help="Default: .torpor/BOOTSTRAP, or a broker it starts."
    )
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--wave", type=int, default=500)
    # The topics' default (TopicSettings): what a deployment gets, and an even split for 2 or 3 workers.
    parser.add_argument("--partitions", type=int, default=TopicSettings().partitions)
    parser.add_argument("--workers", type=int, default=None,
                        help="`torpor processor --workers`: processes. Default: the processor's "
                             "(TORPOR_PROCESSOR_WORKERS, else a worker per usable core, at most one "
                             "per partition).")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--keep", action="store_true", help="Keep the topics and the work directory.")
    parser.add_argument("--signed", action="store_true",
                        help="With a key ring: every input signed (gateway, processor, connector keys) "
                             "and verified, as a deployment runs.")
    args = parser.parse_args(argv)
    if min(args.agents, args.turns, args.wave, args.partitions) < 1:
        parser.error("--agents, --turns, --wave and --partitions must be at least 1")
    workers = args.workers or processor_workers(args.partitions)
    bootstrap = args.bootstrap or default_bootstrap()
    work = Path(tempfile.mkdtemp(prefix="torpor-bench-kafka-"))
    try:
        rows, summary = run(bootstrap, args.agents, args.turns, args.wave, args.partitions, work, args.keep,
                            workers, args.signed)
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    title = "Kafka mode: processor RSS after each wave"
    figures.write(args.out, "kafka", SUMMARY_COLUMNS, rows, summary, title)
    figures.report(summary)
    print(f"  changelog bytes per agent: {summary['changelog_bytes_per_agent']}")
    print(f"  checkpoint records (one per partition per transaction): {summary['checkpoint_records']}")
    print(
        f"  pass-through: {summary['passthrough_completions_per_s']} completions/s "
        f"in {summary['passthrough_seconds']}s; Torpor/pass-through = {summary['ratio_to_passthrough']}"
    )
    return figures.exit_status(summary)


if __name__ == "__main__":
    raise SystemExit(main())
