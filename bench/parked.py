"""Partition start with metrics on: the parked gauge's scan of a store of N threads.

Contract. `python -m bench.parked [--threads 20000] [--turns 1] [--park 10]` folds N
threads with `bench.restore.generate` (the processor's `step`; 2*turns history entries
each) into one RocksDB store, parks every `--park`-th thread through its own Control
input, closes the store and opens it again (cold caches, as a restarted processor finds
it), then times `ProcessorMetrics.partition_started` (what the processor calls once per
assigned partition, on the loop's thread, before it folds) twice and prints one line:
threads, entries per thread, parked, seconds of each call. Exit 1 if the gauge does not
count exactly the threads it parked. No broker needed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.restore import generate
from torpor.processors.metrics import ProcessorMetrics
from torpor.processors.step import StepRecord, step
from torpor.processors.store.kv import RocksStore
from torpor.schemas.records import Control, Input

APPLY_BATCH = 5_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=20_000)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--park", type=int, default=10, help="Park every N-th thread (0: none).")
    args = parser.parse_args()
    generated = generate(args.threads, args.turns, 1)
    scratch = Path(tempfile.mkdtemp(prefix="torpor-parked-"))
    try:
        store = RocksStore(scratch / "partition-0")
        changes = generated.changes[0]
        for start in range(0, len(changes), APPLY_BATCH):
            store.apply(changes[start:start + APPLY_BATCH])
        parks = [Input(f"park-{i}", f"bench-{i:06d}", 10_000_000, "operator:bench", None, None, None,
                       Control("park", None, None, "bench"))
                 for i in range(0, args.threads, args.park)] if args.park else []
        offset = len(generated.inputs[0])
        step(store, [StepRecord(p, 0, offset + i) for i, p in enumerate(parks)])  # it writes the store
        store.close()
        store = RocksStore(scratch / "partition-0")
        seconds = []
        for _ in range(2):
            metrics = ProcessorMetrics()
            began = time.perf_counter()
            metrics.partition_started(0, store, None)
            seconds.append(time.perf_counter() - began)
            counted = metrics.registry.get_sample_value("torpor_parked_threads", {})
            if counted != len(parks):
                print(f"the gauge counted {counted} parked threads; {len(parks)} were parked",
                      file=sys.stderr)
                sys.exit(1)
        store.close()
        print(f"threads {args.threads}, entries each {2 * args.turns}, parked {len(parks)}: "
              f"partition_started {seconds[0]:.3f} s cold, {seconds[1]:.3f} s again")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
