"""Settings of the Kafka plumbing, their loader, and the only place librdkafka dicts are built.

Contract:

- `Settings` is frozen and valid by construction: each section validates itself in
  `__post_init__` and raises `ConfigError` with a message that names the setting, the
  `TORPOR_*` variable and the config-file key that set it, and what a valid value looks like.
- `load_settings(env, file)` is pure apart from reading `file`: it never reads
  `os.environ`. The command line alone does, and passes the mapping in.
- `producer_config`, `consumer_config` and `admin_config` are the only functions in
  Torpor that build librdkafka configuration. The keys exactly-once depends on
  (`MANAGED_KEYS`) are set here and cannot be overridden from the config file.
- Secrets never appear in a repr: the SASL password is a `Secret`, librdkafka overrides
  (which may hold `ssl.key.password`) are left out of the repr, and a Schema Registry URL
  with credentials in it is shown redacted.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Final, TypeVar
from urllib.parse import urlsplit

from torpor.schemas.errors import ConfigError

# The value types librdkafka accepts for a property (AdminClient types it exactly so).
ClientConfig = dict[str, str | int | float | bool]

# Legal characters of a Kafka topic name (and a sensible client id).
_NAME_CHARS: Final = re.compile(r"[A-Za-z0-9._-]+")
# Kafka refuses topic names longer than 249 characters; the longest suffix we append is 9.
_MAX_TOPIC_NAME: Final = 249
_LONGEST_SUFFIX: Final = len("changelog")

# How long an open transaction may stay open before the broker aborts it. A checkpoint
# commits every 100-250 ms, so ten seconds is ample; it is also how long a crashed
# instance whose transactional id is never reused can hold back read_committed readers.
# It is Kafka Streams' exactly-once default, below the broker's 15-minute maximum.
TRANSACTION_TIMEOUT_MS: Final = 10_000

# How long a transactional producer holds a partition's records before sending them
# (librdkafka's `linger.ms`, 5 by default). A checkpoint's records are needed only when it
# commits, and the commit's flush sends whatever is held at once: holding them makes a
# produce request per partition per checkpoint (per 50 ms, in a longer one) instead of
# one every 5 ms. Each request costs the broker (a transactional produce is also verified
# against the coordinator, KIP-890). With the stage's linger (processor.STAGE_LINGER_MS)
# bench.kafka made ~37% fewer produce requests and the broker spent ~20% less CPU per
# completion (bench/README.md, stop 25).
TRANSACTIONAL_LINGER_MS: Final = 50


class SecurityProtocol(StrEnum):
    """librdkafka `security.protocol`, spelled as librdkafka spells it."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def is_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class SaslMechanism(StrEnum):
    """librdkafka `sasl.mechanism` values that take a username and a password."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


@dataclass(frozen=True, slots=True)
class Secret:
    """A string that must not be printed: its repr and str are masked; `reveal()` gives it."""

    value: str

    def __post_init__(self) -> None:
        if not self.value:
            raise ConfigError("a secret must not be empty")

    def reveal(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__


# Keys Torpor sets itself because exactly-once, partitioning or security depends on them;
# the value says what to do instead of overriding them.
MANAGED_KEYS: Final[Mapping[str, str]] = {
    "bootstrap.servers": "set TORPOR_BOOTSTRAP or [kafka] bootstrap_servers",
    "metadata.broker.list": "set TORPOR_BOOTSTRAP or [kafka] bootstrap_servers",
    "security.protocol": "set TORPOR_SECURITY_PROTOCOL or [kafka] security_protocol",
    "sasl.mechanism": "set TORPOR_SASL_MECHANISM or [kafka] sasl_mechanism",
    "sasl.mechanisms": "set TORPOR_SASL_MECHANISM or [kafka] sasl_mechanism",
    "sasl.username": "set TORPOR_SASL_USERNAME or [kafka] sasl_username",
    "sasl.password": "set TORPOR_SASL_PASSWORD (keep secrets out of files)",
    "partitioner": "every producer must use murmur2_random so threads land where Java puts them",
    "enable.idempotence": "exactly-once needs the idempotent producer",
    "acks": "the idempotent producer needs acks=all",
    "request.required.acks": "the idempotent producer needs acks=all",
    "transactional.id": "it is derived per instance by the processor",
    "group.id": "it is chosen by the component that consumes",
    "group.instance.id": "it is derived per instance by the processor",
    "isolation.level": "readers must be read_committed, or they see aborted records",
    "enable.auto.commit": "offsets are committed inside the transaction, never automatically",
    "enable.auto.offset.store": "offsets are stored explicitly with each checkpoint",
    "partition.assignment.strategy": "the processor relies on cooperative-sticky rebalancing",
    "auto.offset.reset": "a new group must start at the earliest input, or inputs are skipped",
    "allow.auto.create.topics": "topics are created on purpose (torpor topics create), with their layout",
}


def _where(section: str, key: str) -> str:
    """How an operator sets `[section] key`, for error messages: its variable (`_KEYS`) or the file."""
    env = _variable(section, key)
    file_key = f"[{section}] {key} in the config file"
    return f"set {env} or {file_key}" if env else f"set {file_key}"


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How to reach and authenticate to the cluster, shared by every client Torpor makes."""

    # Kafka's conventional listener; `torpor broker start` prints the address it really uses.
    bootstrap_servers: str = "localhost:9092"
    # Prefixes every client.id, so broker logs and quotas can tell Torpor's clients apart.
    client_id_prefix: str = "torpor"
    # A local broker speaks plaintext; production clusters set SASL_SSL or SSL.
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    # PLAIN is what Confluent Cloud and most managed clusters expect; SCRAM suits self-hosted ones.
    sasl_mechanism: SaslMechanism = SaslMechanism.PLAIN
    # Only with a SASL protocol; unset for plaintext and SSL.
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    # Extra librdkafka properties as (key, value) pairs (the loader sorts them). Not in the
    # repr: values such as ssl.key.password are secrets. `MANAGED_KEYS` cannot appear here.
    librdkafka_overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self._check_bootstrap()
        if not _NAME_CHARS.fullmatch(self.client_id_prefix):
            raise ConfigError(
                f"client id prefix {self.client_id_prefix!r} must be non-empty and use only letters, "
                f"digits, '.', '_' and '-': {_where('kafka', 'client_id_prefix')}"
            )
        self._check_sasl()
        self._check_overrides()

    def _check_bootstrap(self) -> None:
        fix = _where("kafka", "bootstrap_servers")
        entries = [entry.strip() for entry in self.bootstrap_servers.split(",")]
        if not self.bootstrap_servers.strip() or not all(entries):
            raise ConfigError(
                f"bootstrap servers {self.bootstrap_servers!r} must be a comma-separated list of "
                f"host:port, e.g. localhost:9092: {fix}"
            )
        for entry in entries:
            address = entry.split("://", 1)[-1]  # librdkafka accepts an optional PROTOCOL:// prefix
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(
                    f"bootstrap server {entry!r} is not host:port with a port from 1 to 65535 "
                    f"(e.g. localhost:9092): {fix}"
                )

    def _check_sasl(self) -> None:
        has_credentials = self.sasl_username is not None or self.sasl_password is not None
        if self.security_protocol.is_sasl:
            if not self.sasl_username or self.sasl_password is None:
                raise ConfigError(
                    f"security protocol {self.security_protocol} needs a SASL username and password: "
                    "set TORPOR_SASL_USERNAME and TORPOR_SASL_PASSWORD"
                )
        elif has_credentials:
            # Credentials with a non-SASL protocol would be silently ignored by librdkafka.
            raise ConfigError(
                f"SASL credentials are set but the security protocol is {self.security_protocol}: "
                "set TORPOR_SECURITY_PROTOCOL to SASL_SSL (or SASL_PLAINTEXT), or remove the credentials"
            )

    def _check_overrides(self) -> None:
        keys = [key for key, _ in self.librdkafka_overrides]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"librdkafka overrides repeat a key: {sorted(keys)}")
        for key in keys:
            if not key or key != key.strip() or " " in key:
                raise ConfigError(f"librdkafka override key {key!r} is not a property name")
            if key in MANAGED_KEYS:
                raise ConfigError(
                    f"librdkafka property {key!r} is managed by Torpor and cannot be overridden "
                    f"({MANAGED_KEYS[key]}): remove it from [kafka.librdkafka]"
                )


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """Names and shape of the topics Torpor creates (see `torpor.streams.topics`)."""

    # The design's default: every Torpor topic is namespaced, so several apps share a cluster.
    prefix: str = "torpor."
    # Partitions cap the processor instances that can share the work, and growing them later
    # moves threads to other partitions (and their stores with them); six leaves room to
    # scale out on a laptop broker without that migration.
    partitions: int = 6
    # None: follow the cluster, as many copies as brokers up to three (one on a laptop
    # broker, three in production); see `topics.replication_for`.
    replication_factor: int | None = None

    def __post_init__(self) -> None:
        longest = len(self.prefix) + _LONGEST_SUFFIX
        if (self.prefix and not _NAME_CHARS.fullmatch(self.prefix)) or longest > _MAX_TOPIC_NAME:
            raise ConfigError(
                f"topic prefix {self.prefix!r} must use only letters, digits, '.', '_' and '-' and leave "
                f"topic names under {_MAX_TOPIC_NAME + 1} characters: "
                f"{_where('topics', 'prefix')}"
            )
        _check_count(self.partitions, "partitions")
        if self.replication_factor is not None:
            _check_count(self.replication_factor, "replication_factor")


