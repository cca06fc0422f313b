"""Deterministic bytes for the store's row values: thread state, history entries, requests.

Replay must be byte-identical: re-folding the inputs must write the same bytes to every
row, so the changelog of a replay equals the original. The encoding is canonical JSON
(sorted keys, no whitespace, UTF-8) driven by the dataclass fields and their type hints:

- `str`, `int`, `bool`, `float`, None pass through; `bytes` is base64 text;
- a `StrEnum` is its wire value;
- `tuple[X, ...]` is a JSON array;
- a dataclass is an object of its fields;
- a union of two or more dataclasses is `{"type": <class name>, "value": {...}}`, so
  the branch is named, never guessed from the fields (`TextBlock` and `ThinkingBlock`
  both have `text`).

Why not Avro for the state: `torpor.schemas.convert` maps the wire records, but
`ThreadState` also holds enums and processor-local records that have no `.avsc`; the
state is a private row of the processor, not a wire contract. History rows are wire
records, so they use the schemas codec (`encode_value`: Avro single-object encoding,
deterministic for a schema and value, and readable after the schema evolves).

Plans are computed once per class (`functools.cache`). Decoded values are memoised:
states per thread with the bytes they came from (`_Latest`), history entries by their
bytes in a bounded LRU map (`_Recent`). The step re-reads the state it wrote one input
earlier and the model stage reads the entries the step just appended; every decoded
value is a frozen dataclass, so sharing one between callers is safe. Encoding a state or
an entry remembers the pair too (the value encodes to those bytes, so it is what they
decode to): the next read of a row just written is a hit. Encoding remembers the JSON
text of composite fields (tuples, records) by identity, since a state shares most of them
with the state before it. The bounds keep the memory constant, not per agent.
An unsupported field type raises `TypeError` on first use: a bug in the record definitions, not bad input.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import itertools
import json
import operator
import types
import typing
from collections import OrderedDict
from collections.abc import Callable
from enum import Enum
from typing import Final, TypeVar

from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.state import ThreadState
from torpor.schemas.codec import (
    canonical_bytes,
    decode_value,
    encode_value,
    single_object_header,
    straight_reading,
)
from torpor.schemas.records import HistoryEntry, Input, ThreadConfig
from torpor.schemas.sortedjson import sorted_json

T = TypeVar("T")
Json = object
_Convert = Callable[[object], object]
_SCALARS: Final = (str, int, bool, float, type(None))


def _is_union(tp: object) -> bool:
    return isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, _Convert, _Convert], ...]:
    hints = typing.get_type_hints(cls)
    plan = []
    for field in dataclasses.fields(cls):
        to, frm = _converter(hints[field.name], f"{cls.__name__}.{field.name}")
        plan.append((field.name, to, frm))
    return tuple(plan)


def _identity(value: object) -> object:
    return value


def _as_list(value: object) -> object:
    return list(typing.cast(tuple[object, ...], value))


def _converter(tp: object, where: str) -> tuple[_Convert, _Convert]:
    """(to_json, from_json) for one field type."""
    if tp in _SCALARS:
        return _identity, _identity
    if tp is bytes:
        return (
            lambda v: base64.b64encode(typing.cast(bytes, v)).decode("ascii"),
            lambda d: base64.b64decode(typing.cast(str, d)),
        )
    if isinstance(tp, type) and issubclass(tp, Enum):
        enum_cls = tp
        return (lambda v: typing.cast(Enum, v).value), (lambda d: enum_cls(d))
    if _is_union(tp):
        args = typing.get_args(tp)
        members = tuple(a for a in args if a is not type(None))
        optional = len(members) < len(args)
        to, frm = _converter(members[0], where) if len(members) == 1 else _tagged(members, where)
        if not optional or (to is _identity and frm is _identity):  # `X | None` of a scalar X
            return to, frm
        return (lambda v: None if v is None else to(v)), (lambda d: None if d is None else frm(d))
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only tuple[X, ...] is supported, not {tp!r}")
        item_to, item_from = _converter(args[0], where)
        if item_to is _identity:  # a tuple of scalars: its JSON array is its items as they are
            return _as_list, (lambda d: tuple(typing.cast(list[object], d)))
        return (
            lambda v: [item_to(x) for x in typing.cast(tuple[object, ...], v)],
            lambda d: tuple(item_from(x) for x in typing.cast(list[object], d)),
        )
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        cls = tp
        if cls is ThreadConfig:
            return _shared_record_to, (lambda d: _record_from(cls, d))
        return (lambda v: _record_to(v)), (lambda d: _record_from(cls, d))
    raise TypeError(f"{where}: no canonical encoding for {tp!r}")


def _tagged(members: tuple[object, ...], where: str) -> tuple[_Convert, _Convert]:
    by_name: dict[str, type] = {}
    for member in members:
        if not (isinstance(member, type) and dataclasses.is_dataclass(member)):
            raise TypeError(f"{where}: a union may hold only dataclasses (and None), not {member!r}")
        by_name[member.__name__] = member

    def to(value: object) -> object:
        name = type(value).__name__
        if by_name.get(name) is not type(value):
            raise TypeError(f"{where}: {name} is not a branch of this union")
        return {"type": name, "value": _record_to(value)}

    def frm(datum: object) -> object:
        tagged = typing.cast(dict[str, object], datum)
        name = typing.cast(str, tagged["type"])
        if name not in by_name:
            raise ValueError(f"{where}: unknown union branch {name!r}")
        return _record_from(by_name[name], tagged["value"])

    return to, frm


def _record_to(value: object) -> dict[str, object]:
    cls: type = type(value)
    return {name: to(getattr(value, name)) for name, to, _ in _fields(cls)}


# A thread's config is the bulk of its state and is carried from state to state as the
# same object (`dataclasses.replace` keeps it); its JSON form is remembered by identity.
# The entry holds the value itself, so its id cannot be reused while it is cached.
_SHARED_CAPACITY: Final = 1024
_shared: OrderedDict[int, tuple[object, dict[str, object]]] = OrderedDict()


def _shared_record_to(value: object) -> dict[str, object]:
    hit = _shared.get(id(value))
    if hit is not None and hit[0] is value:
        _shared.move_to_end(id(value))
        return hit[1]
    encoded = _record_to(value)
    _shared[id(value)] = (value, encoded)
    if len(_shared) > _SHARED_CAPACITY:
        _shared.popitem(last=False)
    return encoded


def _record_from(cls: type, datum: object) -> object:
    raw = typing.cast(dict[str, object], datum)
    # A field absent from the row was added to the record later with a default (Control's
    # fork fields in Input v2): the class supplies it. A missing required field still raises.
    return cls(**{name: frm(raw[name]) for name, _, frm in _fields(cls) if name in raw})


# One encoder for every call: json.dumps with options builds a new one each time.
_dumps: Final = sorted_json(ensure_ascii=False)

_Plan = tuple[tuple[str, _Convert, _Convert], ...]


@functools.cache
def _text_plan(cls: type) -> tuple[tuple[str, str, _Convert, bool], ...]:
    """Per field of `cls`, sorted by name: the name, its `"name":` prefix, its converter, and whether
    its value is a composite (a tuple or a record), whose JSON text is remembered by identity."""
    hints = typing.get_type_hints(cls)
    plan = []
    for name, to, _ in sorted(_fields(cls), key=lambda p: p[0]):
        kind = hints[name]
        members = typing.get_args(kind) if _is_union(kind) else (kind,)
        composite = any(typing.get_origin(m) is tuple or dataclasses.is_dataclass(m) for m in members)
        plan.append((name, f"{_dumps(name)}:", to, composite))
    return tuple(plan)


# A record's composite fields (the config, pending calls, answered call ids, held inputs)
# are carried from state to state as the same objects (`Draft` copies references), so their
# JSON text is remembered by identity, per converter: `encode` writes only what changed.
# Each entry holds the value itself, so its id cannot be reused while it is cached.
_TEXT_CAPACITY: Final = 4096
_texts: OrderedDict[tuple[int, int], tuple[object, str]] = OrderedDict()


def _composite_text(value: object, to: _Convert) -> str:
    key = (id(value), id(to))
    hit = _texts.get(key)
    if hit is not None and hit[0] is value:
        _texts.move_to_end(key)
        return hit[1]
    text = _dumps(to(value))
    _texts[key] = (value, text)
    if len(_texts) > _TEXT_CAPACITY:
        _texts.popitem(last=False)
    return text


_encode_str: Final = json.encoder.encode_basestring  # what `_dumps` writes for a str (no ASCII escaping)


def _scalar_text(value: object) -> str:
    """What `_dumps` writes for `value`, faster for the common scalars."""
    kind = type(value)
    if kind is str:
        return _encode_str(typing.cast(str, value))
    if kind is int:
        return int.__repr__(typing.cast(int, value))
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    return _dumps(value)


def encode(value: object) -> bytes:
    """Canonical bytes of dataclass `value`: equal values give equal bytes.

    The same bytes as one sorted dump of the whole record (`_dumps(_record_to(value))`),
    written field by field: a composite field's text is remembered by identity
    (`_composite_text`), so the config, the call lists and the held inputs a state shares
    with its predecessor are not serialised again at every input.
    """
    return _joined(_parts(value, None)[1])


_Parts = tuple[str, ...]
"""A record's `"name":text` pieces, one per field in sorted order: `_joined` makes its bytes."""
_Values = tuple[object, ...]
"""A record's field values in the same order (`_values_of`): what its pieces were written from."""


