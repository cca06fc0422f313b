"""The transactional checkpoint loop against a real broker, with a counter per key as the task.

Each test runs the loop in a child process (`tests/streams/counter_task.py`) so that it
can be killed for real (SIGKILL, SIGSTOP) at the crash points of DESIGN section 6, and
then checks exactly-once from the outside: every input appears once on `out`
(read_committed), none is missing, and each key's count in RocksDB equals its inputs.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from confluent_kafka.cimpl import NewTopic

from tests.conftest import TopicFactory, wait_for_leaders
from tests.faults.own_broker import OwnBroker
from tests.streams.counter_rig import CounterRig, assert_counts_are_gapless, assert_exactly_once
from tests.waiting import wait_until
from torpor.streams.txncalls import WatchdogExpiredError
from torpor.streams.txncalls import watched as _watched


@pytest.fixture
def rig(kafka_bootstrap: str, topic_factory: TopicFactory, tmp_path: Path) -> Iterator[CounterRig]:
    partitions = 3
    rig = CounterRig(
        bootstrap=kafka_bootstrap,
        inputs=topic_factory(partitions),
        changelog=topic_factory(partitions, {"cleanup.policy": "compact"}),
        out=topic_factory(partitions),
        parked=topic_factory(partitions),
        group=f"counter-{uuid.uuid4().hex[:12]}",
        store=tmp_path / "stores",
        partitions=partitions,
    )
    yield rig
    rig.kill_all()  # a failed test must not leave a loop running against the broker


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.mark.kafka
def test_every_input_is_counted_once_and_its_output_committed(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(600)
    _ok(rig.run_until_idle())
    assert_exactly_once(rig, inputs)
    assert sum(rig.committed_offsets().values()) == 600


@pytest.mark.kafka
def test_a_second_run_over_the_same_store_folds_nothing_again(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(300)
    _ok(rig.run_until_idle())
    more = rig.produce_inputs(200, first=300)
    _ok(rig.run_until_idle())
    assert_exactly_once(rig, inputs + more)


@pytest.mark.kafka
def test_sigkill_at_random_points_loses_nothing_and_duplicates_nothing(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(6000)
    progress = 0
    for kill in range(4):
        # Small batches and commits make many transactions, so each kill lands mid-stream.
        process = rig.start(commit_every=40, max_batch=20, log_name=f"kill{kill}")
        # Capped: on a loaded machine an instance may fold the rest while the outputs are
        # counted, and no more than every input can come out (that kill then lands idle).
        progress = rig.wait_for_out(min(progress + 300, len(inputs)), timeout=120)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    _ok(rig.run_until_idle(timeout=180))
    assert_exactly_once(rig, inputs)


@pytest.mark.kafka
def test_crash_before_the_commit_leaves_nothing_visible(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(500)
    crashed = rig.run_until_idle(env={"COUNTER_CRASH_IN_PROCESS": "250"}, max_batch=50, commit_every=100)
    assert crashed.returncode == 9
    _ok(rig.run_until_idle())
    assert_exactly_once(rig, inputs)


@pytest.mark.kafka
def test_crash_between_the_commit_and_the_store_write_is_caught_up_by_restore(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(500)
    crashed = rig.run_until_idle(env={"COUNTER_CRASH_AFTER_COMMIT": "3"}, max_batch=50, commit_every=100)
    assert crashed.returncode == 9
    # The store now lags the changelog by one checkpoint; restore must bring it (and its
    # input offset) up, or the offset check refuses to fold.
    out = _ok(rig.run_until_idle())
    assert "commits=" in out
    assert_exactly_once(rig, inputs)


@pytest.mark.kafka
def test_a_producer_queue_found_full_mid_batch_loses_and_repeats_no_record(rig: CounterRig) -> None:
    # Room for 4 records: nearly every batch finds the queue full part way through its
    # records and its changelog rows, and goes on from that record once deliveries drain it.
    inputs = rig.produce_inputs(600, poison_every=50)
    _ok(rig.run_until_idle(max_batch=50, commit_every=200, queue_messages=4))
    assert_exactly_once(rig, inputs)
    assert_counts_are_gapless(rig, inputs)
    assert len(rig.read_committed(rig.parked)) == 12


@pytest.mark.kafka
def test_poison_records_are_parked_and_the_partition_goes_on(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(200, poison_every=50)
    _ok(rig.run_until_idle())
    assert_exactly_once(rig, inputs)
    parked = rig.read_committed(rig.parked)
    assert [value for _, value in parked] == [b"poison"] * 4


@pytest.mark.kafka
def test_a_paused_zombie_is_fenced_and_exits_non_zero(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(3000)
    zombie = rig.start(commit_every=40, max_batch=20, log_name="zombie")
    rig.wait_for_out(200)
    zombie.send_signal(signal.SIGSTOP)  # a long GC pause, a frozen VM: it still thinks it owns
    # The successor runs elsewhere, with a store of its own (empty: it restores from the
    # changelog), and the same instance id: its init_transactions fences the zombie's
    # producer, and its static membership takes the zombie's place in the group.
    successor = dataclasses.replace(rig, store=rig.store.parent / "successor")
    try:
        _ok(successor.run_until_idle(timeout=180))
    finally:
        zombie.send_signal(signal.SIGCONT)
    code = wait_until(lambda: zombie.poll(), timeout=60, message="the zombie exits once it wakes")
    assert code != 0
    log = "\n".join(p.read_text() for p in rig.store.parent.glob("zombie-*.log"))
    assert "fatal:" in log, log[-3000:]
    assert_exactly_once(successor, inputs)


@pytest.mark.kafka
def test_a_second_instance_takes_partitions_over_mid_stream_without_double_counting(rig: CounterRig) -> None:
    # A first run gives every partition state, so whichever partition moves has a
    # changelog to restore and a committed offset to check it against.
    inputs = rig.produce_inputs(3000, keys=30)
    _ok(rig.run_until_idle())
    inputs += rig.produce_inputs(24000, keys=30, first=3000)
    first = rig.start(commit_every=40, max_batch=10, instance="i0", log_name="i0")
    rig.wait_for_out(6000)
    # Another host: its own store folder (it restores the partitions it gets from the
    # changelog); cooperative-sticky moves only those, and i0 commits before letting go.
    second_rig = dataclasses.replace(rig, store=rig.store.parent / "i1")
    second = second_rig.start(commit_every=40, max_batch=10, instance="i1", log_name="i1")

    def logs_of(name: str) -> str:
        return "\n".join(p.read_text() for p in rig.store.parent.glob(f"{name}-*.log"))

    wait_until(lambda: "partition restored" in logs_of("i1"), timeout=60, message="i1 got partitions")
    wait_until(lambda: len(rig.read_committed(rig.out)) >= len(inputs), timeout=240,
               message="every input folded by the two instances")
    for process in (first, second):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    seen = rig.out_values()
    assert sorted(seen) == sorted(v for _, v in inputs)
    assert_counts_are_gapless(rig, inputs)
    assert re.search(r"restored \([1-9]\d* changelog records", logs_of("i1")), logs_of("i1")
    assert "partition closed" in logs_of("i0")


def test_a_transaction_call_that_outlives_its_deadline_is_declared_hung() -> None:
    release = threading.Event()
    try:
        with pytest.raises(WatchdogExpiredError, match=r"commit_transaction did not return within 0\.1s"):
            _watched("commit_transaction", lambda timeout: release.wait(30), 0.05, 0.05)
    finally:
        release.set()  # let the abandoned daemon thread end


def test_a_watched_call_returns_its_value_or_raises_its_own_error() -> None:
    assert _watched("init_transactions", lambda timeout: timeout * 2, 1.0, 1.0) == 2.0
    with pytest.raises(KeyError):
        _watched("abort_transaction", lambda timeout: {}["missing"], 1.0, 1.0)


@pytest.mark.kafka
def test_a_lone_input_is_committed_at_once_not_at_the_commit_interval(rig: CounterRig) -> None:
    # The next hop of a turn waits for this commit: with nothing more waiting the loop
    # commits after `commit_linger`, long before an interval chosen far beyond the wait.
    from tests.streams.counter_task import CounterTask
    from torpor.streams.clients import make_consumer, make_producer
    from torpor.streams.config import KafkaSettings, Settings
    from torpor.streams.loop import CheckpointLoop, LoopSettings

    settings = Settings(kafka=KafkaSettings(bootstrap_servers=rig.bootstrap))
    loop = CheckpointLoop(
        make_consumer(settings, rig.group, instance_id="i0"),
        make_producer(settings, transactional_id=f"{rig.group}-i0"),
        make_consumer(settings, f"{rig.group}.restore"),
        lambda partition: CounterTask(rig.store, partition, rig.out, rig.parked),
        LoopSettings(rig.inputs, rig.changelog, commit_interval=120.0, commit_every=1_000_000),
    )
    stop = threading.Event()
    runner = threading.Thread(target=loop.run, args=(stop.is_set,), daemon=True)
    runner.start()
    try:
        wait_until(lambda: loop.owned_partitions == [0, 1, 2] or None, 60, "the loop owns every partition")
        first = rig.produce_inputs(1)
        rig.wait_for_out(1, timeout=60)  # half the interval: committed because idle
        more = rig.produce_inputs(5, first=1)
        rig.wait_for_out(6, timeout=60)
    finally:
        stop.set()
        runner.join(timeout=60)
        loop.close()
    assert not runner.is_alive()
    assert loop.commits >= 2
    assert_exactly_once(rig, first + more)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBroker]:
    """A broker of this module's own: the test below freezes it (never the shared one)."""
    broker = OwnBroker.start(tmp_path_factory.mktemp("own-broker"))
    yield broker
    broker.close()