def _check_count(value: int, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"topics {key} must be a whole number of at least 1, got {value!r}: {_where('topics', key)}"
        )


@dataclass(frozen=True, slots=True)
class SchemaRegistrySettings:
    """Where the Schema Registry is; without one, records use Avro single-object encoding."""

    # No registry by default: single-object encoding needs none, so a laptop needs nothing extra.
    url: str | None = None

    def __post_init__(self) -> None:
        if self.url is None:
            return
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"schema registry URL {self._redacted()!r} must be http:// or https:// with a host: "
                f"{_where('schema_registry', 'url')}"
            )

    def _redacted(self) -> str | None:
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        return parts._replace(netloc=f"{parts.username}:********@{parts.netloc.rsplit('@', 1)[-1]}").geturl()

    def __repr__(self) -> str:
        return f"SchemaRegistrySettings(url={self._redacted()!r})"


RECORD_MAX_BYTES: Final = 1_000_000
"""The largest record a Torpor producer sends (`message.max.bytes`, set explicitly; the
broker's own default topic limit, 1,048,588, is above it). Every bound below derives from
it, so that no input the door lets in can make a record Kafka refuses (which would fail
the checkpoint and stop the partition)."""

MAX_INPUT_BYTES_CEILING: Final = 262_144
"""The largest `TORPOR_MAX_INPUT_BYTES` allowed: a quarter of a record, less a margin. One
input's content is written whole into one history row and one event, and a completion's
calls also into the thread's state row next to inputs held while it waits (at most
`STATE_HOLD_MAX_BYTES`): each of those stays under `ROW_MAX_BYTES`."""

