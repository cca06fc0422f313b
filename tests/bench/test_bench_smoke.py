"""The benchmarks keep working: a tiny configuration of each, run as a user would run it.

Nothing here asserts a timing (the figures are for bench/README.md, not for CI). What
is checked: the command exits 0, its CSVs have the documented columns, every
completion of the workload was counted (agents * turns * 2), and the figures are sane
(positive rates, a resident memory that was sampled, bytes on disk).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from bench import codecs, figures, infinity, kafka, local
from bench.passthrough import apportion
from bench.workload import ARGUMENTS, CHUNKS, TOOL
from torpor.schemas.codec import default_codec
from torpor.schemas.records import AssistantEntry, HistoryEntry, TextBlock

REPO: Final = Path(__file__).resolve().parents[2]
AGENTS: Final = 20
TURNS: Final = 2


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def _run(module: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", module, "--agents", str(AGENTS), "--turns", str(TURNS), "--wave", "10",
            "--out", str(out), *extra]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _check_summary(summary: dict[str, str], columns: tuple[str, ...]) -> None:
    assert tuple(summary) == columns
    assert int(summary["completions"]) == AGENTS * TURNS * 2 == int(summary["expected_completions"])
    assert float(summary["completions_per_s"]) > 0
    assert float(summary["store_bytes_per_agent"]) > 0
    assert summary["rss_slope_kib_per_agent"] != ""  # two waves: a slope exists
    assert summary["rss_net_slope_kib_per_agent"] != ""


def _check_waves(rows: list[dict[str, str]], columns: tuple[str, ...]) -> None:
    assert tuple(rows[0]) == columns
    assert [int(r["agents"]) for r in rows] == [10, 20]
    assert sum(int(r["completions"]) for r in rows) == AGENTS * TURNS * 2
    assert all(int(r["rss_bytes"]) > 10 * 2**20 for r in rows)  # a Python process is never below 10 MiB
    # The caches were read, not the bounds: the memtables hold an arena block per store
    # from its first write, and what they hold is resident.
    assert all(0 < int(r["cache_bytes"]) < int(r["rss_bytes"]) for r in rows)
    assert int(rows[-1]["store_bytes"]) >= int(rows[0]["store_bytes"]) > 0


def test_local_benchmark_runs_the_workload_and_writes_its_csvs(tmp_path: Path) -> None:
    done = _run("bench.local", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _check_waves(_rows(tmp_path / "local.csv"), figures.WAVE_COLUMNS)
    summary = _rows(tmp_path / "local-summary.csv")[0]
    _check_summary(summary, local.SUMMARY_COLUMNS)
    assert float(summary["sampling_cpu_seconds"]) > 0  # the sampling was measured, to be left out
    assert (tmp_path / "local-rss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "completions/s" in done.stdout


def test_parked_benchmark_counts_exactly_the_threads_it_parked() -> None:
    args = [sys.executable, "-m", "bench.parked", "--threads", "200", "--turns", "2", "--park", "7"]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "threads 200, entries each 4, parked 29: partition_started" in done.stdout  # 0, 7, ..., 196


@pytest.mark.kafka
def test_kafka_benchmark_runs_the_workload_and_the_passthrough(kafka_bootstrap: str, tmp_path: Path) -> None:
    done = _run("bench.kafka", tmp_path, "--bootstrap", kafka_bootstrap, "--partitions", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    _check_waves(_rows(tmp_path / "kafka.csv"), figures.WAVE_COLUMNS)
    summary = _rows(tmp_path / "kafka-summary.csv")[0]
    _check_summary(summary, kafka.SUMMARY_COLUMNS)
    assert float(summary["changelog_bytes_per_agent"]) > 0
    assert float(summary["passthrough_completions_per_s"]) > 0
    assert float(summary["ratio_to_passthrough"]) > 0
    assert (tmp_path / "kafka-rss.png").exists()


def test_apportion_hands_out_every_output_once_and_evenly() -> None:
    outputs = {"a": [(1, 10)] * 7, "b": [(2, 20)] * 3}
    shares = apportion(outputs, 4)
    assert len(shares) == 4
    flat = [o for share in shares for o in share]
    assert sorted(flat) == sorted([("a", 1, 10)] * 7 + [("b", 2, 20)] * 3)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def _table_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("| ")]


def test_all_benchmark_prints_one_table_for_the_local_mode(tmp_path: Path) -> None:
    done = _run("bench.all", tmp_path, "--modes", "local")
    assert done.returncode == 0, done.stdout + done.stderr
    header, *rows = _table_lines(done.stdout)
    assert header.startswith("| run | completions/s | CPU us per completion")
    assert [row.split(" | ")[0] for row in rows] == ["| local"]
    assert float(rows[0].split(" | ")[2]) > 0  # CPU per completion was measured
    assert "load average" in done.stdout


@pytest.mark.kafka
def test_all_benchmark_prints_local_kafka_and_passthrough_in_one_table(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    done = _run("bench.all", tmp_path, "--bootstrap", kafka_bootstrap, "--partitions", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    _, *rows = _table_lines(done.stdout)
    cells = [row.strip("| ").split(" | ") for row in rows]
    assert [c[0] for c in cells] == ["local", "kafka (exactly-once)", "raw EOS pass-through"]
    assert all(float(c[1]) > 0 and float(c[2]) > 0 for c in cells), done.stdout
    assert cells[1][4] != "" and cells[0][4] != "", done.stdout  # the slope less the caches' fill
    assert float(cells[1][5]) > 0, done.stdout  # the ratio to the pass-through


AGENT_SCALE_OUTPUT: Final = """\
import os, sys
agents, turns, wave = (int(os.environ[k]) for k in ("AGENTS", "TURNS", "WAVE"))
done = int(os.environ.get("DONE", agents * turns * 2))
sum(i * i for i in range(300_000))  # some CPU time, for the figure to have a measure
print("agents,rss_bytes")
print("0,5000000", flush=True)
for launched in range(wave, agents + 1, wave):
    print(f"{launched},{5_000_000 + 100_000 * launched}", flush=True)
