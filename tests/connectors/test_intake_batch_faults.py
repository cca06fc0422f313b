"""A tool that raises inside the intake (review 19): while a batch is handed over, while the
journal recovers at start, when asked to reconcile; and an invoke cancelled in its own batch.

Before the fix, a tool that raised when handed dispatch k left dispatches k+1..n journaled
but never handed to any tool: the next start took them for effects that may have run, and
an at-most-once tool answered them "may have run, not run again" though they never ran. A
tool whose `submit` raised every time made every start fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.connectors.test_intake_group import _intake
from tests.connectors.test_journal import dispatch
from tests.connectors.test_runtime import _produce, _results, _serve
from tests.processors.test_processor import Deployment, deployment
from torpor.connectors.inprocess import InProcessConnector, text
from torpor.connectors.intake import JournaledIntake
from torpor.connectors.journal import EffectJournal, EffectState
from torpor.schemas.records import Dispatch, Input, TextBlock, ToolResult, ToolSpec

__all__ = ["deployment"]  # the fixture, for the broker test

MAY_HAVE_RUN = "interrupted by a restart: may have run, not run again"
BROKE = "the tool broke"
EFFECT_SPEC = ToolSpec(name="effect", description="Acts at once.", parameters=json.dumps({"type": "object"}),
                       result_schema=None, passive=False, toolset="test")


class FlakyTool(InProcessConnector):
    """`effect`: acts and answers inside `submit`, unless the request is in `broken` (then it
    raises `error` before acting). At most once: its `reconcile` answers "may have run, not
    run again" without running (run_command does this), or raises if `reconcile_raises`."""

    name = "effect"
    specs = (EFFECT_SPEC,)

    def __init__(self, sink: Callable[[Input], None], clock: Callable[[], int] = lambda: 1, *,
                 broken: frozenset[str] = frozenset(), error: BaseException | None = None,
                 reconcile_raises: bool = False) -> None:
        super().__init__(sink, clock)
        self.broken = broken
        self.error = error or RuntimeError(BROKE)
        self.reconcile_raises = reconcile_raises
        self.acted: list[str] = []
        self.reconciled: list[str] = []

    def invoke(self, dispatch: Dispatch) -> None:
        if dispatch.request_id in self.broken:
            raise self.error.with_traceback(None)  # the same object each time: without the last traceback
        self.acted.append(dispatch.request_id)
        self.answer(dispatch, ok=True, content=text("done"))

    def reconcile(self, dispatch: Dispatch) -> bool:
        self.reconciled.append(dispatch.request_id)
        if self.reconcile_raises:
            raise RuntimeError("cannot tell")
        self.answer(dispatch, ok=False, content=text(MAY_HAVE_RUN))
        return True


def _answers(produced: list[Input]) -> list[tuple[str, bool, str]]:
    """(request id, ok, text) of each ToolResult produced, in order."""
    found = []
    for record in produced:
        assert isinstance(record.body, ToolResult)
        [block] = record.body.content
        assert isinstance(block, TextBlock)
        found.append((record.body.request_id, record.body.ok, block.text))
    return found


def _state(journal: EffectJournal, request_id: str) -> EffectState | None:
    effect = journal.entry(request_id)
    return None if effect is None else effect.state


def _wired(journal: EffectJournal, produced: list[Input],
           **tool: object) -> tuple[JournaledIntake, FlakyTool]:
    intake = _intake(journal, produced)
    return intake, FlakyTool(intake.send, **tool)  # type: ignore[arg-type]


# --- a tool that raises while a batch is handed over ---------------------------------


def test_dispatches_after_one_whose_tool_raised_run_in_the_same_batch_and_are_not_reconciled_later(
        tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced, broken=frozenset({"rq0"}))

    intake.route_all([dispatch("rq0", "c0"), dispatch("rq1", "c1"), dispatch("rq2", "c2")], tool)

    assert tool.acted == ["rq1", "rq2"]
    assert _answers(produced) == [("rq0", False, f"effect failed: RuntimeError: {BROKE}"),
                                  ("rq1", True, "done"), ("rq2", True, "done")]
    assert all(_state(journal, f"rq{n}") is EffectState.DONE for n in range(3))
    journal.close()

    journal = EffectJournal(tmp_path / "journal")  # the next start
    again: list[Input] = []
    intake, restarted = _wired(journal, again)
    intake.recover(restarted)
    assert restarted.reconciled == [] and restarted.acted == []  # nothing was left unknown
    assert sorted(r for r, _, _ in _answers(again)) == ["rq0", "rq1", "rq2"]  # undelivered: re-sent
    journal.close()


