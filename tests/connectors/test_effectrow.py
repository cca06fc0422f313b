"""The journal's rows: format 1 round-trips, rows written before it still read, bad rows refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from tests.connectors.test_journal import answer, dispatch
from torpor.connectors.effectrow import Effect, EffectState, decode_row, encoded
from torpor.connectors.journal import EffectJournal
from torpor.schemas.codec import encode_value

DECISION = dispatch("rq7", "c1", kind="approval_decision")
EFFECTS = [
    Effect(dispatch(), EffectState.DISPATCHED, 1),
    Effect(dispatch(), EffectState.DONE, 2**40, answer()),
    Effect(dispatch(), EffectState.UNKNOWN, -5, None,
           (DECISION, dispatch("rq8", "c1", kind="approval_decision"))),
    *(Effect(dispatch(), state, 3, answer(), (DECISION,)) for state in EffectState),
]


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_row_reads_back_as_the_effect_written(effect: Effect) -> None:
    row = encoded(effect)
    assert decode_row(row.row()) == row
    assert row.row()[:1] == b"\x01"


def _json_row(effect: Effect) -> bytes:
    """A row as the journal wrote them before format 1 (issue 18): JSON around hex Avro."""
    return json.dumps({
        "state": effect.state.value,
        "updated_at": effect.updated_at,
        "dispatch": encode_value(effect.dispatch).hex(),
        "answer": None if effect.answer is None else encode_value(effect.answer).hex(),
        "followups": [encode_value(f).hex() for f in effect.followups],
    }).encode("utf-8")


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_row_written_before_format_1_still_reads(effect: Effect) -> None:
    assert decode_row(_json_row(effect)).effect == effect


def test_a_journal_of_old_rows_recovers_them_and_writes_its_own_format(tmp_path: Path) -> None:
    old = Rdict(str(tmp_path / "journal"), Options(raw_mode=True))
    old[b"e/rq1"] = _json_row(Effect(dispatch("rq1", "c1"), EffectState.DONE, 1, answer("rq1", "c1")))
    old[b"e/rq2"] = _json_row(Effect(dispatch("rq2", "c2"), EffectState.DISPATCHED, 1))
    old[b"c/t1\x00c2"] = b"rq2"
    old.close()
    journal = EffectJournal(tmp_path / "journal")
    found = {e.request_id: e for e in journal.recover(5)}
    assert found["rq1"].state is EffectState.DONE and found["rq1"].answer == answer("rq1", "c1")
    assert found["rq2"].state is EffectState.UNKNOWN  # rewritten, in format 1
    journal.cancel("t1", "c2", 6)
    journal.close()
    reopened = Rdict(str(tmp_path / "journal"), Options(raw_mode=True))
    try:
        assert reopened[b"e/rq2"][:1] == b"\x01" and reopened[b"e/rq1"][:1] == b"{"
        assert decode_row(reopened[b"e/rq2"]).effect.state is EffectState.CANCELLED
    finally:
        reopened.close()


def test_a_rewritten_effect_encodes_only_the_records_it_does_not_share() -> None:
    begun = encoded(Effect(dispatch(), EffectState.DISPATCHED, 1))
    done = encoded(Effect(begun.effect.dispatch, EffectState.DONE, 2, answer()), begun)
    delivered = encoded(dataclasses.replace(done.effect, state=EffectState.DELIVERED), done)
    assert done.dispatch is begun.dispatch and delivered.answer is done.answer
    assert decode_row(delivered.row()).effect == delivered.effect
    other = encoded(Effect(dispatch("rq2"), EffectState.DISPATCHED, 1), begun)  # not the same records
    assert decode_row(other.row()).effect.request_id == "rq2"


@pytest.mark.parametrize("raw", [b"", b"\x02" + bytes(22), b"[]", b"\x01\x00"])
def test_a_row_in_no_known_format_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="journal row"):
        decode_row(raw)


def test_a_row_cut_short_anywhere_is_refused() -> None:
    row = encoded(EFFECTS[-1]).row()
    for end in range(len(row)):
        with pytest.raises(ValueError, match="journal row"):
            decode_row(row[:end])
    with pytest.raises(ValueError, match="journal row"):
        decode_row(row + b"\x00")