DEFAULT_MAX_INPUT_BYTES: Final = MAX_INPUT_BYTES_CEILING
"""An input larger than this is parked unread (256 KiB)."""

ROW_MAX_BYTES: Final = RECORD_MAX_BYTES - 65_536
"""The largest store row the fold may write (each row is also a changelog record, and an
entry also travels in an event): the margin covers keys, headers and an event's fields.
An input whose fold would write a larger row is refused whole (`rejected:too_large`)."""

STATE_HOLD_MAX_BYTES: Final = RECORD_MAX_BYTES // 2
"""A thread holding inputs (parked, or deferring them behind a completion) holds no more
once its state row would pass this: the next one is refused (`rejected:too_large`), and
room stays for the completion or result it waits for."""


@dataclass(frozen=True, slots=True)
class InputSettings:
    """How the processor judges inputs before it folds them.

    `keyring`: the key ring file (`torpor keys`) that signed inputs are verified against.
    None means development mode: no signature is checked and unsigned connector, timer
    and operator inputs are accepted (the processor says so at start). `max_bytes`: the
    largest encoded input folded; a larger one is parked with a receipt.
    `processor_key_id` and `processor_key` (a private key file): the processor signs its
    loopback inputs and model completions with it, and then inputs with source
    `processor` must be signed too (else anyone who may produce to `inputs` could write
    a model's answer). Both or neither.
    """

    keyring: Path | None = None
    max_bytes: int = DEFAULT_MAX_INPUT_BYTES
    processor_key_id: str | None = None
    processor_key: Path | None = None

    def __post_init__(self) -> None:
        if (self.processor_key_id is None) != (self.processor_key is None):
            raise ConfigError(
                "the processor's signing key needs both its id and its file: "
                f"{_where('inputs', 'processor_key_id')} and "
                f"{_where('inputs', 'processor_key')}"
            )
        if self.processor_key_id is not None and self.keyring is None:
            raise ConfigError(
                "a processor signing key without a key ring verifies nothing: "
                f"{_where('inputs', 'keyring')} too"
            )
        if not 1 <= self.max_bytes <= MAX_INPUT_BYTES_CEILING:
            raise ConfigError(
                f"max input bytes must be between 1 and {MAX_INPUT_BYTES_CEILING}, not {self.max_bytes}: "
                f"{_where('inputs', 'max_bytes')} (a larger input could make "
                f"a record over the {RECORD_MAX_BYTES} bytes a producer sends)"
            )


