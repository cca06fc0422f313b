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

from bench import figures, kafka, local
from bench.passthrough import apportion

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
    _check_summary(_rows(tmp_path / "local-summary.csv")[0], local.SUMMARY_COLUMNS)
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


@pytest.mark.parametrize("model", ["router", "bench"])
def test_stage_benchmark_serves_every_request_of_every_round(model: str) -> None:
    args = [sys.executable, "-m", "bench.stage", "--agents", "5", "--turns", "1", "--repeat", "2",
            "--model", model]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"stage ({model}): 10 completions" in done.stdout