@functools.cache
def _values_of(cls: type) -> Callable[[object], _Values]:
    """One C call that reads every field of a `cls` record, in `_text_plan` order."""
    names = [name for name, _, _, _ in _text_plan(cls)]
    if len(names) < 2:  # attrgetter of one name returns the value itself, not a 1-tuple
        return lambda value: tuple(getattr(value, name) for name in names)
    getter: Callable[[object], _Values] = operator.attrgetter(*names)
    return getter


def _parts(value: object, earlier: tuple[_Values, _Parts] | None) -> tuple[_Values, _Parts]:
    """The field values and pieces of `value`; a field whose value is the very object
    `earlier`'s record held reuses `earlier`'s piece. Values are immutable (frozen records,
    tuples, str, int), so the same object writes the same text: a state drafted from the
    one before it (`Draft` copies references) re-encodes only the fields its input changed."""
    cls: type = type(value)
    values: _Values = _values_of(cls)(value)
    writers = _writers(cls)
    if earlier is None:
        return values, tuple(map(_write, writers, values))
    previous, pieces = earlier
    parts = list(pieces)
    # The fields holding another object than `earlier`'s, found by one C-level pass (an
    # input changes a handful of a state's 25 fields): only those are written again.
    for index in itertools.compress(range(len(values)), map(operator.is_not, values, previous)):
        parts[index] = writers[index](values[index])
    return values, tuple(parts)


