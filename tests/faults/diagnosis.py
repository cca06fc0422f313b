"""What a failed soak shows: each process's fate and the tail of its log.

`describe(runs)` takes (process, log path) pairs and returns one block per process: its
log file, whether it still runs or how it exited, and the last `TAIL_LINES` lines of its
log. librdkafka's debug lines (`%7|...`, present when the soak ran with
`librdkafka_debug`) and runs of one repeated line are left out, so the tail shows what
the process itself last said; the full log stays on disk under the soak's root.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Final

TAIL_LINES: Final = 25
# A tail reads at most this much of the end of a log (debug logs grow to hundreds of MB).
TAIL_BYTES: Final = 4_000_000
LINE_CHARS: Final = 300
_DIGITS: Final = re.compile(r"\d+")


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines of `path` said by the process, not by librdkafka's debug."""
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            start = max(0, log.tell() - TAIL_BYTES)
            log.seek(start)
            text = log.read().decode(errors="replace")
        if start > 0:
            text = text.partition("\n")[2]  # the first line is cut
    except OSError as error:
        return [f"(cannot read {path}: {error})"]
    kept: list[str] = []
    repeated = 0
    for line in text.splitlines():
        if line.startswith("%7|") or not line.strip():
            continue
        if kept and _same(kept[-1], line):
            repeated += 1
            continue
        if repeated:
            kept.append(f"    (and {repeated} more like it)")
            repeated = 0
        kept.append(line[:LINE_CHARS])
    if repeated:
        kept.append(f"    (and {repeated} more like it)")
    return kept[-lines:]


def _same(earlier: str, line: str) -> bool:
    """One message repeated: the lines differ in their numbers only (times, offsets, counts)."""
    return _DIGITS.sub("#", earlier[:LINE_CHARS]) == _DIGITS.sub("#", line[:LINE_CHARS])


def fate(process: subprocess.Popen[bytes]) -> str:
    code = process.poll()
    if code is None:
        return "running"
    return f"exited {code}" if code >= 0 else f"killed by signal {-code}"


def describe(runs: Iterable[tuple[subprocess.Popen[bytes], Path]]) -> str:
    """One block per process: log, fate, tail."""
    blocks = []
    for process, path in runs:
        lines = "\n".join(f"    | {line}" for line in tail(path)) or "    | (empty)"
        blocks.append(f"  {path.name} ({fate(process)}), {path}:\n{lines}")
    return "\n".join(blocks)
