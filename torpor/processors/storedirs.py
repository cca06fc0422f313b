"""Where a processor keeps its RocksDB stores under its `--store-dir`.

One process keeps a directory per partition it owns, `partition-N`. With
`torpor processor --workers N` each worker has its own `--store-dir`, `w<k>` under the
command's, and keeps its `partition-N` there (`torpor.cli.workers`). Every reader of a
store directory (the processor, local mode, replay, the supervisor's warning about stores
a run will not use) finds them through here, so the layout is written down once.
"""

from __future__ import annotations

from pathlib import Path

_PARTITION = "partition-"
_WORKER = "w"


def partition_dir(store_dir: Path, partition: int) -> Path:
    """The store of `partition` under `store_dir`."""
    return store_dir / f"{_PARTITION}{partition}"


def worker_dir(store_dir: Path, index: int) -> Path:
    """The `--store-dir` of worker `index` under the command's `store_dir`."""
    return store_dir / f"{_WORKER}{index}"


def partition_dirs(store_dir: Path) -> dict[int, Path]:
    """The partition stores directly under `store_dir`, by partition, in partition order."""
    return dict(sorted(_numbered(store_dir, _PARTITION).items()))


def worker_dirs(store_dir: Path) -> dict[int, Path]:
    """The workers' directories under `store_dir`, by worker index, in index order."""
    return dict(sorted(_numbered(store_dir, _WORKER).items()))


def _numbered(store_dir: Path, prefix: str) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for path in store_dir.glob(f"{prefix}*"):
        suffix = path.name.removeprefix(prefix)
        # The names this module makes: ASCII digits, no leading zero (`w01` is not `w1`'s).
        if suffix.isascii() and suffix.isdigit() and suffix == str(int(suffix)) and path.is_dir():
            found[int(suffix)] = path
    return found