print(f"{agents} agents x {turns} turns ({done} completions) in 0.1s; rss 7.0 MiB, 9.9 KiB per agent",
      file=sys.stderr)
sys.exit(int(os.environ.get("STATUS", "0")))
"""


def _agent_scale_stand_in(tmp_path: Path) -> Path:
    """An executable that prints what Infinity's agent_scale example prints (its rows on
    stdout, its summary line on stderr), for bench.infinity's reading of them: the real
    binary needs a Rust build (bench/build-infinity) that CI does not run."""
    path = tmp_path / "agent_scale"
    path.write_text(f"#!{sys.executable}\n" + AGENT_SCALE_OUTPUT)
    path.chmod(0o755)
    return path


def test_infinity_benchmark_reads_the_rows_and_the_summary_of_agent_scale(tmp_path: Path) -> None:
    done = _run("bench.infinity", tmp_path, "--binary", str(_agent_scale_stand_in(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(tmp_path / "infinity.csv")
    assert [int(r["agents"]) for r in rows] == [10, 20]  # the row before the first wave left out
    assert [int(r["completions"]) for r in rows] == [10 * TURNS * 2] * 2
    summary = _rows(tmp_path / "infinity-summary.csv")[0]
    assert tuple(summary) == infinity.SUMMARY_COLUMNS
    assert int(summary["completions"]) == AGENTS * TURNS * 2
    assert float(summary["cpu_us_per_completion"]) > 0  # its own process's CPU, measured here
    assert float(summary["rss_slope_kib_per_agent"]) == pytest.approx(100_000 / 1024, rel=1e-3)


@pytest.mark.parametrize(("env", "said"), [({"DONE": "79"}, "completions counted differ"),
                                            ({"STATUS": "3"}, "exited with 3")])
def test_infinity_benchmark_fails_when_agent_scale_loses_work_or_fails(
    tmp_path: Path, env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    done = _run("bench.infinity", tmp_path, "--binary", str(_agent_scale_stand_in(tmp_path)))
    assert done.returncode == 1
    assert said in done.stderr


def test_all_benchmark_puts_torpor_beside_infinity_when_given_its_binary(tmp_path: Path) -> None:
    done = _run("bench.all", tmp_path, "--modes", "local", "--infinity", str(_agent_scale_stand_in(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    _, *rows = _table_lines(done.stdout)
    cells = [row.strip("| ").split(" | ") for row in rows]
    assert [c[0] for c in cells] == ["Infinity agent_scale (Rust, 1 thread, in-memory)", "local"]
    reference, local_row = cells
    fraction = float(local_row[1]) / float(reference[1])
    multiple = float(local_row[2]) / float(reference[2])
    assert f"local: {fraction:.2f} of Infinity's completions/s, {multiple:.2f} times its CPU per completion" \
        in done.stdout


@pytest.mark.parametrize("model", ["router", "bench"])
def test_stage_benchmark_serves_every_request_of_every_round(model: str) -> None:
    args = [sys.executable, "-m", "bench.stage", "--agents", "5", "--turns", "1", "--repeat", "2",
            "--model", model]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"stage ({model}): 10 completions" in done.stdout


def test_codecs_benchmark_times_every_record_it_round_trips() -> None:
    args = [sys.executable, "-m", "bench.codecs", "--times", "10", "--repeat", "1"]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines()
            if line.startswith("| ") and "---" not in line]
    assert [row[0] for row in rows[1:]] == [f"| {name}" for name in codecs.workload_records()]
    for row in rows[1:]:  # the framed size, then four positive timings
        assert int(row[1]) > 0 and all(float(cell.strip(" |")) > 0 for cell in row[2:])


def test_codecs_benchmark_records_are_the_workload_s_and_round_trip() -> None:
    codec = default_codec()
    found = codecs.workload_records()
    for record in found.values():
        assert codec.decode("bench", codec.encode("bench", record), type(record)) == record
    entry = found["HistoryEntry (a model turn)"]
    assert isinstance(entry, HistoryEntry) and isinstance(entry.body, AssistantEntry)
    assert entry.body.content == (TextBlock("".join(CHUNKS)),)  # the scripted answer, whole
    assert [(c.name, c.arguments) for c in entry.body.tool_calls] == [(TOOL, ARGUMENTS)]
