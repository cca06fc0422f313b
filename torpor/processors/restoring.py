"""Stores as restore targets (`streams.restore.RestoreTarget`): what the processor, a
replay and the restore benchmark rebuild from the changelog.

`MemoryTarget` restores into a `MemoryStore` (a replay's scratch copy of the live
stores); `RocksTarget` into the `RocksStore` at a path, and a wipe removes its directory
(a store found behind the changelog is rebuilt from nothing).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Generic, TypeVar

from torpor.processors.store.kv import MemoryStore, RocksStore, StoreOffsets
from torpor.streams.task import Change, StoredOffsets

S = TypeVar("S", MemoryStore, RocksStore)


class _StoreTarget(Generic[S]):
    """Offsets and restored rows go to `store`, in one batch each."""

    store: S

    def offsets(self) -> StoredOffsets:
        found = self.store.offsets()
        return StoredOffsets(found.changelog_offset, found.input_offset)

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        self.store.apply(changes, StoreOffsets(offsets.changelog_offset, offsets.input_offset))


class MemoryTarget(_StoreTarget[MemoryStore]):
    """A restore target over a `MemoryStore`."""

    def __init__(self) -> None:
        self.store = MemoryStore()

    def wipe(self) -> None:
        self.store = MemoryStore()


class RocksTarget(_StoreTarget[RocksStore]):
    """A restore target over the `RocksStore` at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = RocksStore(path)

    def wipe(self) -> None:
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self.store = RocksStore(self.path)
