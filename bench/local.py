"""`python -m bench.local`: the issue-7 workload in local mode (one process, RocksDB store).

Contract. Runs `--agents` agents in waves of `--wave` (each agent: `--turns` turns, two
completions and one tool round trip per turn, see `bench.workload`) through
`LocalRuntime` with the RocksDB store (in local mode's own temp directory, as `torpor
local` runs it, unless `--store-dir`), the stateless `BenchModel` and the
`ForgetfulBenchTool`. After each turn of a wave: run until idle, then trim the in-process
log (it stands in for Kafka, see `InProcessLog.trim`). After each wave: `gc.collect()`,
sample this process's RSS and what the bounded store caches hold (`kv.cache_use`). The
sampling is left out of the timed window (wall and CPU), as Kafka mode leaves its driver
out: the `gc.collect()` that makes the RSS honest is the bench's, not the runtime's
(about 0.2 s a wave at 500 agents, ~3% of a 2,000 x 20 run); `sampling_cpu_seconds` in
the summary says how much was left out. Before stop 31 it was inside. Why
after each turn: a wave's records held until its end (500 agents x 20 turns, some
170,000 records) raised the process's high-water mark by about 180 MiB, which freed
memory does not give back, so the RSS measured was mostly the broker's stand-in, not the
runtime.
Prints a summary and writes `local.csv` (one row per wave), `local-summary.csv` and
`local-rss.png` into `--out`. Exit 1 if the completions counted differ from
agents * turns * 2: a benchmark that lost work must not report a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench import figures
from bench.measure import cpu_seconds, dir_bytes, rss_bytes
from bench.workload import BenchModel, ForgetfulBenchTool, agent_id, create_input, turn_input
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms, tune_collector
from torpor.processors.store.kv import cache_use
from torpor.schemas.records import Completion, Input
from torpor.streams.log import LogRecord

SUMMARY_COLUMNS: Final = (*figures.RUN_COLUMNS, *figures.MEASURED_COLUMNS, "sampling_cpu_seconds")
WAVE_TIMEOUT_S: Final = 3600.0


@dataclass
class Counter:
    completions: int = 0

    def observe(self, record: LogRecord[object]) -> None:
        value = record.value
        if isinstance(value, Input) and isinstance(value.body, Completion) and value.body.error is None:
            self.completions += 1


async def run(
    agents: int, turns: int, wave: int, store_dir: Path | None, batch_size: int
) -> tuple[list[figures.WaveRow], dict[str, object]]:
    runtime: LocalRuntime
    # The tool's sink is bound late: the runtime needs the tool, the tool the runtime's sink.
    def sink(record: Input) -> None:
        runtime.send(record)

    tool = ForgetfulBenchTool(sink, now_ms)
    runtime = LocalRuntime(
        BenchModel(), tool, LocalConfig(store="rocks", store_dir=store_dir, batch_size=batch_size)
    )
    store_root = runtime.store_root
    assert store_root is not None  # a RocksDB store: in `store_dir`, or local mode's own temp directory
    counter = Counter()
    runtime.observers.append(counter.observe)
    rows: list[figures.WaveRow] = []
    sampling_s = sampling_cpu = 0.0  # spent sampling after the waves: left out of the window
    started, cpu_started = time.perf_counter(), cpu_seconds()
    try:
        for first in range(0, agents, wave):
            ids = [agent_id(i) for i in range(first, min(agents, first + wave))]
            before, wave_started = counter.completions, time.perf_counter()
            for thread_id in ids:
                runtime.send(create_input(thread_id, now_ms()))
            for turn in range(1, turns + 1):
                for thread_id in ids:
                    runtime.send(turn_input(thread_id, turn, now_ms()))
                await runtime.run_until_idle(WAVE_TIMEOUT_S)
                runtime.log.trim()  # every record has been read
            sample_started, sample_cpu = time.perf_counter(), cpu_seconds()
            seconds = sample_started - wave_started
            gc.collect()
            done = counter.completions - before
            rss, store, use = rss_bytes(), dir_bytes(store_root), cache_use()
            sampling_s += time.perf_counter() - sample_started
            sampling_cpu += cpu_seconds() - sample_cpu
            caches = use.block_cache + use.memtables + use.rows
            rows.append(figures.wave_row(len(rows), first + len(ids), done, seconds, rss, caches, store))
            print(
                f"wave {len(rows) - 1}: {first + len(ids)} agents, {done} completions in {seconds:.2f}s "
                f"({done / seconds:,.0f}/s), rss {rows[-1]['rss_bytes'] / 2**20:.1f} MiB",
                flush=True,
            )
        seconds = time.perf_counter() - started - sampling_s
        cpu = cpu_seconds() - cpu_started - sampling_cpu
    finally:
        await runtime.close()
    # The CPU includes the driver's sending of the inputs and its trimming of the log after
    # each turn (its stand-in for Kafka's retention), not its sampling after each wave.
    summary = figures.summarize("local", agents, turns, wave, counter.completions, seconds, rows, cpu)
    summary["sampling_cpu_seconds"] = round(sampling_cpu, 3)
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--wave", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=LocalConfig().batch_size)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--store-dir", type=Path, default=None,
        help="Default: local mode's own temp directory (as `torpor local` runs: no write-ahead log), "
             "removed after.",
    )
    args = parser.parse_args(argv)
    if args.agents < 1 or args.turns < 1 or args.wave < 1:
        parser.error("--agents, --turns and --wave must be at least 1")
    tune_collector()  # this process runs the runtime, as `torpor processor` does its own
    rows, summary = asyncio.run(run(args.agents, args.turns, args.wave, args.store_dir, args.batch_size))
    figures.write(args.out, "local", SUMMARY_COLUMNS, rows, summary, "local mode: RSS after each wave")
    figures.report(summary)
    return figures.exit_status(summary)


if __name__ == "__main__":
    raise SystemExit(main())
