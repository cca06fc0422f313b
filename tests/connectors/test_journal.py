"""The effect journal's state machine, in memory and in RocksDB (reopened as after a crash)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from torpor.connectors.journal import EffectJournal, EffectState
from torpor.schemas.records import Capability, Dispatch, Input, TextBlock, ToolResult

CAPABILITY = Capability(tenant="acme", tools=("effect",), scopes=(), expires_at=None)


def dispatch(request_id: str = "rq1", call_id: str = "c1", kind: str = "invoke",
             thread_id: str = "t1") -> Dispatch:
    return Dispatch(request_id=request_id, thread_id=thread_id, call_id=call_id, tool="effect",
                    arguments="{}", capability=CAPABILITY, attempt=0, created_at=1, deadline=None, kind=kind)


def answer(request_id: str = "rq1", call_id: str = "c1") -> Input:
    return Input(message_id=f"{request_id}-result", thread_id="t1", created_at=2, source="connector:effect",
                 expires_at=None, key_id=None, signature=None,
                 body=ToolResult(call_id, request_id, True, (TextBlock("ok"),), False))


Open = Callable[[], EffectJournal]


@pytest.fixture(params=["memory", "rocksdb"])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Open:
    """Opens the journal again: the same one in memory, the same directory for RocksDB."""
    if request.param == "memory":
        journal = EffectJournal()
        return lambda: journal
    opened: list[EffectJournal] = []

    def again() -> EffectJournal:
        for journal in opened:
            journal.close()
        opened.append(EffectJournal(tmp_path / "journal"))
        return opened[-1]

    return again


def test_an_invoke_runs_once_and_a_redelivery_is_recognised(reopen: Open) -> None:
    journal = reopen()
    assert journal.begin(dispatch(), 10) is None
    again = journal.begin(dispatch(), 11)
    assert again is not None and again.state == EffectState.DISPATCHED
    assert journal.running() == 1


def test_done_then_delivered_keeps_the_answer(reopen: Open) -> None:
    journal = reopen()
    journal.begin(dispatch(), 10)
    journal.finish("rq1", answer(), 20)
    journal = reopen()
    found = journal.entry("rq1")
    assert found is not None and found.state == EffectState.DONE and found.answer == answer()
    journal.delivered("rq1", 30)
    found = journal.entry("rq1")
    assert found is not None and found.state == EffectState.DELIVERED
    assert journal.running() == 0


def test_recover_after_a_crash_marks_running_effects_unknown_and_lists_undelivered(reopen: Open) -> None:
    journal = reopen()
    journal.begin(dispatch("rq1", "c1"), 10)
    journal.begin(dispatch("rq2", "c2"), 10)
    journal.finish("rq2", answer("rq2", "c2"), 11)
    journal.begin(dispatch("rq3", "c3"), 10)
    journal.finish("rq3", answer("rq3", "c3"), 11)
    journal.delivered("rq3", 12)
    journal = reopen()  # the process died here
    found = {e.request_id: e.state for e in journal.recover(100)}
    assert found == {"rq1": EffectState.UNKNOWN, "rq2": EffectState.DONE}
    journal.restart("rq1", 101)
    effect = journal.entry("rq1")
    assert effect is not None and effect.state == EffectState.DISPATCHED


def test_cancel_ends_the_running_effect_of_the_call_only(reopen: Open) -> None:
    journal = reopen()
    journal.begin(dispatch("rq1", "c1"), 10)
    assert journal.cancel("t1", "c1", 20) == "rq1"
    assert journal.cancel("t1", "c1", 21) is None  # already cancelled
    assert journal.cancel("t1", "c9", 21) is None  # never ran
    effect = journal.entry("rq1")
    assert effect is not None and effect.state == EffectState.CANCELLED
    assert journal.recover(30) == []


def test_a_decision_is_kept_with_its_running_effect(reopen: Open) -> None:
    journal = reopen()
    journal.begin(dispatch("rq1", "c1"), 10)
    decision = dispatch("rq1-decision", "c1", kind="approval_decision")
    assert journal.follow(decision, 11)
    assert journal.follow(decision, 12)  # a redelivered decision is kept once
    assert not journal.follow(dispatch("x", "c9", kind="approval_decision"), 12)
    journal = reopen()
    (effect,) = journal.recover(20)
    assert effect.followups == (decision,)


def test_close_thread_finds_the_threads_running_calls(reopen: Open) -> None:
    journal = reopen()
    journal.begin(dispatch("rq1", "c1"), 10)
    journal.begin(dispatch("rq2", "c2"), 10)
    journal.begin(dispatch("rq3", "c3", thread_id="t2"), 10)
    journal.finish("rq2", answer("rq2", "c2"), 11)
    assert journal.running_calls("t1") == ["c1"]


def test_prune_forgets_only_settled_effects_older_than_the_window(reopen: Open) -> None:
    journal = reopen()
    for n in range(3):
        journal.begin(dispatch(f"rq{n}", f"c{n}"), 10)
    journal.finish("rq0", answer("rq0", "c0"), 11)
    journal.delivered("rq0", 12)
    journal.cancel("t1", "c1", 13)
    assert journal.prune(before_ms=12) == 0  # rq0 touched at 12: not older than the window
    assert journal.prune(before_ms=100) == 2
    assert [e.request_id for e in journal.effects()] == ["rq2"]
    assert journal.begin(dispatch("rq0", "c0"), 200) is None  # forgotten: it would run again


def test_a_journal_on_disk_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = EffectJournal(path)
    try:
        assert path.stat().st_mode & 0o777 == 0o700, oct(path.stat().st_mode)
    finally:
        journal.close()


def test_begin_is_one_synced_write_and_delivered_none(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    assert journal.begin(dispatch(), 1) is None
    assert journal.syncs == 1  # the effect and its call row, one batch
    journal.finish("rq1", answer(), 2)
    assert journal.syncs == 2
    journal.delivered("rq1", 3)
    assert journal.syncs == 2  # losing it only re-sends the answer, which is absorbed
    journal.close()
    again = EffectJournal(tmp_path / "journal")
    effect = again.entry("rq1")
    assert effect is not None and effect.state == EffectState.DELIVERED
    again.close()


def test_a_group_of_begins_is_synced_once_and_read_back_inside_and_after(reopen: Open) -> None:
    journal = reopen()
    with journal.group():
        for i in range(5):
            assert journal.begin(dispatch(f"rq{i}", f"c{i}"), 1) is None
            found = journal.begin(dispatch(f"rq{i}", f"c{i}"), 1)  # redelivered inside the group
            assert found is not None and found.state == EffectState.DISPATCHED
        with journal.group():  # nested: only the outermost block syncs
            journal.finish("rq0", answer("rq0", "c0"), 2)
        assert journal.syncs == 0
    assert journal.syncs == (1 if journal.path is not None else 0)
    journal = reopen()
    assert sorted(e.request_id for e in journal.effects()) == [f"rq{i}" for i in range(5)]
    assert journal.cancel("t1", "c1", 3) == "rq1"


KILLED_IN_A_GROUP = """
import os, signal, sys
from pathlib import Path
from tests.connectors.test_journal import answer, dispatch
from torpor.connectors.journal import EffectJournal
journal = EffectJournal(Path(sys.argv[1]))
with journal.group():
    journal.begin(dispatch("rq1", "c1"), 1)
    journal.begin(dispatch("rq2", "c2"), 1)
    journal.finish("rq1", answer("rq1", "c1"), 2)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_connector_killed_inside_a_group_keeps_every_write_of_it(tmp_path: Path) -> None:
    # The writes of a group are in the WAL before its sync: a kill -9 loses none of them
    # (only a machine crash could, and no tool has seen them before the sync).
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", KILLED_IN_A_GROUP, str(tmp_path / "journal")], cwd=repo,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -9, done.stderr
    journal = EffectJournal(tmp_path / "journal")
    states = {e.request_id: e.state for e in journal.effects()}
    assert states == {"rq1": EffectState.DONE, "rq2": EffectState.DISPATCHED}
    recovered = journal.recover(3)
    assert sorted(e.request_id for e in recovered) == ["rq1", "rq2"]
    journal.close()


