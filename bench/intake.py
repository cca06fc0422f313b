"""`python -m bench.intake`: the connector's journal discipline alone, in one process, no broker.

Contract. One `JournaledIntake` over an `EffectJournal` in a temporary RocksDB directory
(as `torpor connector run` keeps it) serves `bench.workload.BenchTool`: `--calls`
`run_command` dispatches are routed in batches of `--batch` (`route_all`, as the
connector runtime does with each poll), each answer (encoded for `inputs` by the intake)
acknowledged at once (`delivered`). Prints
CPU and wall time per call. What it leaves out: the consumer, the producer, the broker.
Deterministic but for the syncs' wait, so it also runs under `valgrind --tool=callgrind`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.connector import dispatch
from bench.workload import BenchTool
from torpor.connectors.intake import JournaledIntake
from torpor.connectors.journal import EffectJournal
from torpor.schemas.codec import Codec
from torpor.schemas.records import Input


def run(calls: int, batch: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="bench-intake-"))
    journal = EffectJournal(work / "journal")
    codec = Codec()
    acknowledged: list[str] = []

    def produce(record: Input, request_id: str | None, value: bytes) -> None:
        if request_id is not None:
            acknowledged.append(request_id)

    intake = JournaledIntake(journal, codec=codec, inputs_topic="bench.inputs", max_bytes=262_144,
                             signer=None, clock=lambda: time.time_ns() // 1_000_000, produce=produce)
    tool = BenchTool(intake.send, lambda: time.time_ns() // 1_000_000)
    dispatches = [dispatch(i, "intake") for i in range(calls)]
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for first in range(0, calls, batch):
            intake.route_all(dispatches[first:first + batch], tool)
            for request_id in acknowledged:
                intake.delivered(request_id)
            acknowledged.clear()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        syncs = journal.syncs
    finally:
        journal.close()
        shutil.rmtree(work, ignore_errors=True)
    result = {"cpu_us_per_call": cpu / calls * 1e6, "wall_us_per_call": wall / calls * 1e6,
              "syncs": float(syncs)}
    print(f"{calls} calls in batches of {batch}: {result['cpu_us_per_call']:.1f} us CPU, "
          f"{result['wall_us_per_call']:.1f} us wall per call, {syncs} syncs", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    run(args.calls, args.batch)


if __name__ == "__main__":
    main()
