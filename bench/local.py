"""`python -m bench.local`: the issue-7 workload in local mode (one process, RocksDB store).

Contract. Runs `--agents` agents in waves of `--wave` (each agent: `--turns` turns, two
completions and one tool round trip per turn, see `bench.workload`) through
`LocalRuntime` with the RocksDB store, the stateless `BenchModel` and the
`ForgetfulBenchTool`. After each wave: run until idle, trim the in-process log (it
stands in for Kafka, see `bench.retention`), `gc.collect()`, sample this process's RSS.
Prints a summary and writes `local.csv` (one row per wave), `local-summary.csv` and
`local-rss.png` into `--out`. Exit 1 if the completions counted differ from
agents * turns * 2: a benchmark that lost work must not report a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.measure import EIGHT_GB, dir_bytes, idle_agents_in, plot_rss, rss_bytes, slope, write_csv
from bench.retention import RetainedLog
from bench.workload import BenchModel, ForgetfulBenchTool, agent_id, create_input, turn_input
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms, tune_collector
from torpor.schemas.records import Completion, Input
from torpor.streams.log import LogRecord

WAVE_COLUMNS: Final = (
    "wave",
    "agents",
    "completions",
    "wave_seconds",
    "completions_per_s",
    "rss_bytes",
    "store_bytes",
)
SUMMARY_COLUMNS: Final = (
    "mode",
    "agents",
    "turns",
    "wave",
    "completions",
    "expected_completions",
    "seconds",
    "completions_per_s",
    "rss_slope_kib_per_agent",
    "idle_agents_in_8gb",
    "store_bytes_per_agent",
)
WAVE_TIMEOUT_S: Final = 3600.0


@dataclass
class Counter:
    completions: int = 0

    def observe(self, record: LogRecord[object]) -> None:
        value = record.value
        if isinstance(value, Input) and isinstance(value.body, Completion) and value.body.error is None:
            self.completions += 1


async def run(
    agents: int, turns: int, wave: int, store_dir: Path, batch_size: int
) -> tuple[list[dict[str, object]], dict[str, object]]:
    runtime: LocalRuntime
    # The tool's sink is bound late: the runtime needs the tool, the tool the runtime's sink.
    tool = ForgetfulBenchTool(lambda record: runtime.send(record), now_ms)
    runtime = LocalRuntime(
        BenchModel(), tool, LocalConfig(store="rocks", store_dir=store_dir, batch_size=batch_size)
    )
    runtime.log = RetainedLog()  # type: ignore[assignment]
    counter = Counter()
    runtime.observers.append(counter.observe)
    rows: list[dict[str, object]] = []
    started = time.perf_counter()
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
            seconds = time.perf_counter() - wave_started
            runtime.log.trim()  # type: ignore[attr-defined]
            gc.collect()
            done = counter.completions - before
            rows.append(
                {
                    "wave": len(rows),
                    "agents": first + len(ids),
                    "completions": done,
                    "wave_seconds": round(seconds, 3),
                    "completions_per_s": round(done / seconds, 1),
                    "rss_bytes": rss_bytes(),
                    "store_bytes": dir_bytes(store_dir),
                }
            )
            print(
                f"wave {len(rows) - 1}: {first + len(ids)} agents, {done} completions in {seconds:.2f}s "
                f"({done / seconds:,.0f}/s), rss {rows[-1]['rss_bytes'] / 2**20:.1f} MiB",
                flush=True,
            )
        seconds = time.perf_counter() - started
    finally:
        await runtime.close()
    return rows, summarize("local", agents, turns, wave, counter.completions, seconds, rows)


def summarize(
    mode: str,
    agents: int,
    turns: int,
    wave: int,
    completions: int,
    seconds: float,
    rows: list[dict[str, object]],
) -> dict[str, object]:
    xs = [float(r["agents"]) for r in rows]  # type: ignore[arg-type]
    per_agent = slope(xs, [float(r["rss_bytes"]) for r in rows])  # type: ignore[arg-type]
    store = float(rows[-1]["store_bytes"]) / agents if rows else 0.0  # type: ignore[arg-type]
    idle = idle_agents_in(EIGHT_GB, per_agent)
    return {
        "mode": mode,
        "agents": agents,
        "turns": turns,
        "wave": wave,
        "completions": completions,
        "expected_completions": agents * turns * 2,
        "seconds": round(seconds, 3),
        "completions_per_s": round(completions / seconds, 1) if seconds else 0.0,
        "rss_slope_kib_per_agent": "" if per_agent is None else round(per_agent / 1024, 3),
        "idle_agents_in_8gb": "" if idle is None else idle,
        "store_bytes_per_agent": round(store, 1),
    }


def report(summary: dict[str, object]) -> None:
    print(
        f"\n{summary['mode']}: {summary['completions']} completions "
        f"(expected {summary['expected_completions']}) in {summary['seconds']}s = "
        f"{summary['completions_per_s']} completions/s"
    )
    print(
        f"  resident memory slope: {summary['rss_slope_kib_per_agent']} KiB per idle agent "
        f"-> {summary['idle_agents_in_8gb']} idle agents in 8 GB"
    )
    print(f"  store bytes on disk per agent: {summary['store_bytes_per_agent']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--wave", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=LocalConfig().batch_size)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--store-dir", type=Path, default=None, help="Default: a temp directory, removed after."
    )
    args = parser.parse_args(argv)
    if args.agents < 1 or args.turns < 1 or args.wave < 1:
        parser.error("--agents, --turns and --wave must be at least 1")
    store_dir = args.store_dir or Path(tempfile.mkdtemp(prefix="torpor-bench-local-"))
    tune_collector()  # this process runs the runtime, as `torpor processor` does its own
    try:
        rows, summary = asyncio.run(run(args.agents, args.turns, args.wave, store_dir, args.batch_size))
    finally:
        if args.store_dir is None:
            shutil.rmtree(store_dir, ignore_errors=True)
    write_csv(args.out / "local.csv", WAVE_COLUMNS, rows)
    write_csv(args.out / "local-summary.csv", SUMMARY_COLUMNS, [summary])
    plot_rss(
        args.out / "local-rss.png",
        [int(r["agents"]) for r in rows],  # type: ignore[call-overload]
        [int(r["rss_bytes"]) for r in rows],
        "local mode: RSS after each wave",
    )  # type: ignore[call-overload]
    report(summary)
    if summary["completions"] != summary["expected_completions"]:
        print("error: completions counted differ from agents * turns * 2", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
