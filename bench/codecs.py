"""`python -m bench.codecs`: microseconds to write and read the bench workload's records.

Contract. Builds one record of each kind the Kafka workload sends most (a model turn's
history entry, a live delta event, a history event, a receipt, a completion input),
shaped as the workload's (twelve 94-character chunks of text, a `run_command` call), and
times `Codec.encode` and `Codec.decode` on each (`--times` of each, the best of
`--repeat` rounds), and the direct writer and reader under them. Says whether the
compiled core is in use (`torpor.native`): the figures differ by ~2.5x between the
builds. Prints one table; writes nothing. Tests never assert timings: this is where
the codec's speed is measured (bench/README.md, stop 30).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.workload import ARGUMENTS, CHUNKS, TOOL
from torpor import native
from torpor.schemas import records as r
from torpor.schemas.codec import Codec

NOW_MS = 1_765_000_000_000


def workload_records() -> dict[str, object]:
    """One record of each kind, named, shaped as the bench workload's."""
    text = "".join(CHUNKS)
    thread_id = "agent-000123"
    capability = r.Capability(tenant="default", tools=(TOOL,), scopes=(), expires_at=None)
    entry = r.HistoryEntry(
        seq=41, created_at=NOW_MS, input_id="0193a6f4-7b1c-7d2e-9f00-1a2b3c4d5e6f",
        body=r.AssistantEntry(content=(r.TextBlock(text),),
                              tool_calls=(r.ToolCall("call_" + "b" * 24, TOOL, ARGUMENTS),),
                              model="scripted", usage=r.Usage(0, 0, 0)))
    return {
        "HistoryEntry (a model turn)": entry,
        "ThreadEvent (a live delta)": r.ThreadEvent(
            event_id="0193a6f4-7b1c-7d2e-9f00-" + "c" * 12, thread_id=thread_id, created_at=NOW_MS,
            kind="delta", ephemeral=True, seq=None, entry=None, text=text[:376], data=None),
        "ThreadEvent (history)": r.ThreadEvent(
            event_id="0193a6f4-7b1c-7d2e-9f00-" + "d" * 12, thread_id=thread_id, created_at=NOW_MS,
            kind="entry", ephemeral=False, seq=41, entry=entry, text=None, data=None),
        "Receipt": r.Receipt(
            receipt_id="0193a6f4-7b1c-7d2e-9f00-" + "e" * 12, thread_id=thread_id,
            input_id="0193a6f4-7b1c-7d2e-9f00-1a2b3c4d5e6f", input_partition=3, input_offset=123_456,
            created_at=NOW_MS, disposition=r.APPLIED, reason=None, history_before="a" * 64,
            history_after="f" * 64, thread_version=42, tool_request_ids=("req_" + "g" * 28,),
            authority_snapshot=capability, turn_commit=True, provenance=r.UNSIGNED, retry_count=0,
            runtime_build="torpor"),
        "Input (a completion)": r.Input(
            message_id="0193a6f4-7b1c-7d2e-9f00-" + "h" * 12, thread_id=thread_id, created_at=NOW_MS,
            source="processor", expires_at=None, key_id=None, signature=None,
            body=r.Completion(request_id="req_" + "g" * 28, content=(r.TextBlock(text),), tool_calls=(),
                              usage=r.Usage(0, 0, 0), model="scripted", error=None)),
    }


def best_us(call: Callable[[], object], times: int, repeat: int) -> float:
    """The fastest of `repeat` rounds of `times` calls, in microseconds a call."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(times):
            call()
        best = min(best, time.perf_counter() - started)
    return best / times * 1e6


def measure(codec: Codec, record: object, times: int, repeat: int) -> tuple[int, list[float]]:
    """The record's framed size, and us to encode, decode, write and read it."""
    framed = codec.encode("bench", record)
    cls = type(record)
    found = codec._class(cls)  # the direct writer and reader the codec holds
    writer, reader = found.direct, found.reader
    assert writer is not None and reader is not None
    body = writer(record)
    assert codec.decode("bench", framed, cls) == record and reader(body, 0) == (record, len(body))
    calls: list[Callable[[], object]] = [lambda: codec.encode("bench", record),
                                         lambda: codec.decode("bench", framed, cls),
                                         lambda: writer(record), lambda: reader(body, 0)]
    return len(framed), [best_us(call, times, repeat) for call in calls]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--times", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    codec = Codec(None)
    print(f"compiled core: {native.status()}")
    print("| record | bytes | encode us | decode us | writer us | reader us |")
    print("|---|---|---|---|---|---|")
    for name, record in workload_records().items():
        size, figures = measure(codec, record, args.times, args.repeat)
        print(f"| {name} | {size} | " + " | ".join(f"{f:.2f}" for f in figures) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