@pytest.fixture
def own_rig(own_broker: OwnBroker, tmp_path: Path) -> Iterator[CounterRig]:
    prefix = f"stall-{uuid.uuid4().hex[:8]}"
    partitions = 3
    admin = AdminClient({"bootstrap.servers": own_broker.bootstrap})
    names = {name: f"{prefix}.{name}" for name in ("inputs", "changelog", "out", "parked")}
    futures = admin.create_topics([
        NewTopic(topic, partitions, 1, config={"cleanup.policy": "compact"} if name == "changelog" else {})
        for name, topic in names.items()
    ])
    for future in futures.values():
        future.result(60)
    for topic in names.values():
        wait_for_leaders(admin, topic, partitions)
    (tmp_path / "stores").mkdir()
    rig = CounterRig(bootstrap=own_broker.bootstrap, inputs=names["inputs"], changelog=names["changelog"],
                     out=names["out"], parked=names["parked"], group=f"counter-{prefix}",
                     store=tmp_path / "stores", partitions=partitions)
    yield rig
    rig.kill_all()


@pytest.mark.kafka
def test_a_commit_that_times_out_is_resumed_not_aborted(own_broker: OwnBroker, own_rig: CounterRig) -> None:
    # librdkafka: a commit_transaction that timed out must be called again; an abort then
    # fails with _CONFLICT (the old loop aborted and spun on that until it exited 2).
    inputs = own_rig.produce_inputs(300)
    process = own_rig.start(until_idle=True, env={"TORPOR_FAULT": "before_commit:1:stop"}, log_name="stall",
                            transaction_timeout=2.0, txn_timeout_ms=300_000)
    log_path = own_rig.store.parent

    def log() -> str:
        return "\n".join(p.read_text(errors="replace") for p in log_path.glob("stall-*.log"))

    wait_until(lambda: "fault: SIGSTOP at before_commit" in log(), 120,
               "the loop stops itself before a commit")
    own_broker.pause()  # the broker stalls: the commit the loop is about to make times out
    try:
        process.send_signal(signal.SIGCONT)
        wait_until(lambda: "commit_transaction failed, calling it again" in log(), 120,
                   "the timed-out commit is retried")
    finally:
        own_broker.resume()
    assert process.wait(timeout=180) == 0, log()[-4000:]
    text = log()
    assert "commit_transaction succeeded after" in text, text[-4000:]
    assert "aborting checkpoint" not in text and "_CONFLICT" not in text, text[-4000:]
    assert_exactly_once(own_rig, inputs)