def test_a_tool_that_raises_on_every_dispatch_of_a_full_batch_answers_each_once_and_keeps_serving(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    requests = [f"rq{n}" for n in range(100)]
    intake, tool = _wired(journal, produced, broken=frozenset(requests))

    with caplog.at_level(logging.ERROR, logger="torpor.connectors.intake"):
        intake.route_all([dispatch(r, f"c{r}") for r in requests], tool)

    assert [(r, ok) for r, ok, _ in _answers(produced)] == [(r, False) for r in requests]
    assert journal.syncs == 2  # still one sync for the batch and one for its answers
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    # Each error once, naming its thread and request, with its traceback.
    assert [(record.thread_id, record.request_id) for record in errors] == [  # type: ignore[attr-defined]
        ("t1", r) for r in requests]
    assert all(record.exc_info is not None for record in errors)

    produced.clear()
    intake.route_all([dispatch("rq-next", "c-next")], tool)  # the next batch is served
    assert _answers(produced) == [("rq-next", True, "done")]


@pytest.mark.parametrize("error", [
    asyncio.CancelledError(),  # a BaseException; raised by a cancelled future's result(), the tool's own
    ValueError("\udc80 a lone surrogate"),  # would make the answer unencodable if copied as is
    type("Unprintable", (Exception,), {"__str__": lambda self: 1 / 0})(),
], ids=["cancelled-error", "lone-surrogate", "str-raises"])
def test_an_odd_error_from_the_tool_is_answered_and_the_batch_goes_on(
        tmp_path: Path, error: BaseException) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced, broken=frozenset({"rq0"}), error=error)

    intake.route_all([dispatch("rq0", "c0"), dispatch("rq1", "c1")], tool)

    [(first, ok, why), second] = _answers(produced)
    assert (first, ok) == ("rq0", False) and why.startswith(f"effect failed: {type(error).__name__}")
    assert second == ("rq1", True, "done")
    assert _state(journal, "rq0") is EffectState.DONE


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3)], ids=["ctrl-c", "exit"])
def test_an_interrupt_or_exit_inside_a_tool_still_stops_the_connector(
        tmp_path: Path, error: BaseException) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced, broken=frozenset({"rq1"}), error=error)

    with pytest.raises(type(error)):
        intake.route_all([dispatch("rq0", "c0"), dispatch("rq1", "c1"), dispatch("rq2", "c2")], tool)

    assert _answers(produced) == [("rq0", True, "done")]  # what was answered before is synced and produced
    assert _state(journal, "rq2") is EffectState.DISPATCHED  # the next start reconciles it


def test_a_tool_that_answered_before_it_raised_is_not_answered_twice(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced)
    act = tool.invoke

    def act_then_raise(handed: Dispatch) -> None:
        act(handed)
        raise RuntimeError("raised after answering")

    tool.invoke = act_then_raise  # type: ignore[method-assign]
    intake.route_all([dispatch("rq0", "c0")], tool)
    assert _answers(produced) == [("rq0", True, "done")]


def test_a_single_dispatch_routed_to_a_raising_tool_is_answered_with_its_error(tmp_path: Path) -> None:
    """`route`, one dispatch at a time: the Faust adapter's path."""
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced, broken=frozenset({"rq0"}))
    intake.route(dispatch("rq0", "c0"), tool)
    assert _answers(produced) == [("rq0", False, f"effect failed: RuntimeError: {BROKE}")]


class AwaitsDecision(FlakyTool):
    """Waits for a person on invoke; raises when handed the decision."""

    def invoke(self, dispatch: Dispatch) -> None:
        self.acted.append(dispatch.request_id)

    def decide(self, dispatch: Dispatch) -> None:
        raise RuntimeError("the decision broke it")


def test_a_tool_that_raises_on_an_approval_decision_answers_the_call_it_decides(tmp_path: Path) -> None:
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake = _intake(journal, produced)
    tool = AwaitsDecision(intake.send)
    intake.route_all([dispatch("rq0", "c0")], tool)
    assert produced == []  # waiting

    intake.route_all([dispatch("rq-decision", "c0", kind="approval_decision")], tool)

    assert _answers(produced) == [("rq0", False, "effect failed: RuntimeError: the decision broke it")]
    assert _state(journal, "rq0") is EffectState.DONE


