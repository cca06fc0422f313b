"""Group commit at the connector's intake: a batch of dispatches is journaled with one
synced write, and no tool is handed any of them before that write is synced."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from tests.connectors.test_journal import answer, dispatch
from torpor.connectors.intake import JournaledIntake
from torpor.connectors.journal import EffectJournal, EffectState
from torpor.schemas.codec import Codec
from torpor.schemas.records import Dispatch, Input, TextBlock, ToolResult


class SyncWatchingTool:
    """A performer that notes, for each dispatch it is handed, how many syncs the journal had made."""

    def __init__(self, journal: EffectJournal) -> None:
        self.journal = journal
        self.handed: list[tuple[str, int]] = []

    def submit(self, dispatch: Dispatch) -> None:
        self.handed.append((dispatch.request_id, self.journal.syncs))

    def reconcile(self, dispatch: Dispatch) -> bool:
        return False

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        raise AssertionError(f"submit never raises here, yet {dispatch.request_id} failed: {error!r}")


def _intake(journal: EffectJournal, produced: list[Input]) -> JournaledIntake:
    return JournaledIntake(journal, codec=Codec(), inputs_topic="t.inputs", max_bytes=262_144, signer=None,
                           clock=lambda: 1, produce=lambda record, _request, _value: produced.append(record))


def test_a_batch_of_dispatches_is_synced_once_before_any_tool_sees_one(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    tool = SyncWatchingTool(journal)
    batch = [dispatch(f"rq{n}", f"c{n}") for n in range(5)] + [dispatch("rq9", "c0", kind="cancel")]

    _intake(journal, []).route_all(batch, tool)

    assert journal.syncs == 1
    # In order; rq0 is not handed over at all: its call c0 was cancelled in the batch.
    assert [request for request, _ in tool.handed] == [d.request_id for d in batch[1:]]
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


class AnsweringTool:
    """A performer that answers each invoke at once, inside `submit` (the bench tool does)."""

    def __init__(self, send: Callable[[Input], None], fail_on: str | None = None) -> None:
        self.send = send
        self.fail_on = fail_on  # raise when handed this request (after answering the ones before)

    def submit(self, handed: Dispatch) -> None:
        if handed.request_id == self.fail_on:
            raise RuntimeError("the tool broke")
        self.send(answer(handed.request_id, handed.call_id))

    def reconcile(self, dispatch: Dispatch) -> bool:
        return False

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        done = answer(dispatch.request_id, dispatch.call_id)
        assert isinstance(done.body, ToolResult)
        body = dataclasses.replace(done.body, ok=False, content=(TextBlock(str(error)),))
        self.send(dataclasses.replace(done, body=body))


def _watched_intake(journal: EffectJournal, produced: list[tuple[str, int]]) -> JournaledIntake:
    """An intake whose transport notes, for each record produced, how many syncs the journal had made."""
    def produce(record: Input, _request: str | None, _value: bytes) -> None:
        produced.append((record.message_id, journal.syncs))

    return JournaledIntake(journal, codec=Codec(), inputs_topic="t.inputs", max_bytes=262_144, signer=None,
                           clock=lambda: 1, produce=produce)


def test_answers_given_while_a_batch_is_handed_over_are_synced_once_before_any_is_produced(
        tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[tuple[str, int]] = []
    intake = _watched_intake(journal, produced)
    batch = [dispatch(f"rq{n}", f"c{n}") for n in range(5)]

    intake.route_all(batch, AnsweringTool(intake.send))

    assert journal.syncs == 2  # the batch's dispatches, then its answers: not one per answer
    assert produced == [(f"rq{n}-result", 2) for n in range(5)]  # in order, none before the sync
    assert all(_state(journal, f"rq{n}") is EffectState.DONE for n in range(5))
    journal.close()
    reopened = EffectJournal(tmp_path / "journal")  # what was synced is on disk
    assert all(_state(reopened, f"rq{n}") is EffectState.DONE for n in range(5))


def test_an_answer_sent_after_the_batch_is_synced_and_produced_on_its_own(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[tuple[str, int]] = []
    intake = _watched_intake(journal, produced)
    intake.route_all([dispatch("rq1", "c1")], SyncWatchingTool(journal))  # a tool that answers later

    intake.send(answer("rq1", "c1"))

    assert journal.syncs == 2 and produced == [("rq1-result", 2)]
    assert _state(journal, "rq1") is EffectState.DONE


def test_a_tool_that_raises_mid_batch_has_that_call_answered_with_its_error_in_the_batch_group(
        tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[tuple[str, int]] = []
    intake = _watched_intake(journal, produced)
    batch = [dispatch(f"rq{n}", f"c{n}") for n in range(4)]

    intake.route_all(batch, AnsweringTool(intake.send, fail_on="rq2"))

    # rq2's error answer is synced and produced with the others, in order; rq3 still ran.
    assert produced == [(f"rq{n}-result", 2) for n in range(4)]
    assert all(_state(journal, f"rq{n}") is EffectState.DONE for n in range(4))
    intake.send(answer("rq9", "c9"))  # no batch open any more: a later answer goes out at once
    assert produced[-1] == ("rq9-result", 2)


KILLED_WHILE_ANSWERING = """
import os, signal, sys
from pathlib import Path
from tests.connectors.test_intake_group import AnsweringTool, _intake
from tests.connectors.test_journal import dispatch
from torpor.connectors.journal import EffectJournal

journal = EffectJournal(Path(sys.argv[1]))
intake = _intake(journal, [])
tool = AnsweringTool(intake.send)
real_submit = tool.submit

def submit(handed):
    if handed.request_id == "rq2":  # rq0 and rq1 answered, their rows not synced, nothing produced
        os.kill(os.getpid(), signal.SIGKILL)
    real_submit(handed)

tool.submit = submit
intake.route_all([dispatch(f"rq{n}", f"c{n}") for n in range(3)], tool)
"""


def test_a_connector_killed_while_a_batch_answers_re_sends_those_answers_and_reruns_none(
        tmp_path: Path) -> None:
    # kill -9 between the answers' journal rows and their sync: the rows are in the WAL, so
    # the next start re-sends those answers (none had gone out) and re-runs only the call
    # that never answered.
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", KILLED_WHILE_ANSWERING, str(tmp_path / "journal")], cwd=repo,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -9, done.stderr
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    tool = SyncWatchingTool(journal)  # notes what it is handed at start-up: the re-runs
    _intake(journal, produced).recover(tool)
    assert sorted(record.message_id for record in produced) == ["rq0-result", "rq1-result"]
    assert [request for request, _ in tool.handed] == ["rq2"]  # unknown, reconciled (no), re-run
    journal.close()
