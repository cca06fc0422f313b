"""What the benchmarks share: resident memory, disk usage, the least-squares slope, CSV, plot.

Contract. `rss_bytes(pid)` is the resident set size of a process (psutil);
`cpu_seconds(pid)` is its user + system CPU time so far (not its children's);
`dir_bytes(path)` sums the sizes of the files under a directory; `slope(xs, ys)` is the
least-squares slope (None with fewer than two distinct x); `write_csv` writes rows of
dicts with a fixed column order; `plot_rss` writes a PNG of resident memory against
agents (matplotlib, Agg backend, so no display is needed). `scraped_cache_bytes(urls)`
sums what `torpor_cache_bytes` says on each `/metrics` page.
"""

from __future__ import annotations

import csv
import os
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import psutil
from prometheus_client.parser import text_string_to_metric_families

EIGHT_GB: Final = 8 * 1024**3


def _tree(pid: int | None, descendants: bool) -> list[psutil.Process]:
    """The process, and with `descendants` its living children's children too (`--workers`)."""
    process = psutil.Process(pid or os.getpid())
    return [process, *process.children(recursive=True)] if descendants else [process]


def rss_bytes(pid: int | None = None, descendants: bool = False) -> int:
    return sum(int(p.memory_info().rss) for p in _tree(pid, descendants))


def cpu_seconds(pid: int | None = None, descendants: bool = False) -> float:
    if pid is None and not descendants:
        # This process: the kernel's clock in nanoseconds (every thread, librdkafka's too).
        # /proc counts clock ticks (10 ms), and a small run's pass-through took less than one:
        # its CPU read 0.
        return time.process_time()
    return sum(float(t.user + t.system) for t in (p.cpu_times() for p in _tree(pid, descendants)))


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except FileNotFoundError:
                continue  # RocksDB compaction removed it while we walked
    return total


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mean_x) ** 2 for x in xs)
    return num / den


def idle_agents_in(budget_bytes: int, bytes_per_agent: float | None) -> int | None:
    if bytes_per_agent is None or bytes_per_agent <= 0:
        return None  # a flat or falling slope says nothing about a limit
    return int(budget_bytes / bytes_per_agent)


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row[c] for c in columns})


def plot_rss(path: Path, agents: Sequence[int], rss: Sequence[int], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(list(agents), [r / 2**20 for r in rss], marker="o")
    axes.set_xlabel("idle agents")
    axes.set_ylabel("resident memory (MiB)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def scraped_cache_bytes(urls: Sequence[str], timeout: float = 10.0) -> int:
    """What the bounded store caches of the processes serving the `/metrics` pages at
    `urls` hold together (`torpor_cache_bytes`, every cache)."""
    total = 0
    for url in urls:
        with urllib.request.urlopen(url, timeout=timeout) as page:
            text = page.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "torpor_cache_bytes":
                total += sum(int(sample.value) for sample in family.samples)
    return total
