"""`python -m bench.all`: local mode, Kafka mode and the raw pass-through in one run, one table.

Contract. Runs `bench.local`, then `bench.kafka` (which ends with `bench.passthrough` on
a copy of its inputs), each as its own process with the same `--agents`, `--turns` and
`--wave`, so both modes are measured in the same window on the same machine. Reads back
their `<mode>-summary.csv` from `--out` and prints one table: completions/s, CPU per
completion (user + system of the processes that ran Torpor: local mode's one process;
Kafka mode's processor and connector, not the broker; the pass-through's own process),
the resident-memory slope per idle agent (and the same after warm-up, less the bounded
caches' fill: `bench.figures.summarize`), and Kafka's ratio to the pass-through; then
the machine (cores, load average before and after). The table is Markdown, ready for
README.md. `--modes local` (or `kafka`) runs one mode only. `--infinity PATH` first runs the
Infinity runtime's own benchmark (`bench.infinity`, the binary `bench/build-infinity`
builds) with the same workload, adds its row, and says what fraction of its
completions/s and what multiple of its CPU per completion each Torpor mode ran at: issue
18's targets are such fractions, and only a run side by side measures them (this
machine's speed moves by half between days). Exit 1 if a mode failed or lost work (its
own exit status).

The defaults (1,000 agents x 10 turns, waves of 500) finish in a few minutes on a busy
2-core machine; the published workload is `--agents 2000 --turns 20 --wave 500`.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from torpor.streams.config import TopicSettings

REPO: Final = Path(__file__).resolve().parents[1]
MODES: Final = ("local", "kafka")
REFERENCE: Final = "infinity"
HEADER: Final = ("run", "completions/s", "CPU us per completion", "RSS slope KiB per idle agent",
                 "after warm-up, less the caches", "Torpor / pass-through")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def read_summary(path: Path) -> dict[str, str]:
    with path.open() as handle:
        return next(csv.DictReader(handle))


def table_rows(summaries: Mapping[str, Mapping[str, str]]) -> list[tuple[str, ...]]:
    """One row per mode that ran, and the pass-through's after Kafka mode's."""
    rows: list[tuple[str, ...]] = []
    reference = summaries.get(REFERENCE)
    if reference is not None:
        rows.append(("Infinity agent_scale (Rust, 1 thread, in-memory)", reference["completions_per_s"],
                     reference["cpu_us_per_completion"], reference["rss_slope_kib_per_agent"], "", ""))
    local = summaries.get("local")
    if local is not None:
        rows.append(("local", local["completions_per_s"], local["cpu_us_per_completion"],
                     local["rss_slope_kib_per_agent"], local["rss_net_slope_kib_per_agent"], ""))
    kafka = summaries.get("kafka")
    if kafka is not None:
        rows.append(("kafka (exactly-once)", kafka["completions_per_s"], kafka["cpu_us_per_completion"],
                     kafka["rss_slope_kib_per_agent"], kafka["rss_net_slope_kib_per_agent"],
                     kafka["ratio_to_passthrough"]))
        rows.append(("raw EOS pass-through", kafka["passthrough_completions_per_s"],
                     kafka["passthrough_cpu_us_per_completion"], "", "", "1"))
    return rows


def against_reference(summaries: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Each Torpor mode's completions/s as a fraction of Infinity's, and its CPU per
    completion as a multiple of Infinity's (empty without an Infinity run)."""
    reference = summaries.get(REFERENCE)
    if reference is None:
        return []
    rate, cpu = float(reference["completions_per_s"]), float(reference["cpu_us_per_completion"])
    lines = []
    for mode in MODES:
        summary = summaries.get(mode)
        if summary is not None and rate > 0 and cpu > 0:
            fraction = float(summary["completions_per_s"]) / rate
            multiple = float(summary["cpu_us_per_completion"]) / cpu
            lines.append(f"{mode}: {fraction:.2f} of Infinity's completions/s, "
                         f"{multiple:.2f} times its CPU per completion")
    return lines


def markdown(rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def run_mode(mode: str, args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", f"bench.{mode}", "--agents", str(args.agents), "--turns",
               str(args.turns), "--wave", str(args.wave), "--out", str(args.out)]
    if mode == REFERENCE:
        command += ["--binary", str(args.infinity.resolve())]  # the child runs in REPO
    if mode == "kafka":
        command += ["--partitions", str(args.partitions)]
        if args.workers is not None:
            command += ["--workers", str(args.workers)]
        if args.bootstrap:
            command += ["--bootstrap", args.bootstrap]
    print(f"$ python -m bench.{mode} {' '.join(command[3:])}", flush=True)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=1_000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--wave", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=TopicSettings().partitions,
                        help="Kafka mode's input partitions. Default: the topics' default.")
    parser.add_argument("--workers", type=int, default=None,
                        help="Kafka mode's processor processes. Default: bench.kafka's (the processor's).")
    parser.add_argument("--bootstrap", default=None, help="Kafka mode's broker (see bench.kafka).")
    parser.add_argument("--modes", default=",".join(MODES), help="Comma-separated: local, kafka.")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--infinity", type=Path, default=None,
                        help="Infinity's agent_scale (bench/build-infinity), run first as the reference.")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes a comma-separated subset of {', '.join(MODES)}")
    if min(args.agents, args.turns, args.wave, args.partitions) < 1:
        parser.error("--agents, --turns, --wave and --partitions must be at least 1")
    load_before = load_average()
    if args.infinity is not None:
        modes.insert(0, REFERENCE)
    failed = [mode for mode in modes if run_mode(mode, args) != 0]
    summaries = {m: read_summary(args.out / f"{m}-summary.csv") for m in modes if m not in failed}
    print(f"\n{args.agents} agents x {args.turns} turns, waves of {args.wave} "
          f"({args.agents * args.turns * 2} completions per mode)\n")
    print(markdown(table_rows(summaries)))
    for line in against_reference(summaries):
        print(line)
    print(f"\nmachine: {os.cpu_count()} cores; load average (1, 5, 15 min) before {load_before}, "
          f"after {load_average()}")
    if failed:
        print(f"error: {', '.join(failed)} failed (see its output above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