_Writer = Callable[[object], str]


def _write(writer: _Writer, field_value: object) -> str:
    return writer(field_value)


@functools.cache
def _writers(cls: type) -> tuple[_Writer, ...]:
    """Per field of `cls`, in `_text_plan` order: the function writing its `"name":text` piece."""
    return tuple(_writer(prefix, to, composite) for _, prefix, to, composite in _text_plan(cls))


def _writer(prefix: str, to: _Convert, composite: bool) -> _Writer:
    """One field's piece writer: a composite's text is remembered by identity (`_composite_text`);
    a scalar field that needs no conversion (most of a state's changes) is written at once."""
    if composite:
        def write_composite(field_value: object) -> str:
            if field_value is None:
                return prefix + "null"
            return prefix + _composite_text(field_value, to)
        return write_composite
    if to is _identity:
        def write_plain(field_value: object) -> str:
            kind = type(field_value)
            if kind is str:
                return prefix + _encode_str(typing.cast(str, field_value))
            if kind is int:
                return prefix + int.__repr__(typing.cast(int, field_value))
            return prefix + _scalar_text(field_value)
        return write_plain

    def write_converted(field_value: object) -> str:
        return prefix + _scalar_text(to(field_value))
    return write_converted


def _joined(parts: _Parts) -> bytes:
    return ("{" + ",".join(parts) + "}").encode()


