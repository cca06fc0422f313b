"""Group commit at the connector's intake: a batch of dispatches is journaled with one
synced write, and no tool is handed any of them before that write is synced."""

from __future__ import annotations

from pathlib import Path

from tests.connectors.test_journal import dispatch
from torpor.connectors.intake import JournaledIntake
from torpor.connectors.journal import EffectJournal, EffectState
from torpor.schemas.codec import Codec
from torpor.schemas.records import Dispatch, Input


class SyncWatchingTool:
    """A performer that notes, for each dispatch it is handed, how many syncs the journal had made."""

    def __init__(self, journal: EffectJournal) -> None:
        self.journal = journal
        self.handed: list[tuple[str, int]] = []

    def submit(self, dispatch: Dispatch) -> None:
        self.handed.append((dispatch.request_id, self.journal.syncs))

    def reconcile(self, dispatch: Dispatch) -> bool:
        return False


def _intake(journal: EffectJournal, produced: list[Input]) -> JournaledIntake:
    return JournaledIntake(journal, codec=Codec(), inputs_topic="t.inputs", max_bytes=262_144, signer=None,
                           clock=lambda: 1, produce=lambda record, _request: produced.append(record))


def test_a_batch_of_dispatches_is_synced_once_before_any_tool_sees_one(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    tool = SyncWatchingTool(journal)
    batch = [dispatch(f"rq{n}", f"c{n}") for n in range(5)] + [dispatch("rq9", "c0", kind="cancel")]

    _intake(journal, []).route_all(batch, tool)

    assert journal.syncs == 1
    assert [request for request, _ in tool.handed] == [d.request_id for d in batch]  # in order
    assert all(syncs == 1 for _, syncs in tool.handed)  # none before the batch's sync
    assert _state(journal, "rq1") is EffectState.DISPATCHED
    assert _state(journal, "rq0") is EffectState.CANCELLED  # its call c0 was cancelled in the batch


def _state(journal: EffectJournal, request_id: str) -> EffectState | None:
    effect = journal.entry(request_id)
    return None if effect is None else effect.state


def test_a_redelivered_batch_runs_nothing_again(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    first, again = SyncWatchingTool(journal), SyncWatchingTool(journal)
    batch = [dispatch(f"rq{n}", f"c{n}") for n in range(3)]
    intake = _intake(journal, [])
    intake.route_all(batch, first)
    intake.route_all(batch, again)  # the same records, redelivered after a lost offset commit
    assert len(first.handed) == 3 and again.handed == []
