"""The figures of the issue-7 workload, as both modes (`bench.local`, `bench.kafka`) report them.

Contract. `wave_row(...)` is one row of `<mode>.csv` (columns `WAVE_COLUMNS`), taken
after a wave went idle. `summarize(...)` computes the figures both modes share
(`RUN_COLUMNS` and `MEASURED_COLUMNS`: the rate, the resident-memory slope per idle
agent, the same after warm-up and less the bounded caches' fill, store bytes per agent;
Kafka mode adds its own columns to the dict) and
`report(summary)` prints them. `write(...)` writes `<mode>.csv`, `<mode>-summary.csv`
and `<mode>-rss.png` into the output directory. `exit_status(summary)` is 0, or 1 (said
on stderr) when the completions counted differ from agents * turns * 2: a benchmark that
lost work must not report a rate.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from bench.measure import EIGHT_GB, idle_agents_in, plot_rss, slope, write_csv

WaveRow = dict[str, float]
"""One row of `<mode>.csv`: every figure of a wave is a number."""

WAVE_COLUMNS: Final = (
    "wave",
    "agents",
    "completions",
    "wave_seconds",
    "completions_per_s",
    "rss_bytes",
    "cache_bytes",
    "store_bytes",
)
RUN_COLUMNS: Final = ("mode", "agents", "turns", "wave")
"""What was run: the summary's first columns."""
MEASURED_COLUMNS: Final = (
    "completions",
    "expected_completions",
    "seconds",
    "completions_per_s",
    "cpu_seconds",
    "cpu_us_per_completion",
    "rss_slope_kib_per_agent",
    "rss_net_slope_kib_per_agent",
    "idle_agents_in_8gb",
    "store_bytes_per_agent",
)
"""What `summarize` measured, in the summary after `RUN_COLUMNS` (and any a mode adds there)."""


def wave_row(
    wave: int, agents: int, completions: int, seconds: float, rss: int, caches: int, store: int
) -> WaveRow:
    """The row of wave `wave`: `agents` so far, its `completions` in `seconds`, `rss` bytes
    (of which `caches`: what the bounded store caches held, `kv.cache_use`) and `store`
    bytes on disk."""
    return {
        "wave": wave,
        "agents": agents,
        "completions": completions,
        "wave_seconds": round(seconds, 3),
        "completions_per_s": round(completions / seconds, 1),
        "rss_bytes": rss,
        "cache_bytes": caches,
        "store_bytes": store,
    }


def summarize(
    mode: str,
    agents: int,
    turns: int,
    wave: int,
    completions: int,
    seconds: float,
    rows: Sequence[WaveRow],
    cpu_seconds: float,
) -> dict[str, object]:
    """The summary of a run of `rows` (`RUN_COLUMNS` and `MEASURED_COLUMNS`).

    `cpu_seconds`: user + system CPU time of the processes that ran Torpor over the same
    window as `seconds` (not the broker's): on a shared machine the wall-clock rate moves
    with the load, the CPU per completion much less.

    Two memory slopes (least squares against the agents so far). `rss_slope`: of the
    resident memory over every wave. `rss_net_slope`: after warm-up, what grows with the
    agents; that is, of the resident memory less what the bounded caches held
    (`cache_bytes`), over the second half of the waves (every wave when there are fewer
    than four). The caches are bounded by `[memory]`, a fixed cost however many agents
    (the block cache and the row caches fill up to their bounds and stay there, the
    memtables fall back at each flush), and the default 64 MiB block cache was still
    filling at 10,000 agents, so the first slope mixes that fill in. The second half: in
    the first waves the history cache fills too (it counts entries, not bytes) and the
    Python heap and librdkafka's buffers grow to their working size (a 10,000-agent Kafka
    run: ~300 MiB over waves 0-4 besides the caches, then flat)."""
    xs = [float(r["agents"]) for r in rows]
    per_agent = slope(xs, [float(r["rss_bytes"]) for r in rows])
    warm = len(rows) // 2 if len(rows) >= 4 else 0  # the first wave after warm-up
    net = slope(xs[warm:], [float(r["rss_bytes"] - r["cache_bytes"]) for r in rows[warm:]])
    store = float(rows[-1]["store_bytes"]) / agents if rows else 0.0
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
        "cpu_seconds": round(cpu_seconds, 3),
        "cpu_us_per_completion": round(cpu_seconds / completions * 1e6, 1) if completions else "",
        "rss_slope_kib_per_agent": "" if per_agent is None else round(per_agent / 1024, 3),
        "rss_net_slope_kib_per_agent": "" if net is None else round(net / 1024, 3),
        "idle_agents_in_8gb": "" if idle is None else idle,
        "store_bytes_per_agent": round(store, 1),
    }


def report(summary: Mapping[str, object]) -> None:
    """Print the figures `summarize` computed."""
    print(
        f"\n{summary['mode']}: {summary['completions']} completions "
        f"(expected {summary['expected_completions']}) in {summary['seconds']}s = "
        f"{summary['completions_per_s']} completions/s"
    )
    print(f"  CPU: {summary['cpu_seconds']}s = {summary['cpu_us_per_completion']} us per completion")
    print(
        f"  resident memory slope: {summary['rss_slope_kib_per_agent']} KiB per idle agent "
        f"-> {summary['idle_agents_in_8gb']} idle agents in 8 GB"
    )
    net = summary["rss_net_slope_kib_per_agent"]
    print(f"  after warm-up (the second half of the waves, or all under four), less the bounded"
          f" caches' fill: {net} KiB per idle agent")
    print(f"  store bytes on disk per agent: {summary['store_bytes_per_agent']}")


def write(
    out: Path,
    mode: str,
    summary_columns: Sequence[str],
    rows: Sequence[WaveRow],
    summary: Mapping[str, object],
    plot_title: str,
) -> None:
    """Write `<mode>.csv`, `<mode>-summary.csv` (`summary_columns`) and `<mode>-rss.png` into `out`."""
    write_csv(out / f"{mode}.csv", WAVE_COLUMNS, rows)
    write_csv(out / f"{mode}-summary.csv", summary_columns, [summary])
    plot_rss(
        out / f"{mode}-rss.png",
        [int(r["agents"]) for r in rows],
        [int(r["rss_bytes"]) for r in rows],
        plot_title,
    )


def exit_status(summary: Mapping[str, object]) -> int:
    """0 if every completion of the workload was counted, else 1 after saying so on stderr."""
    if summary["completions"] != summary["expected_completions"]:
        print("error: completions counted differ from agents * turns * 2", file=sys.stderr)
        return 1
    return 0
