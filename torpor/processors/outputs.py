"""Turning what `step` decided into Kafka records: topic, partition, key, value bytes.

Contract. `OutputWriter.step_records(output, originals)` maps one `StepOutput` to the
`OutputRecord`s the open transaction must carry, every value encoded by the codec:

    dispatches  -> outbox     keyed by thread id
    loopbacks   -> inputs     keyed by thread id, to the explicit partition murmur2 picks
                              (DESIGN 3: every producer agrees on a thread's partition)
    events      -> events     keyed by thread id
    receipts    -> receipts   keyed by thread id
    parked      -> parked     the input's original bytes, the reason in headers

Store changes are not here: the loop mirrors them to the changelog itself. Completion
requests are not records: they go to the model stage after the commit.

`poison_records(record, error)` handles a record `inputs` cannot decode: its original
bytes go to `parked` (headers say why and where it came from) with a `parked` receipt,
so the partition goes on and nothing is dropped silently (DESIGN 2.6). The receipt's
ids derive from the record's position, the only identity an undecodable record has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from torpor.processors.fold.receipts import RUNTIME_BUILD
from torpor.processors.fold.state import GENESIS_HEAD
from torpor.processors.step import StepOutput
from torpor.schemas.codec import Codec
from torpor.schemas.errors import DecodeError
from torpor.schemas.ids import derive_id
from torpor.schemas.records import PARKED, UNSIGNED, Receipt
from torpor.schemas.signer import Signer
from torpor.streams.partitioner import partition_for
from torpor.streams.task import InputRecord, OutputRecord
from torpor.streams.topics import TopicNames

# Headers on a `parked` record: why it was parked and where it was read from.
REASON_HEADER: Final = "torpor.reason"
SOURCE_HEADER: Final = "torpor.source"
# A reason is for an operator's eyes; a decoder's message can quote a whole schema.
_MAX_REASON: Final = 1000


@dataclass(frozen=True, slots=True)
class OutputWriter:
    """Encodes a partition's step outputs for the topics of `topics`."""

    topics: TopicNames
    inputs_partitions: int
    codec: Codec
    signer: Signer | None = None  # the processor's key: loopbacks are signed (processors.verify)

    def step_records(self, output: StepOutput, originals: Mapping[int, InputRecord]) -> list[OutputRecord]:
        """The records of `output`, in topic order (atomic in one transaction, so order is free)."""
        t, encode = self.topics, self.codec.encode
        records = [OutputRecord(t.outbox, _key(d.thread_id), encode(t.outbox, d)) for d in output.dispatches]
        for loopback in output.loopbacks:
            if self.signer is not None:
                loopback = self.signer.sign(loopback)
            key = _key(loopback.thread_id)
            partition = partition_for(key, self.inputs_partitions)
            records.append(OutputRecord(t.inputs, key, encode(t.inputs, loopback), partition=partition))
        records.extend(OutputRecord(t.events, _key(e.thread_id), encode(t.events, e)) for e in output.events)
        records.extend(
            OutputRecord(t.receipts, _key(r.thread_id), encode(t.receipts, r)) for r in output.receipts
        )
        for parked in output.parked:
            offset = parked.record.offset
            original = originals.get(offset) if offset is not None else None
            value = original.value if original is not None else encode(t.inputs, parked.record.input)
            records.append(OutputRecord(
                t.parked, _key(parked.record.input.thread_id), value,
                headers=_park_headers(parked.reason, parked.record.partition, offset),
            ))
        return records

    def poison_records(self, record: InputRecord, error: DecodeError) -> list[OutputRecord]:
        """`record` could not be decoded: park its bytes and give it a `parked` receipt."""
        reason = str(error)[:_MAX_REASON]
        position = f"{record.topic}/{record.partition}/{record.offset}"
        thread_id = (record.key or b"").decode("utf-8", errors="replace")
        receipt = Receipt(
            receipt_id=derive_id(position, "receipt", PARKED),
            thread_id=thread_id,
            input_id=derive_id(position, "undecodable"),
            input_partition=record.partition,
            input_offset=record.offset,
            created_at=record.timestamp,  # the broker's time: the same on every replay
            disposition=PARKED,
            reason=reason,
            history_before=GENESIS_HEAD,
            history_after=GENESIS_HEAD,
            thread_version=0,
            tool_request_ids=(),
            authority_snapshot=None,
            turn_commit=False,
            provenance=UNSIGNED,
            retry_count=0,
            runtime_build=RUNTIME_BUILD,
        )
        t = self.topics
        return [
            OutputRecord(t.parked, record.key, record.value,
                         headers=_park_headers(reason, record.partition, record.offset)),
            OutputRecord(t.receipts, record.key, self.codec.encode(t.receipts, receipt)),
        ]


def _key(thread_id: str) -> bytes:
    return thread_id.encode("utf-8")


def _park_headers(reason: str, partition: int | None, offset: int | None) -> tuple[tuple[str, bytes], ...]:
    where = f"inputs/{'?' if partition is None else partition}/{'?' if offset is None else offset}"
    return ((REASON_HEADER, reason.encode("utf-8")), (SOURCE_HEADER, where.encode("utf-8")))
