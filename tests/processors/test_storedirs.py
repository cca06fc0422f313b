"""The store directory layout (`torpor.processors.storedirs`): what it makes, it finds, and nothing else."""

from __future__ import annotations

from pathlib import Path

from torpor.processors.storedirs import partition_dir, partition_dirs, worker_dir, worker_dirs


def test_what_it_names_it_finds_in_number_order(tmp_path: Path) -> None:
    for index in (10, 2, 0):
        worker_dir(tmp_path, index).mkdir()
    for partition in (11, 3):
        partition_dir(tmp_path, partition).mkdir()
    assert worker_dirs(tmp_path) == {0: tmp_path / "w0", 2: tmp_path / "w2", 10: tmp_path / "w10"}
    assert list(partition_dirs(tmp_path)) == [3, 11]
    assert partition_dirs(tmp_path)[3] == tmp_path / "partition-3"


def test_names_it_does_not_make_are_not_stores(tmp_path: Path) -> None:
    # A leading zero would make `w01` a second `w1`; other digits, files and other words are
    # someone else's: none of them may be opened or reported as a store.
    for name in ("w01", "w00", "w\u00b2", "w\u0661", "wx", "w", "workers", "partition-01", "partition-",
                 "partition-\u00b2", "partition-1a"):
        (tmp_path / name).mkdir()
    (tmp_path / "w4").write_text("a file, not a directory")
    (tmp_path / "partition-5").write_text("a file, not a directory")
    (tmp_path / "w1").mkdir()
    (tmp_path / "partition-0").mkdir()
    assert worker_dirs(tmp_path) == {1: tmp_path / "w1"}
    assert partition_dirs(tmp_path) == {0: tmp_path / "partition-0"}


def test_an_empty_or_missing_directory_holds_nothing(tmp_path: Path) -> None:
    assert worker_dirs(tmp_path) == {} and partition_dirs(tmp_path) == {}
    assert worker_dirs(tmp_path / "absent") == {} and partition_dirs(tmp_path / "absent") == {}