def _open_transactions_settled(bootstrap: str, topics: list[str], partitions: int) -> bool:
    """Whether every partition's last stable offset has reached its end: no transaction open."""
    ends: dict[str, tuple[int, int]] = {}
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks",
                             "isolation.level": isolation, "log_level": 2})
        try:
            for topic in topics:
                for partition in range(partitions):
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                    ends[f"{topic}/{partition}/{isolation}"] = high
        finally:
            consumer.close()
    return all(ends[f"{t}/{p}/read_uncommitted"] == ends[f"{t}/{p}/read_committed"]
               for t in topics for p in range(partitions))


@pytest.mark.kafka
def test_a_transaction_the_broker_expired_gets_a_new_producer_in_process(rig: CounterRig) -> None:
    # A leader failover can outlast transaction.timeout.ms: the coordinator aborts the open
    # transaction and bumps the producer's epoch, and the next call is fenced. Nobody else
    # owns the transactional id, so the loop renews its producer instead of exiting.
    inputs = rig.produce_inputs(300)
    process = rig.start(until_idle=True, env={"TORPOR_FAULT": "before_commit:1:stop"}, log_name="expired",
                        txn_timeout_ms=2000)

    def log() -> str:
        return "\n".join(p.read_text(errors="replace") for p in rig.store.parent.glob("expired-*.log"))

    wait_until(lambda: "fault: SIGSTOP at before_commit" in log(), 120,
               "the loop stops itself before a commit")
    # Its records and offsets are in the open transaction; the coordinator aborts it after
    # transaction.timeout.ms (and its next check): then nothing is open on the topics.
    wait_until(lambda: _open_transactions_settled(rig.bootstrap, [rig.out, rig.changelog], rig.partitions),
               120, "the coordinator aborts the paused transaction")
    process.send_signal(signal.SIGCONT)
    assert process.wait(timeout=180) == 0, log()[-4000:]
    text = log()
    assert "producer renewed" in text and "fatal:" not in text, text[-4000:]
    assert_exactly_once(rig, inputs)


