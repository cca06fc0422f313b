"""`python -m bench.infinity --binary PATH`: Infinity's own `agent_scale`, measured as Torpor's modes.

Contract. Runs `PATH` (the `agent_scale` example of the crate `infinity-agent-core`
0.2.0, built by `bench/build-infinity`) with the environment `AGENTS`, `TURNS` and
`WAVE`, and measures it the way `bench.local` measures local mode: completions over the
run's own wall time, user + system CPU of its process per completion (`getrusage` of
the child), the resident-memory slope per idle agent from the `agents,rss_bytes` rows it
prints after each wave. Writes `infinity.csv` and `infinity-summary.csv` into `--out`
(the same columns as the other modes; no caches, no store) and prints the summary. Exit
1 if it fails or if the completions it reports differ from agents * turns * 2.

Why here: issue 18's targets are fractions of this benchmark on the same machine, and
the machine's speed moves by half from one day to the next (the same binary ran 11,111
completions/s on 4 Dec and 7,080/s on 6 Dec), so a Torpor figure means something only
beside Infinity's, in the same run (`bench.all --infinity PATH`).

What the example does (its source, `examples/agent_scale.rs`): one tokio thread,
in-memory stores, a scripted model and an in-process `run_command` tool, the same turns
as `bench.workload`; it waits for each turn by polling every 2 ms, and after each wave it
sleeps 100 ms, drains its lifecycle events and calls `malloc_trim` before printing the
row. The time measured here is the whole process's, so it holds those pauses (~4% of a
2,000 x 20 run), as its own printed time does (the figure issue 18 quoted), and as
`bench.local`'s holds its own sampling after each wave (a `gc.collect()`). Its summary
line on stderr says `N agents x T turns (C completions) in S.Ss; ...`: C is the count it
waited for, not one it observed; what guards against lost work is its own `assert` on a
stalled turn, which makes it exit non-zero.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from bench import figures

SUMMARY_COLUMNS: Final = (*figures.RUN_COLUMNS, *figures.MEASURED_COLUMNS)
SUMMARY_LINE: Final = re.compile(r"\((\d+) completions\) in ([0-9.]+)s")
ROW: Final = re.compile(r"^(\d+),(\d+)$")


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children that have ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(binary: Path, agents: int, turns: int, wave: int) -> tuple[list[figures.WaveRow], dict[str, object]]:
    """Run the example once; its rows (one per wave, the agents-0 row left out) and summary."""
    env = {**os.environ, "AGENTS": str(agents), "TURNS": str(turns), "WAVE": str(wave)}
    rows: list[figures.WaveRow] = []
    cpu_before = children_cpu_seconds()
    started = last = time.perf_counter()
    # Its stderr to a file, not a pipe read after stdout ends: a long panic would fill the pipe.
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
        [str(binary)], env=env, stdout=subprocess.PIPE, stderr=errors, text=True
    ) as process:
        assert process.stdout is not None
        done_before = 0
        for line in process.stdout:
            match = ROW.match(line.strip())
            if match is None:
                continue  # the header
            if int(match.group(1)) == 0:
                last = time.perf_counter()  # the row before the first wave: start-up ends here
                continue
            now, so_far = time.perf_counter(), int(match.group(1))
            done = (so_far - done_before) * turns * 2
            rows.append(figures.wave_row(len(rows), so_far, done, now - last, int(match.group(2)), 0, 0))
            print(f"wave {len(rows) - 1}: {so_far} agents, {done} completions in {now - last:.2f}s "
                  f"({done / (now - last):,.0f}/s), rss {int(match.group(2)) / 2**20:.1f} MiB", flush=True)
            done_before, last = so_far, now
        process.wait()
        errors.seek(0)
        stderr = errors.read()
    seconds, cpu = time.perf_counter() - started, children_cpu_seconds() - cpu_before
    if process.returncode != 0:
        raise RuntimeError(f"{binary} exited with {process.returncode}: {stderr.strip()[-500:]}")
    summary_line = SUMMARY_LINE.search(stderr)
    if summary_line is None:
        raise RuntimeError(f"{binary} printed no summary line on stderr: {stderr.strip()[-500:]}")
    completions = int(summary_line.group(1))
    return rows, figures.summarize("infinity", agents, turns, wave, completions, seconds, rows, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--binary", type=Path, required=True,
                        help="Infinity's agent_scale example (bench/build-infinity prints its path).")
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--wave", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if args.agents < 1 or args.turns < 1 or args.wave < 1:
        parser.error("--agents, --turns and --wave must be at least 1")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"{args.binary} is not an executable (build it with bench/build-infinity)")
    try:
        rows, summary = run(args.binary, args.agents, args.turns, args.wave)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    figures.write(args.out, "infinity", SUMMARY_COLUMNS, rows, summary,
                  "Infinity agent_scale: RSS after each wave")
    figures.report(summary)
    return figures.exit_status(summary)


if __name__ == "__main__":
    raise SystemExit(main())
