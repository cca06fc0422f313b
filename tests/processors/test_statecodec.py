"""The store's row encodings: canonical (equal values, equal bytes) and lossless."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings

from tests.processors.fold_scenarios import call, completion, config, create, result, user
from tests.processors.test_fold_properties import CHOICES, session
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.state import ANSWERED_KEPT, CallKind, PendingCall, Status, ThreadState
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys, statecodec
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.statecodec import (
    WITHOUT_ANSWERED,
    WITHOUT_CONFIG,
    decode_entry,
    decode_input,
    decode_request,
    decode_state,
    encode_entry,
    encode_input,
    encode_request,
    encode_state,
    entry_canonical,
    read_entry_row,
)
from torpor.processors.store.tables import load_state, read_entries
from torpor.schemas.codec import canonical_bytes, decode_value, encode_value, single_object_header
from torpor.schemas.errors import DecodeError
from torpor.schemas.records import (
    AssistantEntry,
    HistoryEntry,
    ImageBlock,
    Input,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
    UserEntry,
    UserMessage,
)


def canonical_rows(state: ThreadState) -> tuple[bytes, bytes, bytes]:
    """The state row, config row and answered row `state` must encode to: one sorted dump of
    its fields but its config and answered call ids (after `WITHOUT_ANSWERED`), one of its
    config and one of its answered ids (what a cold replay writes)."""
    fields = statecodec._record_to(state)
    config, answered = fields.pop("config"), fields.pop("answered_calls")
    dumps = statecodec._dumps
    return WITHOUT_ANSWERED + dumps(fields).encode(), dumps(config).encode(), dumps(answered).encode()


def decoded(rows: tuple[bytes, bytes, bytes]) -> ThreadState:
    """The state the rows hold, decoded from the bytes (no thread id: the memo is not asked)."""
    return decode_state(*rows)


def a_state():  # type: ignore[no-untyped-def]
    store = MemoryStore()
    step(store, [StepRecord(Input("m1", "t1", 5, "user:u", None, None, None, create(config())), 0, 0)])
    state = load_state(store, "t1")
    assert state is not None
    return store, state


def test_a_state_round_trips_with_enums_unions_and_deferred_inputs() -> None:
    _, state = a_state()
    held = Input(
        "m2", "t1", 6, "user:u", 99, "k", b"\x00\xff", UserMessage((ImageBlock("image/png", b"\x89PNG"),))
    )
    call = PendingCall("c1", "search", "{}", False, CallKind.TOOL, "r1", 5, 0)
    richer = dataclasses.replace(state, status=Status.AWAITING_TOOLS, deferred=(held,), pending_calls=(call,))
    # The bytes themselves, decoded (decode_state with a thread id would answer from its memo).
    assert decoded(encode_state(richer)) == richer
    assert encode_state(richer) == encode_state(dataclasses.replace(richer))


def test_equal_states_give_equal_bytes_whatever_the_construction_order() -> None:
    _, state = a_state()
    again = decoded(encode_state(state))
    assert again is not state and encode_state(again) == encode_state(state)


def test_history_entries_requests_and_inputs_round_trip() -> None:
    store, _ = a_state()
    for entry in read_entries(store, "t1"):
        assert decode_value(encode_entry(entry), HistoryEntry) == entry
    request = RequestCompletion("r", "t1", "scripted", 3, 9)
    assert decode_request(encode_request(request)) == request
    item = Input("m", "t", 1, "user:u", None, None, None, user("hi"))
    assert decode_input(encode_input(item)) == item


def test_thinking_and_text_blocks_stay_apart() -> None:
    # Same field name (`text`): the union is tagged by class, never guessed from the fields.
    from torpor.schemas.records import AssistantEntry, TextBlock, Usage

    entry = HistoryEntry(
        0, 1, "m", AssistantEntry((ThinkingBlock("hm", None), TextBlock("hi")), (), "m", Usage(1, 1, 2))
    )
    assert decode_value(encode_entry(entry), HistoryEntry) == entry


def test_a_thread_s_older_state_row_decodes_to_itself_not_to_the_latest_one() -> None:
    _, state = a_state()
    old = encode_state(state)
    newer = dataclasses.replace(state, version=state.version + 1)
    encode_state(newer)  # now the thread's latest known row
    assert decode_state(*old, state.thread_id) == state
    assert decode_state(*encode_state(newer), state.thread_id) is newer  # the memo's hit
    other_config = dataclasses.replace(newer.config, system_prompt="another")
    state_row, _, answered_row = encode_state(newer)
    config_row = encode_state(dataclasses.replace(newer, config=other_config))[1]
    assert decode_state(state_row, config_row, answered_row, state.thread_id).config == other_config
    encode_state(newer)  # the latest again: a hit needs all three rows to be the ones remembered
    answered_row = encode_state(dataclasses.replace(newer, answered_calls=("c9",)))[2]
    state_row, config_row, _ = encode_state(newer)
    assert decode_state(state_row, config_row, answered_row, state.thread_id).answered_calls == ("c9",)


def test_a_memoised_entry_or_state_is_the_value_its_bytes_decode_to() -> None:
    store, state = a_state()
    for entry in read_entries(store, "t1"):
        raw = encode_entry(entry)
        assert decode_entry(raw) == decode_value(raw, HistoryEntry)
    rows = encode_state(state)
    assert decode_state(*rows, state.thread_id) == decoded(rows)


def test_a_state_s_bytes_are_one_sorted_dump_of_its_fields() -> None:
    # encode() writes a state around its remembered config text: the bytes must be those
    # of the plain canonical dump, or a replay (fresh process, cold memo) would differ.
    import json

    from torpor.processors.store.statecodec import _record_to

    _, state = a_state()
    held = Input("m2", "t1", 6, "user:u", 99, "k", b"\x00\xff", create(config(), initial="\u00e9t\u00e9"))
    call = PendingCall("c1", "search", "{}", False, CallKind.TOOL, "r1", 5, 0)
    for value in (state, dataclasses.replace(state, deferred=(held,), pending_calls=(call,))):
        fields = _record_to(value)
        inner = json.dumps(fields.pop("config"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        answered = json.dumps(fields.pop("answered_calls"), separators=(",", ":"), ensure_ascii=False)
        plain = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert encode_state(value) == (WITHOUT_ANSWERED + plain.encode(), inner.encode(), answered.encode())


def test_a_history_row_framed_from_the_folds_bytes_is_the_row_encoded_afresh() -> None:
    store, _ = a_state()
    for entry in read_entries(store, "t1"):
        canonical = canonical_bytes(entry)
        assert encode_entry(entry, canonical) == encode_entry(entry) == encode_value(entry)
        assert entry_canonical(encode_entry(entry)) == canonical


def test_a_history_row_of_another_schema_is_chained_over_its_entry_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, _ = a_state()
    (entry, *_) = read_entries(store, "t1")
    raw = encode_entry(entry)
    # As if the row had been written under an older HistoryEntry schema: its framing differs.
    monkeypatch.setattr(statecodec, "single_object_header", lambda cls: b"\xc3\x01" + b"\x00" * 8)
    assert entry_canonical(raw) == canonical_bytes(entry)


def some_entries() -> list[HistoryEntry]:
    """A thread's first entries and an assistant turn with reasoning, text, a tool call and an image."""
    store, _ = a_state()
    turn = AssistantEntry((ThinkingBlock("hm", "sig"), TextBlock("h\u00e9")),
                          (ToolCall("c1", "search", '{"q": 1}'),), "m", Usage(1, 2, 3))
    seen = UserEntry((ImageBlock("image/png", b"\x89PNG"), TextBlock("look")), True)
    return [*read_entries(store, "t1"), HistoryEntry(7, 8, "m8", turn), HistoryEntry(8, 9, "m9", seen)]