@pytest.mark.kafka
@pytest.mark.parametrize(("linger_ms", "refused"), [
    # Each record sent at once: the refusal arrives while the fold goes on.
    (0, r"aborting checkpoint: produce to \S+ failed: _STATE"),
    # A linger longer than any checkpoint (commit_interval 0.2 s) holds the record until the
    # commit's flush sends it, as the default (50 ms) does for the short checkpoints.
    (5000, r"aborting checkpoint: commit_transaction failed: MSG_SIZE_TOO_LARGE"),
], ids=["refused-mid-fold", "refused-at-commit"])
def test_a_transaction_that_fails_under_the_fold_is_aborted_and_folded_again(
        kafka_bootstrap: str, topic_factory: TopicFactory, admin: AdminClient, tmp_path: Path,
        linger_ms: int, refused: str) -> None:
    # A record the broker refuses (here: too large for `out`) fails the open transaction in
    # the background, as OUT_OF_ORDER_SEQUENCE_NUMBER did after a leader failover; librdkafka
    # then refuses the fold's next records with _STATE, or the commit with the refusal. The
    # loop aborts and folds again (it used to exit 2 on that _STATE), until the topic takes
    # the record.
    partitions = 3
    rig = CounterRig(
        bootstrap=kafka_bootstrap, inputs=topic_factory(partitions),
        changelog=topic_factory(partitions, {"cleanup.policy": "compact"}),
        out=topic_factory(partitions, {"max.message.bytes": "100000"}), parked=topic_factory(partitions),
        group=f"counter-{uuid.uuid4().hex[:12]}", store=tmp_path / "stores", partitions=partitions,
    )
    try:
        inputs = rig.produce_inputs(300)
        big = (b"k0", b"big" + b"x" * 200_000)
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
        producer.produce(rig.inputs, key=big[0], value=big[1])
        assert producer.flush(30) == 0
        inputs += [big, *rig.produce_inputs(2700, first=300)]
        # Many small batches per checkpoint: with linger 0 the refusal arrives while the fold goes on.
        process = rig.start(until_idle=True, commit_every=1000, max_batch=20, log_name="refused",
                            linger_ms=linger_ms)

        def log() -> str:
            return "\n".join(p.read_text(errors="replace") for p in rig.store.parent.glob("refused-*.log"))

        wait_until(lambda: re.search(refused, log()) or process.poll() is not None, 180,
                   f"the refused record aborts the checkpoint ({refused})")
        assert process.poll() is None, log()[-4000:]
        resource = ConfigResource(ResourceType.TOPIC, rig.out,
                                  incremental_configs=[ConfigEntry("max.message.bytes", "1048588",
                                                                   incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)
        assert process.wait(timeout=300) == 0, log()[-4000:]
        assert "fatal:" not in log(), log()[-4000:]
        assert_exactly_once(rig, inputs)
    finally:
        rig.kill_all()


@pytest.mark.kafka
def test_a_consumer_fenced_by_a_member_id_nobody_runs_is_rebuilt_in_process(rig: CounterRig) -> None:
    # In a coordinator failover a JoinGroup of our own can get its answer lost: its member id
    # then holds our group.instance.id, and our consumer is fenced (FENCED_INSTANCE_ID, fatal
    # in librdkafka). Here a static member with our instance id joins and closes at once (a
    # static member does not leave): once its session expires nobody holds the id, and the
    # loop builds a new consumer instead of exiting 2.
    inputs = rig.produce_inputs(1000)
    process = rig.start(commit_every=40, max_batch=20, log_name="rejoin")

    def log() -> str:
        return "\n".join(p.read_text(errors="replace") for p in rig.store.parent.glob("rejoin-*.log"))

    rig.wait_for_out(100, timeout=120)
    ghost = _member_as(rig, "i0")
    try:
        # A join can wait out a rebalance the group is in (the loop's own rejoin): a generous
        # deadline. Joined is enough: once it holds partitions, its polls return records, and
        # waiting for an empty poll kept it alive (holding the id) past the loop's rejoin wait.
        wait_until(lambda: _joined(ghost), 180, "the ghost joins")
    finally:
        ghost.close()
    wait_until(lambda: "consumer rebuilt" in log() or process.poll() is not None, 180,
               "the loop rebuilds its fenced consumer")
    assert process.poll() is None, log()[-4000:]
    inputs += rig.produce_inputs(1000, first=1000)
    rig.wait_for_out(len(inputs), timeout=180)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, log()[-4000:]
    text = log()
    assert "fatal:" not in text and "rebuilding the consumer" in text, text[-4000:]
    assert_exactly_once(rig, inputs)


@pytest.mark.kafka
def test_a_consumer_fenced_by_a_live_member_with_its_instance_id_exits_and_is_not_rebuilt(
        rig: CounterRig) -> None:
    # The attacker's side of the test above: a member that stays (a successor, or anyone
    # joining with our group.instance.id) keeps the id. Rebuilding would fence it in turn;
    # the loop must exit 2 instead, once the wait for the id's release runs out.
    rig.produce_inputs(1000)
    process = rig.start(commit_every=40, max_batch=20, log_name="usurped", rejoin_wait=10.0)

    def log() -> str:
        return "\n".join(p.read_text(errors="replace") for p in rig.store.parent.glob("usurped-*.log"))

    rig.wait_for_out(100, timeout=120)
    usurper = _member_as(rig, "i0")
    try:
        wait_until(lambda: _joined(usurper), 180, "the usurper joins")
        assert process.wait(timeout=180) == 2, log()[-4000:]
    finally:
        usurper.close()
    text = log()
    assert "not rebuilding the consumer: instance i0 is replaced" in text, text[-4000:]
    assert "fatal: ConsumerFencedError" in text and "consumer rebuilt" not in text, text[-4000:]
    folded = rig.out_values()  # what it committed before it was fenced: each input at most once
    assert folded and len(folded) == len(set(folded))


def _joined(member: Consumer) -> bool:
    """Serve `member`'s join (a record it gets is dropped: it commits nothing); True once it has one."""
    member.poll(0.2)
    return bool(member.memberid())


def _member_as(rig: CounterRig, instance: str) -> Consumer:
    """A static member of the rig's group with `instance` as its group.instance.id, subscribed."""
    consumer = Consumer({"bootstrap.servers": rig.bootstrap, "group.id": rig.group,
                         "group.instance.id": instance, "partition.assignment.strategy": "cooperative-sticky",
                         "enable.auto.commit": False, "session.timeout.ms": 6000, "log_level": 2})
    consumer.subscribe([rig.inputs])
    return consumer