def decode(cls: type[T], raw: bytes) -> T:
    """The `cls` value `encode` wrote as `raw`."""
    return typing.cast(T, _record_from(cls, json.loads(raw)))


class _Recent(typing.Generic[T]):
    """A bounded map from row bytes to the value they decode to, least recently used evicted."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._values: OrderedDict[bytes, T] = OrderedDict()

    def get(self, raw: bytes, decoder: Callable[[bytes], T]) -> T:
        found = self._values.get(raw)
        if found is not None:
            self._values.move_to_end(raw)
            return found
        value = decoder(raw)
        self.put(raw, value)
        return value

    def put(self, raw: bytes, value: T) -> None:
        """Remember that `raw` decodes to `value` (the caller encoded `value` as `raw`)."""
        self._values[raw] = value
        self._values.move_to_end(raw)
        if len(self._values) > self._capacity:
            self._values.popitem(last=False)


_Entry = tuple[bytes, "bytes | None", "bytes | None", ThreadState, "tuple[_Values, _Parts] | None"]
"""A thread's state row, config row and answered row (None: the state row holds it), its
state, and its pieces."""


class _Latest:
    """The last state rows written or read per thread, with the state they hold.

    A thread's state changes at every input, so memoising by bytes alone filled the map
    with dead versions (four per turn); this keeps one per thread, the one the next read
    finds. A hit needs the stored rows to equal the ones remembered: the store stays the
    truth. Shared by the fold's thread and the model stage's, hence only single dict
    operations (atomic under the GIL) and an eviction that tolerates a concurrent change.
    An entry has pieces only if `encode_state` made it: then its rows are the ones the
    thread's next state was drafted from, since the step reads the rows back before every
    fold (a read that misses replaces the entry with one without pieces).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._by_thread: dict[str, _Entry] = {}

    def get(self, thread_id: str, raw: bytes, config: bytes | None,
            answered: bytes | None) -> ThreadState | None:
        hit = self._by_thread.get(thread_id)
        if hit is None or hit[0] != raw or hit[1] != config or hit[2] != answered:
            return None
        return hit[3]

    def encoded(self, thread_id: str) -> _Entry | None:
        """The thread's latest rows, state and pieces, if `encode_state` wrote them."""
        hit = self._by_thread.get(thread_id)
        return None if hit is None or hit[4] is None else hit

    def pieces(self, thread_id: str) -> tuple[_Values, _Parts] | None:
        """The field values and encoded pieces of the thread's latest state, if encoded here."""
        hit = self._by_thread.get(thread_id)
        return None if hit is None else hit[4]

    def put(self, thread_id: str, raw: bytes, config: bytes | None, answered: bytes | None,
            state: ThreadState, parts: tuple[_Values, _Parts] | None = None) -> None:
        self._by_thread.pop(thread_id, None)  # re-inserted last: evicted last
        self._by_thread[thread_id] = (raw, config, answered, state, parts)
        while len(self._by_thread) > self._capacity:
            try:
                self._by_thread.pop(next(iter(self._by_thread)), None)
            except (RuntimeError, StopIteration):  # the other thread changed it meanwhile
                break


# Threads whose latest state is kept (two waves of 500 busy ones: more would add to the
# memory measured per idle agent while it fills), and recent entries; a miss costs only
# the decode it would have done.
_STATES: Final = _Latest(1024)
_ENTRIES: Final[_Recent[HistoryEntry]] = _Recent(4096)


WITHOUT_CONFIG: Final = b"\x01"
"""The first byte of a state row of the second form, which leaves its config to the
thread's config row (its answered call ids inline): still read, no longer written.

A thread's config (its system prompt, its tools and their schemas) is most of its state
and changes almost never, while the state row is written again at every input: inline,
every input wrote the whole config to RocksDB and the changelog again (in the benchmark
700 of a state's 1,226 bytes; a real system prompt makes it kilobytes). So the config's
canonical JSON is a row of its own (`keys.config_key`), written only when it changes. A
row that starts with `{` is the first form, the config inline: still read."""