def test_an_effect_served_from_memory_is_the_one_its_row_decodes_to(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    journal.begin(dispatch(), 1)
    journal.finish("rq1", answer(), 2)
    journal.delivered("rq1", 3)
    remembered = journal.entry("rq1")
    journal.close()
    assert remembered == EffectJournal(tmp_path / "journal").entry("rq1")
    assert remembered is not None and remembered.state == EffectState.DELIVERED


def test_every_move_of_an_effect_is_told_once_and_followups_and_redeliveries_are_not(reopen: Open) -> None:
    journal = reopen()
    moves: list[tuple[str, EffectState]] = []
    journal.on_moved = lambda effect: moves.append((effect.request_id, effect.state))
    journal.begin(dispatch("rq1", "c1"), 1)
    journal.begin(dispatch("rq1", "c1"), 2)  # redelivered: already journaled, no move
    journal.begin(dispatch("rq2", "c2"), 3)
    journal.follow(dispatch("rq9", "c2", kind="approval_decision"), 4)  # kept with rq2, no move
    journal.finish("rq1", answer("rq1", "c1"), 5)
    journal.delivered("rq1", 6)
    journal.delivered("rq1", 7)  # delivered already: no move
    journal.cancel("t1", "c2", 8)
    journal.begin(dispatch("rq3", "c3"), 9)
    journal.recover(10)
    journal.restart("rq3", 11)
    s = EffectState
    assert moves == [("rq1", s.DISPATCHED), ("rq2", s.DISPATCHED), ("rq1", s.DONE), ("rq1", s.DELIVERED),
                     ("rq2", s.CANCELLED), ("rq3", s.DISPATCHED), ("rq3", s.UNKNOWN), ("rq3", s.DISPATCHED)]
