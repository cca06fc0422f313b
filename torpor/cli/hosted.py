"""Connectors hosted by `torpor processor --connector MODULE:NAME`, for development.

Each is the connector runtime of `torpor connector run` (`torpor.connectors.runtime`),
the same code, on an event loop of its own thread in the processor's process: it reads
the outbox read_committed, so it gets a dispatch only after the transaction that made it
commits, and it keeps its effect journal under `<store-dir>/connectors/<NAME>`. Its
consumer group is `<app>-<instance>-<NAME>`. It signs nothing: with a key ring, run
connectors as their own processes with their keys (`torpor connector run --signing-key`).

`busy()` is what `--until-idle` asks: a hosted connector counts as idle once it has run
nothing, read its outbox partitions to their end and committed, for `SETTLE_SECONDS`
(longer than a fetch takes to bring a just-committed dispatch). A hosted connector that
fails stops the processor (`failed`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from torpor.cli.connector import import_factory
from torpor.connectors.journal import EffectJournal
from torpor.connectors.runtime import ConnectorRuntime
from torpor.streams.config import Settings

if TYPE_CHECKING:
    from torpor.streams.tracing import Tracing

SETTLE_SECONDS: Final = 1.5
JOIN_SECONDS: Final = 30.0

log = logging.getLogger(__name__)


class HostedConnectors:
    """The connectors of `--connector`, each on its own thread (module docstring)."""

    def __init__(self, settings: Settings, targets: tuple[str, ...], *, app: str, instance: str,
                 store_dir: Path, tracing: Tracing | None = None) -> None:
        self._stop = threading.Event()
        self.failed: list[str] = []
        self.runtimes: list[ConnectorRuntime] = []
        self._threads: list[threading.Thread] = []
        for target in targets:
            name = target.rpartition(":")[2]
            journal = EffectJournal(store_dir / "connectors" / name)
            runtime = ConnectorRuntime(settings, import_factory(target), group=f"{app}-{instance}-{name}",
                                       journal=journal, tracing=tracing)
            self.runtimes.append(runtime)
            self._threads.append(threading.Thread(target=self._serve, args=(name, runtime),
                                                  name=f"torpor-connector-{name}", daemon=True))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _serve(self, name: str, runtime: ConnectorRuntime) -> None:
        try:
            asyncio.run(runtime.run(self._stop.is_set))
        except Exception as error:  # the processor stops on it: a tool must not die silently
            log.error("hosted connector %s failed: %s: %s", name, type(error).__name__, error)
            self.failed.append(f"{name}: {type(error).__name__}: {error}")

    def busy(self) -> bool:
        now = time.monotonic()
        return any(r.idle_since is None or now - r.idle_since < SETTLE_SECONDS for r in self.runtimes)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_SECONDS)