WITHOUT_ANSWERED: Final = b"\x02"
"""The first byte of a state row that leaves both its config and its answered call ids to
rows of their own (`keys.config_key`, `keys.answered_key`): the form written now.

Why the answered ids apart: a thread remembers the ids of its last `ANSWERED_KEPT` (256)
answered calls, 38 bytes each in the row: a thread past 256 tool calls carried 9.7 KB of
them in its state row, written to RocksDB and the changelog at every input, though they
change only when a call is answered (one input in four of a turn with one tool call). The
row is the field's canonical JSON (an array of strings), written when it changes."""

_FORMS: Final = (b"{", WITHOUT_CONFIG, WITHOUT_ANSWERED)


@functools.cache
def _apart_at() -> tuple[int, int]:
    """The indices of `answered_calls` and `config` among a state's pieces (`_text_plan`
    order, by name: `answered_calls` is the first field, `config` one of the middle ones)."""
    names = [name for name, _, _, _ in _text_plan(ThreadState)]
    answered, config = names.index("answered_calls"), names.index("config")
    assert answered < config, "the state row is cut around the two fields in this order"
    return answered, config


_ANSWERED_PREFIX_LEN: Final = len('"answered_calls":')
_CONFIG_PREFIX_LEN: Final = len('"config":')


def encode_state(state: ThreadState) -> tuple[bytes, bytes, bytes]:
    """The state row's bytes, the config row's and the answered row's (`encode_state_rows`)."""
    rows = encode_state_rows(state)
    return rows.state, rows.config, rows.answered


class StateRows(typing.NamedTuple):
    """A state's three rows (`WITHOUT_ANSWERED`), and whether each side row is the one the
    thread's rows already hold (`encode_state_rows`)."""

    state: bytes
    config: bytes
    answered: bytes
    config_kept: bool
    answered_kept: bool


def encode_state_rows(state: ThreadState) -> StateRows:
    """The state row's bytes, the config row's and the answered row's, and whether each
    side row is the one the thread's rows already hold (kept: the state this one was
    drafted from, as just read from them, had this very field object, so the row need not
    be read to compare). Only meaningful when the caller read a state for the thread
    first: for a creation the memo may speak of a thread of that id in another store (a
    replay beside the live run).

    Remembered, so the next read is a hit: the step writes a state and the next input of
    the thread (or the model stage) reads it back; without this every such read was a
    miss and a full JSON decode. The pieces are remembered too: the thread's next state,
    drafted from this one, re-encodes only the fields that changed (`_parts`). The three
    rows decode to exactly `state` (`decode_state`).
    """
    earlier = _STATES.encoded(state.thread_id)
    values, pieces = _parts(state, None if earlier is None else earlier[4])
    a, c = _apart_at()
    raw = WITHOUT_ANSWERED + _joined(pieces[:a] + pieces[a + 1:c] + pieces[c + 1:])
    config_row: bytes | None = None
    answered_row: bytes | None = None
    if earlier is not None and earlier[4] is not None:
        earlier_values = earlier[4][0]
        if earlier[1] is not None and earlier_values[c] is values[c]:
            config_row = earlier[1]
        if earlier[2] is not None and earlier_values[a] is values[a]:
            answered_row = earlier[2]
    config_kept, answered_kept = config_row is not None, answered_row is not None
    if config_row is None:
        config_row = pieces[c][_CONFIG_PREFIX_LEN:].encode()
    if answered_row is None:
        answered_row = pieces[a][_ANSWERED_PREFIX_LEN:].encode()
    _STATES.put(state.thread_id, raw, config_row, answered_row, state, (values, pieces))
    return StateRows(raw, config_row, answered_row, config_kept, answered_kept)


def state_rows(state: ThreadState) -> tuple[bytes, bytes, bytes]:
    """The state row, config row and answered row `encode_state` writes for `state`, from
    one canonical dump and without the memo: for readers that compare a state row of an
    older form."""
    fields = _record_to(state)
    config = fields.pop("config")
    answered = fields.pop("answered_calls")
    return WITHOUT_ANSWERED + _dumps(fields).encode(), _dumps(config).encode(), _dumps(answered).encode()