# --- a tool that raises while the journal recovers at start ---------------------------


def _died_running(path: Path, *requests: str) -> None:
    """A previous process journaled `requests` and died before any was answered."""
    journal = EffectJournal(path)
    for request in requests:
        journal.begin(dispatch(request, f"c-{request}"), 1)
    journal.close()


class RerunsAndBreaks(FlakyTool):
    def reconcile(self, dispatch: Dispatch) -> bool:
        self.reconciled.append(dispatch.request_id)
        return False  # idempotent: run it again


def test_a_tool_whose_submit_raises_at_every_start_answers_the_call_and_does_not_stop_the_start(
        tmp_path: Path) -> None:
    _died_running(tmp_path / "journal", "rq0", "rq1")
    for _ in range(2):  # each start of the connector
        journal = EffectJournal(tmp_path / "journal")
        produced: list[Input] = []
        intake = _intake(journal, produced)
        tool = RerunsAndBreaks(intake.send, broken=frozenset({"rq0"}))
        intake.recover(tool)  # does not raise
        journal.close()
    # The first start answered rq0 with its error and re-ran rq1; the second only re-sent
    # the undelivered answers (the test's transport acknowledges nothing).
    assert tool.reconciled == []
    assert sorted(_answers(produced)) == [("rq0", False, f"effect failed: RuntimeError: {BROKE}"),
                                         ("rq1", True, "done")]


def test_a_tool_whose_reconcile_raises_answers_the_call_with_its_error_and_does_not_run_it_again(
        tmp_path: Path) -> None:
    _died_running(tmp_path / "journal", "rq0", "rq1")
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced, reconcile_raises=True)

    intake.recover(tool)

    assert tool.reconciled == ["rq0", "rq1"] and tool.acted == []  # it cannot say: not run again
    assert sorted(_answers(produced)) == [("rq0", False, "effect failed: RuntimeError: cannot tell"),
                                         ("rq1", False, "effect failed: RuntimeError: cannot tell")]
    assert _state(journal, "rq0") is EffectState.DONE


# --- an invoke cancelled in its own batch ---------------------------------------------


@pytest.mark.parametrize("kind", ["cancel", "close_thread"])
def test_an_invoke_cancelled_in_its_own_batch_is_not_handed_to_the_tool(tmp_path: Path, kind: str) -> None:
    """The journal says `cancelled` before the tool is handed the invoke (both wait for the
    batch's sync). The fold answered the call itself when it cancelled it ("interrupted"),
    so the tool owes nothing: it is not handed the invoke, and nothing is produced."""
    journal = EffectJournal(tmp_path / "journal")
    produced: list[Input] = []
    intake, tool = _wired(journal, produced)

    intake.route_all([dispatch("rq0", "c0"), dispatch("rq1", "c1", thread_id="t2"),
                      dispatch("rq9", "c0", kind=kind)], tool)

    assert tool.acted == ["rq1"]  # another thread's call runs
    assert _state(journal, "rq0") is EffectState.CANCELLED
    assert _answers(produced) == [("rq1", True, "done")]


# --- against a broker -----------------------------------------------------------------


def _invoke(n: int) -> Dispatch:
    return dispatch(f"rq-{n}", f"c-{n}", thread_id=f"t-{n}")


class BrokenOnFirst(FlakyTool):
    def __init__(self, sink: Callable[[Input], None], clock: Callable[[], int]) -> None:
        super().__init__(sink, clock, broken=frozenset({"rq-0"}))


@pytest.mark.kafka
def test_the_runtime_answers_a_dispatch_whose_tool_raised_and_serves_the_rest(
        deployment: Deployment, tmp_path: Path) -> None:
    _produce(deployment, *(_invoke(n) for n in range(3)))
    _serve(deployment, tmp_path / "journal", lambda _: len(_results(deployment)) >= 3, factory=BrokenOnFirst)
    found = {r.request_id: r.ok for r in _results(deployment)}
    assert found == {"rq-0": False, "rq-1": True, "rq-2": True}
    journal = EffectJournal(tmp_path / "journal")
    assert {e.state for e in journal.effects()} == {EffectState.DELIVERED}
    journal.close()
