"""The intake encodes an answer once: the bytes produced are the ones journaled (no registry),
and with a registry the journal still keeps an encoding it can read back on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.connectors.test_intake_group import AnsweringTool
from tests.connectors.test_journal import dispatch
from torpor.connectors.intake import JournaledIntake
from torpor.connectors.journal import EffectJournal, EffectState
from torpor.schemas.codec import Codec, encode_value
from torpor.schemas.records import Input


@pytest.mark.parametrize("registry", [None, "mock://intake-encoding"])
def test_an_answer_is_produced_as_framed_and_journaled_readably(tmp_path: Path, registry: str | None) -> None:
    codec = Codec.from_url(registry)
    journal = EffectJournal(tmp_path / "journal")
    produced: list[tuple[Input, bytes]] = []
    intake = JournaledIntake(journal, codec=codec, inputs_topic="t.inputs", max_bytes=262_144, signer=None,
                             clock=lambda: 1,
                             produce=lambda record, _request, value: produced.append((record, value)))

    intake.route_all([dispatch("rq1", "c1")], AnsweringTool(intake.send))

    ((record, value),) = produced
    assert codec.decode("t.inputs", value, Input) == record
    if registry is None:
        assert value == encode_value(record)  # one encoding, for the broker and the journal
    journal.close()
    reopened = EffectJournal(tmp_path / "journal")
    effect = reopened.entry("rq1")
    assert effect is not None and effect.state is EffectState.DONE and effect.answer == record
    reopened.close()