def decode_state(raw: bytes, config: bytes | None, answered: bytes | None,
                 thread_id: str | None = None) -> ThreadState:
    """The state the state row `raw`, the config row `config` and the answered row
    `answered` hold (None: the thread has no such row, as a state row of an older form
    needs none: a side row left beside it is not read); served from memory when they are
    `thread_id`'s latest known rows. Raises `ValueError` for a state row of no known form
    or without a side row it leaves to one."""
    raw = bytes(raw)
    form = raw[:1]
    if form not in _FORMS:
        raise ValueError(f"a state row of no known form (first byte {form!r})")
    if form == b"{":
        config = None
    elif config is None:
        raise ValueError("a state row without its config inline, and no config row")
    else:
        config = bytes(config)
    if form != WITHOUT_ANSWERED:
        answered = None
    elif answered is None:
        raise ValueError("a state row without its answered call ids inline, and no answered row")
    else:
        answered = bytes(answered)
    if thread_id is not None:
        found = _STATES.get(thread_id, raw, config, answered)
        if found is not None:
            return found
    if config is None:
        state = decode(ThreadState, raw)
    else:
        fields = typing.cast(dict[str, object], json.loads(raw[1:]))
        fields["config"] = json.loads(config)
        if answered is not None:
            fields["answered_calls"] = json.loads(answered)
        state = typing.cast(ThreadState, _record_from(ThreadState, fields))
    _STATES.put(state.thread_id, raw, config, answered, state)
    return state


def encode_entry(entry: HistoryEntry, canonical: bytes | None = None) -> bytes:
    """A history row: the wire record in Avro single-object encoding (schema-evolvable).

    `canonical`: the entry's `canonical_bytes` if the caller has them (the fold's
    `AppendHistory` does): the row is their framing, so the entry is not encoded again.
    Remembered like a state: the model stage reads the entries the step just appended.
    """
    raw = encode_value(entry) if canonical is None else single_object_header(HistoryEntry) + canonical
    _ENTRIES.put(raw, entry)
    return raw


def entry_canonical(raw: bytes) -> bytes:
    """The `canonical_bytes` of the entry history row `raw` holds (what its chain link covers).

    A row written under the current schema is its framing followed by exactly those bytes,
    so they are sliced out; a row from an older schema is decoded and encoded again.
    """
    header = single_object_header(HistoryEntry)
    if raw[:len(header)] == header:
        return bytes(raw[len(header):])
    return canonical_bytes(decode_entry(raw))


def decode_entry(raw: bytes) -> HistoryEntry:
    return _ENTRIES.get(bytes(raw), _decode_entry)


def read_entry_row(raw: bytes) -> tuple[HistoryEntry, bytes]:
    """The entry history row `raw` holds and its canonical bytes (`entry_canonical`), for a
    reader of many rows in a row (a thread's history read whole): the memo of recent entries
    is neither asked nor filled. Its 4,096 places serve the rows just written (the stage
    reads back what the step appended); a whole history streamed through it found nothing
    and evicted those, at the cost of hashing every row's bytes and an ordered-map update."""
    header, reader = _entry_reading()
    start = len(header)
    current = raw[:start] == header
    if current and reader is not None:
        try:
            value, end = reader(raw, start)
        except Exception:  # read again below by `decode_value`, which says what is wrong
            end = -1
        if end == len(raw) and isinstance(value, HistoryEntry):
            return value, bytes(raw[start:])
    entry = _decode_entry(raw)
    return entry, bytes(raw[start:]) if current else canonical_bytes(entry)


@functools.cache
def _entry_reading() -> tuple[bytes, Callable[[bytes, int], tuple[object, int]] | None]:
    """`straight_reading(HistoryEntry)`, looked up once: the shipped schemas do not change in a process."""
    return straight_reading(HistoryEntry)


def _decode_entry(raw: bytes) -> HistoryEntry:
    return decode_value(raw, HistoryEntry)


def encode_request(request: RequestCompletion) -> bytes:
    return encode(request)


def decode_request(raw: bytes) -> RequestCompletion:
    return decode(RequestCompletion, raw)


def encode_input(record: Input) -> bytes:
    """An input in the same canonical form (local mode's log, recordings, tests)."""
    return encode(record)


def decode_input(raw: bytes) -> Input:
    return decode(Input, raw)