def test_a_history_row_read_in_a_run_is_its_entry_and_the_bytes_its_link_covers() -> None:
    for entry in some_entries():
        raw = encode_value(entry)
        read, canonical = read_entry_row(raw)
        assert read == decode_value(raw, HistoryEntry) == entry
        assert canonical == entry_canonical(raw) == canonical_bytes(entry)


def test_a_history_read_whole_leaves_the_rows_just_written_to_the_memo() -> None:
    # The memo serves the stage the rows the step just wrote; a long history read in a
    # run (a thread the stage's cache does not hold) must not push them out of it.
    written = some_entries()[-1]
    raw = encode_entry(written)  # remembered: its next read is this very object
    for seq in range(5_000):  # more rows than the memo holds
        read_entry_row(encode_value(dataclasses.replace(written, seq=1_000 + seq)))
    assert decode_entry(raw) is written


def test_a_history_row_its_reader_cannot_read_whole_is_refused_as_decode_entry_refuses_it() -> None:
    header = single_object_header(HistoryEntry)
    for raw in (header + b"\xff\xff\xff", encode_value(some_entries()[0]) + b"\x00"):
        with pytest.raises(DecodeError):
            decode_entry(raw)
        with pytest.raises(DecodeError):
            read_entry_row(raw)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHOICES)