@dataclass(frozen=True, slots=True)
class MemorySettings:
    """The bounds of a processor's caches: what its resident memory is made of, besides
    Python itself, whatever the number of agents and of partitions it owns.

    Each is one budget for the whole process, and for the whole `torpor processor`
    command: its workers get a `share` each. `block_cache_mib`: RocksDB's block cache,
    shared by every store (one per partition owned). `row_cache_mib`: the rows the stores
    keep decoded, shared out evenly among them. `write_buffer_mib`: the stores' memtables
    together (one RocksDB write buffer manager; past it RocksDB flushes).
    `history_cache_entries`: decoded history entries kept for the model stage's next
    completion (~1 KB each). So the caches hold at most block + rows + write buffers +
    entries x ~1 KB: 64 + 16 + 32 + 48 = 160 MiB with the defaults, for one partition or
    sixty; each can be lowered, at the cost of reads.

    `consumer_prefetch_mib`: what each consumer may hold fetched and not yet read
    (librdkafka's `queued.max.messages.kbytes`, whose own default is 64 MiB; it also caps
    a fetch). A processor has two consumers, its inputs' and its changelog's (restore),
    so 2 x 16 = 32 MiB with the default: seconds of inputs at the rates this runtime
    reaches (against 64 MiB it changed neither the rate nor restore, bench/README.md).
    """

    block_cache_mib: int = 64
    row_cache_mib: int = 16
    write_buffer_mib: int = 32
    history_cache_entries: int = 49_152
    consumer_prefetch_mib: int = 16

    def __post_init__(self) -> None:
        for name, (least, most) in _MEMORY_BOUNDS.items():
            value = getattr(self, name)
            if not least <= value <= most:
                raise ConfigError(f"{name} must be between {least} and {most}, not {value}: "
                                  f"{_where('memory', name)}")

    def share(self, workers: int) -> MemorySettings:
        """Each of `workers` processes' part of these budgets (`torpor processor --workers`).

        The caches are split evenly, rounded down, so N workers together hold what one
        process would; but a share is never below a budget's least value, nor 0 where the
        budget is not (0 turns a cache off), so at budgets under N units they hold a
        little more. `consumer_prefetch_mib` is per consumer, not a budget to split: each
        worker's consumers keep it.
        """
        if workers < 1:
            raise ValueError(f"a share among {workers} workers")
        return replace(self, **{
            name: max(_MEMORY_BOUNDS[name][0], min(1, value), value // workers)
            for name in _SHARED_BUDGETS for value in (getattr(self, name),)})

    def environment(self) -> dict[str, str]:
        """These settings as the `TORPOR_*` variables that set them (they win over a file)."""
        return {k.env: str(getattr(self, k.key)) for k in _KEYS if k.section == "memory" and k.env}


# (least, most) of each `MemorySettings` value; its variable is in `_KEYS`.
_MEMORY_BOUNDS: Final[Mapping[str, tuple[int, int]]] = {
    "block_cache_mib": (1, 1 << 20),
    "row_cache_mib": (0, 1 << 20),
    "write_buffer_mib": (1, 1 << 20),
    "history_cache_entries": (0, 1 << 20),
    "consumer_prefetch_mib": (1, 2047),  # librdkafka takes at most 2,097,151 KiB
}
# The budgets `MemorySettings.share` splits among workers: every one but the per-consumer bound.
_SHARED_BUDGETS: Final = ("block_cache_mib", "row_cache_mib", "write_buffer_mib", "history_cache_entries")


@dataclass(frozen=True, slots=True)
class Settings:
    """All settings of `torpor.streams`, one section per concern."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    schema_registry: SchemaRegistrySettings = field(default_factory=SchemaRegistrySettings)
    inputs: InputSettings = field(default_factory=InputSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)


# ---------------------------------------------------------------------------------------
# Loading: defaults < TOML file < TORPOR_* variables.


@dataclass(frozen=True, slots=True)
class _Key:
    """One loadable setting: its file section and key, its variable, its type."""

    section: str
    key: str
    env: str | None
    kind: type[str] | type[int]
    optional: bool = False  # an empty variable clears it, instead of being an error


_KEYS: Final[tuple[_Key, ...]] = (
    _Key("kafka", "bootstrap_servers", "TORPOR_BOOTSTRAP", str),
    _Key("kafka", "client_id_prefix", "TORPOR_CLIENT_ID_PREFIX", str),
    _Key("kafka", "security_protocol", "TORPOR_SECURITY_PROTOCOL", str),
    _Key("kafka", "sasl_mechanism", "TORPOR_SASL_MECHANISM", str),
    _Key("kafka", "sasl_username", "TORPOR_SASL_USERNAME", str, optional=True),
    _Key("kafka", "sasl_password", "TORPOR_SASL_PASSWORD", str, optional=True),
    _Key("topics", "prefix", "TORPOR_TOPIC_PREFIX", str),
    _Key("topics", "partitions", "TORPOR_PARTITIONS", int),
    _Key("topics", "replication_factor", "TORPOR_REPLICATION_FACTOR", int),
    _Key("schema_registry", "url", "TORPOR_SCHEMA_REGISTRY_URL", str, optional=True),
    _Key("inputs", "keyring", "TORPOR_KEYRING", str, optional=True),
    _Key("inputs", "max_bytes", "TORPOR_MAX_INPUT_BYTES", int),
    _Key("inputs", "processor_key_id", "TORPOR_PROCESSOR_KEY_ID", str, optional=True),
    _Key("inputs", "processor_key", "TORPOR_PROCESSOR_KEY", str, optional=True),
    _Key("memory", "block_cache_mib", "TORPOR_BLOCK_CACHE_MIB", int),
    _Key("memory", "row_cache_mib", "TORPOR_ROW_CACHE_MIB", int),
    _Key("memory", "write_buffer_mib", "TORPOR_WRITE_BUFFER_MIB", int),
    _Key("memory", "history_cache_entries", "TORPOR_HISTORY_CACHE_ENTRIES", int),
    _Key("memory", "consumer_prefetch_mib", "TORPOR_CONSUMER_PREFETCH_MIB", int),
)


def _variable(section: str, key: str) -> str | None:
    """The `TORPOR_*` variable that sets `[section] key`, from `_KEYS` (None: only the file)."""
    return next((k.env for k in _KEYS if k.section == section and k.key == key), None)


_OVERRIDES_TABLE: Final = "librdkafka"  # [kafka.librdkafka]: free-form librdkafka properties
_SECTIONS: Final = frozenset(k.section for k in _KEYS)

_Value = str | int | None
_Values = Mapping[tuple[str, str], _Value]
_E = TypeVar("_E", bound=StrEnum)


def load_settings(env: Mapping[str, str], file: Path | None) -> Settings:
    """Build `Settings` from defaults, then the TOML `file`, then `TORPOR_*` variables in `env`.

    Later sources win. The file has sections `[kafka]`, `[kafka.librdkafka]`, `[topics]`,
    `[schema_registry]`, `[inputs]` and `[memory]`; other sections belong to other packages
    and are ignored, but an unknown key inside these sections is an error (it is usually a
    typo). Variables:

    - `TORPOR_BOOTSTRAP`: comma-separated host:port list (`[kafka] bootstrap_servers`).
    - `TORPOR_CLIENT_ID_PREFIX`: prefix of every client.id (`[kafka] client_id_prefix`).
    - `TORPOR_SECURITY_PROTOCOL`: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    - `TORPOR_SASL_MECHANISM`: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    - `TORPOR_SASL_USERNAME`, `TORPOR_SASL_PASSWORD`: SASL credentials (empty clears them).
    - `TORPOR_TOPIC_PREFIX`: prefix of every topic name (`[topics] prefix`, default `torpor.`).
    - `TORPOR_PARTITIONS`: partitions of new topics (`[topics] partitions`, default 6).
    - `TORPOR_REPLICATION_FACTOR`: replicas of new topics (`[topics] replication_factor`; default:
      as many as brokers, up to three).
    - `TORPOR_SCHEMA_REGISTRY_URL`: Schema Registry URL (`[schema_registry] url`; empty clears it).
    - `TORPOR_KEYRING`: the key ring file signed inputs are verified against (`[inputs] keyring`;
      unset: development mode, nothing verified).
    - `TORPOR_MAX_INPUT_BYTES`: the largest input folded (`[inputs] max_bytes`, default 1 MiB).
    - `TORPOR_PROCESSOR_KEY_ID`, `TORPOR_PROCESSOR_KEY`: the processor's own signing key
      (`[inputs] processor_key_id`, `processor_key`: a key id and a private key file).
    - `TORPOR_BLOCK_CACHE_MIB`, `TORPOR_ROW_CACHE_MIB`, `TORPOR_WRITE_BUFFER_MIB`,
      `TORPOR_HISTORY_CACHE_ENTRIES`: the processor's cache bounds (`[memory]`, `MemorySettings`).

    librdkafka overrides come from `[kafka.librdkafka]` only (string, integer or boolean
    values). Raises `ConfigError` naming the source and the fix for a missing or unreadable
    file, a malformed value, or a setting that fails validation.
    """
    values: dict[tuple[str, str], _Value] = {}
    overrides: dict[str, str] = {}
    if file is not None:
        values.update(_read_file(file, overrides))
    values.update(_read_env(env))
    return _build(values, overrides)


def _read_file(file: Path, overrides: dict[str, str]) -> dict[tuple[str, str], _Value]:
    try:
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc
    known = {(k.section, k.key): k for k in _KEYS}
    values: dict[tuple[str, str], _Value] = {}
    for section in sorted(_SECTIONS & document.keys()):
        table = document[section]
        if not isinstance(table, dict):
            raise ConfigError(f"config file {file}: [{section}] must be a table")
        for key, value in table.items():
            if section == "kafka" and key == _OVERRIDES_TABLE:
                overrides.update(_read_overrides(file, value))
                continue
            spec = known.get((section, key))
            if spec is None:
                allowed = sorted(k.key for k in _KEYS if k.section == section)
                raise ConfigError(f"config file {file}: unknown key {key!r} in [{section}]; known: {allowed}")
            if isinstance(value, bool) or not isinstance(value, spec.kind):
                raise ConfigError(
                    f"config file {file}: [{section}] {key} must be a {spec.kind.__name__}, got {value!r}"
                )
            values[(section, key)] = value
    return values


def _read_overrides(file: Path, table: object) -> dict[str, str]:
    if not isinstance(table, dict):
        raise ConfigError(f"config file {file}: [kafka.librdkafka] must be a table of properties")
    result: dict[str, str] = {}
    for key, value in table.items():
        if isinstance(value, bool):
            result[key] = "true" if value else "false"  # librdkafka's spelling of booleans
        elif isinstance(value, str | int):
            result[key] = str(value)
        else:
            raise ConfigError(
                f"config file {file}: [kafka.librdkafka] {key!r} must be a string, integer or boolean"
            )
    return result


def _read_env(env: Mapping[str, str]) -> dict[tuple[str, str], _Value]:
    values: dict[tuple[str, str], _Value] = {}
    for spec in _KEYS:
        if spec.env is None or spec.env not in env:
            continue
        raw = env[spec.env].strip()
        if not raw:
            if not spec.optional:
                raise ConfigError(f"{spec.env} is set but empty: unset it or give it a value")
            values[(spec.section, spec.key)] = None
        elif spec.kind is int:
            try:
                values[(spec.section, spec.key)] = int(raw)
            except ValueError:
                raise ConfigError(f"{spec.env}={raw!r} is not a whole number") from None
        else:
            values[(spec.section, spec.key)] = raw
    return values


def _build(values: _Values, overrides: Mapping[str, str]) -> Settings:
    kafka_defaults = KafkaSettings()
    topic_defaults = TopicSettings()
    username = _text(values, "kafka", "sasl_username", kafka_defaults.sasl_username)
    password = _text(values, "kafka", "sasl_password", None)
    kafka = KafkaSettings(
        bootstrap_servers=_required(values, "kafka", "bootstrap_servers", kafka_defaults.bootstrap_servers),
        client_id_prefix=_required(values, "kafka", "client_id_prefix", kafka_defaults.client_id_prefix),
        security_protocol=_choice(
            SecurityProtocol,
            _required(values, "kafka", "security_protocol", kafka_defaults.security_protocol.value),
            "TORPOR_SECURITY_PROTOCOL",
        ),
        sasl_mechanism=_choice(
            SaslMechanism,
            _required(values, "kafka", "sasl_mechanism", kafka_defaults.sasl_mechanism.value),
            "TORPOR_SASL_MECHANISM",
        ),
        sasl_username=username,
        sasl_password=Secret(password) if password else None,
        librdkafka_overrides=tuple(sorted(overrides.items())),
    )
    topics = TopicSettings(
        prefix=_required(values, "topics", "prefix", topic_defaults.prefix),
        partitions=_count(values, "partitions", topic_defaults.partitions),
        replication_factor=_optional_count(values, "replication_factor", topic_defaults.replication_factor),
    )
    registry = SchemaRegistrySettings(url=_text(values, "schema_registry", "url", None))
    keyring = _text(values, "inputs", "keyring", None)
    max_bytes = values.get(("inputs", "max_bytes"), DEFAULT_MAX_INPUT_BYTES)
    processor_key = _text(values, "inputs", "processor_key", None)
    inputs = InputSettings(
        keyring=Path(keyring) if keyring else None,
        max_bytes=max_bytes if isinstance(max_bytes, int) else DEFAULT_MAX_INPUT_BYTES,
        processor_key_id=_text(values, "inputs", "processor_key_id", None) or None,
        processor_key=Path(processor_key) if processor_key else None,
    )
    memory_defaults = MemorySettings()
    memory = MemorySettings(**{
        f.name: _whole(values, "memory", f.name, getattr(memory_defaults, f.name))
        for f in fields(MemorySettings)})
    return Settings(kafka=kafka, topics=topics, schema_registry=registry, inputs=inputs, memory=memory)


def _whole(values: _Values, section: str, key: str, default: int) -> int:
    value = values.get((section, key), default)
    return value if isinstance(value, int) else default


def _text(values: _Values, section: str, key: str, default: str | None) -> str | None:
    if (section, key) not in values:
        return default
    value = values[(section, key)]
    return value if isinstance(value, str) else None


def _required(values: _Values, section: str, key: str, default: str) -> str:
    value = _text(values, section, key, default)
    return default if value is None else value


def _count(values: _Values, key: str, default: int) -> int:
    value = values.get(("topics", key), default)
    return value if isinstance(value, int) else default


def _optional_count(values: _Values, key: str, default: int | None) -> int | None:
    value = values.get(("topics", key), default)
    return value if isinstance(value, int) else default


def _choice(enum: type[_E], raw: str, env: str) -> _E:
    try:
        return enum(raw.upper())
    except ValueError:
        choices = ", ".join(member.value for member in enum)
        raise ConfigError(f"{env}={raw!r} is not one of {choices}") from None


# ---------------------------------------------------------------------------------------
# librdkafka dicts: built here and nowhere else.


def producer_config(settings: Settings, *, transactional_id: str | None = None,
                    linger_ms: int | None = None) -> ClientConfig:
    """The librdkafka config of a producer; transactional when `transactional_id` is given.

    Always idempotent with acks=all, and always `partitioner=murmur2_random`, so that a
    keyed record lands on the partition Java's producer (and `partitioner.partition_for`)
    picks. A transactional producer gets `transaction.timeout.ms=TRANSACTION_TIMEOUT_MS`
    and `linger.ms=TRANSACTIONAL_LINGER_MS`; `linger_ms` sets another (a plain producer
    keeps librdkafka's 5 ms without it). `[kafka.librdkafka]` overrides any of them.
    Raises `ConfigError` for an empty id.
    """
    role = "producer"
    conf = _base(settings.kafka)
    conf["partitioner"] = "murmur2_random"
    conf["enable.idempotence"] = True
    conf["acks"] = "all"
    conf["message.max.bytes"] = RECORD_MAX_BYTES  # the bound every size limit derives from
    if transactional_id is not None:
        if not transactional_id.strip():
            raise ConfigError("a transactional producer needs a non-empty transactional id")
        role = f"producer-{transactional_id}"
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        conf["linger.ms"] = TRANSACTIONAL_LINGER_MS
    if linger_ms is not None:
        conf["linger.ms"] = linger_ms
    return _finish(conf, settings.kafka, role)


def consumer_config(settings: Settings, group_id: str, *, instance_id: str | None = None) -> ClientConfig:
    """The librdkafka config of an exactly-once consumer in `group_id`.

    read_committed (aborted records are never seen), no automatic commit or offset store
    (offsets travel inside the producer's transaction), cooperative-sticky assignment (a
    rebalance revokes only the partitions that move), static membership when
    `instance_id` is given (a restart within the session timeout keeps its partitions),
    and `auto.offset.reset=earliest` (a new group starts at the first input, never skips).
    Raises `ConfigError` for an empty group or instance id.
    """
    if not group_id.strip():
        raise ConfigError("a consumer needs a non-empty group id")
    conf = _base(settings.kafka)
    conf["group.id"] = group_id
    conf["isolation.level"] = "read_committed"
    conf["enable.auto.commit"] = False
    conf["enable.auto.offset.store"] = False
    conf["partition.assignment.strategy"] = "cooperative-sticky"
    conf["auto.offset.reset"] = "earliest"
    # Bounded by `[memory]` (librdkafka's own default is 64 MiB per consumer).
    conf["queued.max.messages.kbytes"] = settings.memory.consumer_prefetch_mib * 1024
    role = f"consumer-{group_id}"
    if instance_id is not None:
        if not instance_id.strip():
            raise ConfigError("a static group member needs a non-empty instance id")
        conf["group.instance.id"] = instance_id
        role = f"{role}-{instance_id}"
    return _finish(conf, settings.kafka, role)


def admin_config(settings: Settings) -> ClientConfig:
    """The librdkafka config of an admin client: connection and security only."""
    return _finish(_base(settings.kafka), settings.kafka, "admin")


def _base(kafka: KafkaSettings) -> ClientConfig:
    conf: ClientConfig = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol.value,
        # librdkafka's default, `rebootstrap`, drops every broker it learned once all of them
        # are down at once (a one-node cluster restarting, a whole-cluster outage) and starts
        # over from `bootstrap.servers`. References to the dropped brokers outlive them: a
        # transactional producer keeps one as its group coordinator, and its next
        # send_offsets_to_transaction waits for a broker thread that is gone
        # (confluentinc/librdkafka#5511, open). The soak's broker restart hit it after nearly
        # every restart; with `none` the clients reconnect to the brokers they knew.
        # Overridable in [kafka.librdkafka] for a cluster whose brokers all change address.
        "metadata.recovery.strategy": "none",
        # A client touching a missing topic must not make the broker create it (a broker
        # with auto.create.topics.enable would make a 1-partition `inputs`, which every
        # other topic then follows): topics exist because `ensure_topics` made them.
        "allow.auto.create.topics": False,
    }
    if kafka.security_protocol.is_sasl and kafka.sasl_username and kafka.sasl_password:
        conf["sasl.mechanism"] = kafka.sasl_mechanism.value
        conf["sasl.username"] = kafka.sasl_username
        conf["sasl.password"] = kafka.sasl_password.reveal()
    return conf


def _finish(conf: ClientConfig, kafka: KafkaSettings, role: str) -> ClientConfig:
    conf["client.id"] = f"{kafka.client_id_prefix}-{role}"
    # Overrides go last so they can tune anything not in MANAGED_KEYS (validation keeps
    # them away from those), including transaction.timeout.ms and client.id.
    conf.update(kafka.librdkafka_overrides)
    return conf
