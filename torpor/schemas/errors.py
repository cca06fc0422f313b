"""The root of Torpor's exception tree, and the errors of the wire contract.

Every exception Torpor raises descends from `TorporError`. Each package adds an
`errors.py` of its own, classified by what the caller must do::

    TorporError
    ├── ConfigError              refuse to start: a setting is missing or wrong
    ├── ContractError            bytes or records that break the wire contract
    │   ├── DecodeError          undecodable record (names topic, partition, offset)
    │   ├── SchemaMismatchError  a Python record and its .avsc disagree
    │   ├── JsonTextError        untrusted text that is not acceptable JSON (also a ValueError)
    │   ├── InvalidSchemaError   a tool's JSON Schema that cannot be registered (also a ValueError)
    │   └── SchemaViolation      a value that does not satisfy its JSON Schema (also a ValueError)
    ├── RetriableError           retry the call within its deadline
    ├── CheckpointAbortedError   abort the transaction, drop the overlay, seek back
    ├── FencedError              another instance owns the transactional id: exit
    └── StoreCorruptedError      wipe the partition's store and restore it

Bad *input* is never an exception that escapes the processor: it becomes a receipt.
"""

from __future__ import annotations


class TorporError(Exception):
    """Root of every error Torpor raises on purpose."""


class ConfigError(TorporError):
    """A setting is missing or invalid. Refuse to start and fix the configuration."""


class ContractError(TorporError):
    """Bytes or a record do not satisfy the wire contract in `schemas/`."""


class DecodeError(ContractError):
    """A record could not be decoded.

    The message names where the record came from (topic, partition, offset, when known)
    and the cause, so an operator can find the record and the producer that wrote it.
    """

    def __init__(
        self,
        cause: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.cause = cause
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = f"topic={topic or '?'} partition={'?' if partition is None else partition} " + (
            f"offset={'?' if offset is None else offset}"
        )
        super().__init__(f"cannot decode record at {where}: {cause}")


class SchemaMismatchError(ContractError):
    """A Python record class and the Avro schema of the same name disagree."""


class JsonTextError(ContractError, ValueError):
    """Untrusted text is not JSON, or nests deeper than the limit. The message is the short
    reason (`not JSON: ...`, `nested deeper than 64 levels`), fit to show a model."""


class InvalidSchemaError(ContractError, ValueError):
    """A JSON Schema text cannot be used: not JSON, not a schema, or outside Torpor's limits."""


class SchemaViolation(ContractError, ValueError):
    """A value does not satisfy a JSON Schema (or could not be checked within the limits)."""


class RetriableError(TorporError):
    """A transient failure: retry the same call while its deadline allows."""


class CheckpointAbortedError(TorporError):
    """The open transaction cannot commit: abort it, drop the overlay and seek back."""


class FencedError(TorporError):
    """Another instance has taken over this transactional id. Exit; do not retry."""


class StoreCorruptedError(TorporError):
    """The local store disagrees with the changelog. Wipe it, then restore from the changelog."""