def test_a_state_written_field_by_field_is_the_one_sorted_dump_of_it(choices: list[int]) -> None:
    # `encode` remembers composite fields' text by identity; the bytes must be those of one
    # canonical dump of the whole record, for every state a lifecycle goes through.
    world = session(choices)
    for state in (t.state for t in world.transitions if t.state is not None):
        assert encode_state(state) == canonical_rows(state) == encode_state(state)
        assert decoded(encode_state(state)) == state
    unicode = dataclasses.replace(a_state()[1], park_reason="zu groß \u2028 \"quoted\" \\", turns=-3)
    assert encode_state(unicode) == canonical_rows(unicode)


def test_a_state_drafted_from_the_last_one_written_reuses_its_pieces_and_writes_the_same_bytes() -> None:
    # encode_state re-encodes only the fields whose value is not the very object the thread's
    # last encoded state held; what it writes must still be the one sorted dump.
    _, state = a_state()
    encode_state(state)
    call = PendingCall("c1", "search", "{}", False, CallKind.TOOL, "r1", 5, 0)
    following = dataclasses.replace(state, pending_calls=(call,), turns=state.turns + 1, park_reason="p")
    earlier = statecodec._STATES.pieces(state.thread_id)
    assert earlier is not None and earlier[0][0] is state.answered_calls  # sorted: answered_calls first
    assert encode_state(following) == canonical_rows(following)
    # Back to the first state's values through other objects: the pieces follow the values.
    again = dataclasses.replace(following, pending_calls=(), turns=state.turns, park_reason=None)
    assert encode_state(again) == canonical_rows(state)


def test_records_of_one_field_or_none_encode_as_one_sorted_dump() -> None:
    # The pieces read a record's fields in one attrgetter call, which returns a bare value
    # for a single name: a record of one field must still be a JSON object of it.
    @dataclasses.dataclass(frozen=True)
    class One:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Zero:
        pass

    assert statecodec.encode(One(3)) == b'{"x":3}'
    assert statecodec.encode(Zero()) == b"{}"


def second_form_row(state: ThreadState) -> bytes:
    """The state row torpor wrote before the answered row: its config apart, its answered ids inline."""
    fields = statecodec._record_to(state)
    fields.pop("config")
    return WITHOUT_CONFIG + statecodec._dumps(fields).encode()


@pytest.mark.parametrize("form", ["config inline", "answered ids inline"])
def test_a_state_row_of_an_older_form_is_read_and_the_next_input_writes_all_three_rows(form: str) -> None:
    store, state = a_state()
    state = dataclasses.replace(state, answered_calls=("c1", "c2"))
    if form == "config inline":  # as a store written before the config row existed
        older = ((keys.state_key("t1"), statecodec.encode(state)), (keys.config_key("t1"), None))
    else:  # as one written before the answered row existed
        older = ((keys.state_key("t1"), second_form_row(state)),
                 (keys.config_key("t1"), encode_state(state)[1]))
    store.apply((*older, (keys.answered_key("t1"), None)))
    statecodec._STATES._by_thread.clear()  # a process that never wrote the rows it reads
    assert load_state(store, "t1") == state
    out = step(store, [StepRecord(Input("m9", "t1", 7, "user:u", None, None, None, user("hi")), 0, 1)])
    assert [r.disposition for r in out.receipts] == ["applied"]
    raw = store.get(keys.state_key("t1"))
    assert raw is not None and raw[:1] == WITHOUT_ANSWERED
    _, config_row, answered_row = encode_state(state)
    assert store.get(keys.config_key("t1")) == config_row
    assert store.get(keys.answered_key("t1")) == answered_row == b'["c1","c2"]'
    assert load_state(store, "t1") == decoded((raw, config_row, answered_row))


def test_a_side_row_left_beside_a_state_row_of_an_older_form_is_not_read() -> None:
    _, state = a_state()
    _, config_row, _ = encode_state(state)
    inline = statecodec.encode(state)
    assert decode_state(inline, b'{"not": "a config"}', b'["x"]') == state
    assert decode_state(second_form_row(state), config_row, b'["x"]') == state
    with pytest.raises(ValueError, match="no known form"):
        decode_state(b"\x07" + inline, config_row, b"[]")


def test_the_side_rows_are_written_at_the_creation_and_not_again_by_inputs_that_keep_them() -> None:
    store = MemoryStore()
    made = step(store, [StepRecord(Input("m1", "t1", 5, "user:u", None, None, None, create(config())), 0, 0)])
    made_keys = [k for k, _ in made.changes]
    assert made_keys.count(keys.config_key("t1")) == 1 and made_keys.count(keys.answered_key("t1")) == 1
    said = step(store, [StepRecord(Input("m2", "t1", 6, "user:u", None, None, None, user("hi")), 0, 1)])
    changed = [k for k, _ in said.changes]
    assert keys.state_key("t1") in changed
    assert keys.config_key("t1") not in changed and keys.answered_key("t1") not in changed


def test_a_state_row_without_a_side_row_is_refused_loudly() -> None:
    _, state = a_state()
    raw, config_row, answered_row = encode_state(state)
    with pytest.raises(ValueError, match="no config row"):
        decode_state(raw, None, answered_row)
    with pytest.raises(ValueError, match="no answered row"):
        decode_state(raw, config_row, None)
    with pytest.raises(ValueError, match="no config row"):
        decode_state(second_form_row(state), None, None)


def test_a_thread_created_again_in_another_store_gets_its_config_row() -> None:
    # The memo is per process and a replay folds the very same records beside the live
    # run: a creation must not take the live thread's remembered rows for its own.
    record = Input("m1", "t1", 5, "user:u", None, None, None, create(config()))
    live, replay = MemoryStore(), MemoryStore()
    step(live, [StepRecord(record, 0, 0)])
    step(live, [StepRecord(Input("m2", "t1", 6, "user:u", None, None, None, user("hi")), 0, 1)])
    step(replay, [StepRecord(record, 0, 0)])
    assert replay.get(keys.config_key("t1")) == live.get(keys.config_key("t1")) is not None
    assert replay.get(keys.answered_key("t1")) == live.get(keys.answered_key("t1")) is not None
    assert load_state(replay, "t1") is not None


def test_the_answered_row_is_written_when_a_call_is_answered_and_the_state_row_stays_small() -> None:
    store = MemoryStore()
    step(store, [StepRecord(Input("m1", "t1", 5, "user:u", None, None, None, create(config())), 0, 0)])
    offset, sizes = 1, []
    for turn in range(ANSWERED_KEPT + 4):  # past the ids a thread remembers
        state = load_state(store, "t1")
        assert state is not None and state.pending_request is not None
        request = state.pending_request
        reply = completion(request, "working", (call(f"call-{turn}", "fetch", {}),))
        step(store, [StepRecord(Input(request, "t1", 6, "processor", None, None, None, reply), 0, offset)])
        dispatched = load_state(store, "t1")
        assert dispatched is not None and dispatched.pending_calls
        pending = dispatched.pending_calls[0]
        answer = Input(f"r-{turn}", "t1", 7, "connector:tools", None, None, None,
                       result(pending.call_id, pending.request_id))
        out = step(store, [StepRecord(answer, 0, offset + 1)])
        assert [r.disposition for r in out.receipts] == ["applied"]
        changed = dict(out.changes)
        assert json.loads(changed[keys.answered_key("t1")])[-1] == pending.call_id  # written as answered
        sizes.append(len(changed[keys.state_key("t1")]))
        offset += 2
    final = load_state(store, "t1")
    assert final is not None and len(final.answered_calls) == ANSWERED_KEPT
    assert final.answered_calls[-1] == pending.call_id and store.get(keys.answered_key("t1")) == \
        json.dumps(list(final.answered_calls), separators=(",", ":")).encode()
    # The state row does not grow with the answered ids (9.7 KB of them at 256 inline).
    assert max(sizes) - min(sizes) < 100, (min(sizes), max(sizes))


def test_the_writer_reads_each_row_of_a_state_once_and_a_reader_beside_it_the_state_row_twice() -> None:
    store, state = a_state()
    read: list[bytes] = []

    class Counting(MemoryStore):
        def get(self, key: bytes) -> bytes | None:
            read.append(key)
            return store.get(key)

    counting = Counting()
    assert load_state(counting, "t1", writer=True) == state == load_state(counting, "t1")
    rows = [keys.state_key("t1"), keys.config_key("t1"), keys.answered_key("t1")]
    assert read == [*rows, *rows, keys.state_key("t1")]
