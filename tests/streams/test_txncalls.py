"""librdkafka's rules for transaction calls, as `txncalls.remedy` and `run_call` apply them.

The pure table first, then `run_call` driving a call that fails the way librdkafka's
does (the errors are built with the flags librdkafka sets; no broker is involved: the
broker case is `test_loop.py::test_a_commit_that_times_out_is_resumed_not_aborted`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from torpor.schemas.errors import CheckpointAbortedError, FencedError
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate
from torpor.streams.txncalls import (
    MAX_PAUSE_S,
    Remedy,
    RetriesExhaustedError,
    TxnCall,
    UnrecoverableCallError,
    WatchdogExpiredError,
    backoff,
    remedy,
    run_call,
    watched,
)

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT,
                       "Timed out waiting for operation to finish, retry call to resume", retriable=True)
CONFLICT = KafkaError(KafkaError._CONFLICT, "Conflicting commit_transaction API call is already in progress",
                      retriable=True)
ABORTABLE = KafkaError(KafkaError._INCONSISTENT, "1 message(s) failed delivery", txn_requires_abort=True)
FENCED = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
PLAIN = KafkaError(KafkaError._STATE, "Operation not valid in state Ready")


def test_a_retriable_commit_or_abort_is_called_again_never_aborted() -> None:
    for call in (TxnCall.COMMIT, TxnCall.ABORT, TxnCall.INIT, TxnCall.SEND_OFFSETS):
        for error in (TIMED_OUT, CONFLICT):
            assert remedy(call, translate(error), budget_left=1.0) is Remedy.RETRY


def test_an_exhausted_commit_exits_because_an_abort_would_conflict_with_it() -> None:
    for call in (TxnCall.COMMIT, TxnCall.ABORT, TxnCall.INIT):
        assert remedy(call, translate(TIMED_OUT), budget_left=0.0) is Remedy.EXIT
    # send_offsets_to_transaction is not resumable: abort_transaction may follow it.
    assert remedy(TxnCall.SEND_OFFSETS, translate(TIMED_OUT), budget_left=0.0) is Remedy.ABORT


def test_an_abortable_error_aborts_and_a_fatal_one_exits_whatever_the_budget() -> None:
    for budget in (0.0, 10.0):
        assert remedy(TxnCall.COMMIT, translate(ABORTABLE), budget_left=budget) is Remedy.ABORT
        assert remedy(TxnCall.SEND_OFFSETS, translate(ABORTABLE), budget_left=budget) is Remedy.ABORT
        assert remedy(TxnCall.ABORT, translate(ABORTABLE), budget_left=budget) is Remedy.EXIT
        for call in TxnCall:
            assert remedy(call, translate(FENCED), budget_left=budget) is Remedy.EXIT
            assert remedy(call, translate(PLAIN), budget_left=budget) is Remedy.EXIT


def test_the_backoff_doubles_to_a_ceiling_and_never_reaches_zero() -> None:
    pauses = [backoff(n) for n in range(1, 40)]
    assert all(0 < p <= MAX_PAUSE_S for p in pauses)
    assert pauses == sorted(pauses) and pauses[-1] == MAX_PAUSE_S
    assert pauses[1] == 2 * pauses[0]
    with pytest.raises(ValueError):
        backoff(0)


def failing(*errors: KafkaError, then: str = "done") -> Callable[[float], str]:
    """A call that raises each of `errors` in turn (as librdkafka's KafkaException), then returns."""
    queue = list(errors)

    def call(timeout: float) -> str:
        assert timeout > 0
        if queue:
            raise KafkaException(queue.pop(0))
        return then
    return call


def test_a_commit_timed_out_then_conflicting_is_resumed_until_it_succeeds_with_pauses() -> None:
    pauses: list[float] = []
    result = run_call(TxnCall.COMMIT, failing(TIMED_OUT, CONFLICT, CONFLICT, TIMED_OUT), per_call=1.0,
                      budget=Deadline.after(60), grace=5.0, sleep=pauses.append)
    assert result == "done"
    assert len(pauses) == 4 and all(p > 0 for p in pauses)  # never back to back


def test_a_commit_failing_past_its_budget_exits_with_one_clear_error() -> None:
    now = itertools.count()
    budget = Deadline.after(5, clock=lambda: float(next(now)))
    pauses: list[float] = []
    with pytest.raises(RetriesExhaustedError, match=r"commit_transaction kept failing .* may only be called "
                                                    r"again, not aborted") as raised:
        run_call(TxnCall.COMMIT, failing(*[TIMED_OUT] * 100), per_call=1.0, budget=budget, grace=5.0,
                 sleep=pauses.append)
    assert isinstance(raised.value, FencedError)  # the loop's callers exit on it
    assert len(pauses) < 10


def test_send_offsets_past_its_deadline_asks_for_an_abort() -> None:
    with pytest.raises(CheckpointAbortedError, match="send_offsets_to_transaction kept failing"):
        run_call(TxnCall.SEND_OFFSETS, failing(*[TIMED_OUT] * 100), per_call=1.0,
                 budget=Deadline.after(0), grace=5.0, sleep=lambda s: None)


def test_an_abortable_commit_asks_for_an_abort_and_an_abortable_abort_exits() -> None:
    with pytest.raises(CheckpointAbortedError):
        run_call(TxnCall.COMMIT, failing(ABORTABLE), per_call=1.0, budget=Deadline.after(60), grace=5.0)
    with pytest.raises(UnrecoverableCallError):
        run_call(TxnCall.ABORT, failing(ABORTABLE), per_call=1.0, budget=Deadline.after(60), grace=5.0)
    with pytest.raises(FencedError):
        run_call(TxnCall.COMMIT, failing(FENCED), per_call=1.0, budget=Deadline.after(60), grace=5.0)


def test_a_hung_call_is_declared_hung_and_the_next_call_gets_a_fresh_worker() -> None:
    release = threading.Event()
    try:
        with pytest.raises(WatchdogExpiredError, match=r"commit_transaction did not return within 0\.1s"):
            watched("commit_transaction", lambda timeout: release.wait(30), 0.05, 0.05)
        # The hung call still holds its worker: a call queued behind it would be declared hung too.
        assert watched("abort_transaction", lambda timeout: "aborted", 30.0, 30.0) == "aborted"
    finally:
        release.set()  # let the abandoned worker's call end


def test_watched_calls_run_off_the_calling_thread_on_one_worker_per_caller() -> None:
    def runner(timeout: float) -> str:
        return threading.current_thread().name

    here = threading.current_thread().name
    first = watched("commit_transaction", runner, 1.0, 1.0)
    assert first != here and watched("commit_transaction", runner, 1.0, 1.0) == first  # reused
    elsewhere: list[str] = []
    other = threading.Thread(target=lambda: elsewhere.append(watched("commit_transaction", runner, 1.0, 1.0)))
    other.start()
    other.join(30)
    assert elsewhere and elsewhere[0] not in (first, here)  # another caller's calls never queue behind ours


def test_a_callers_worker_thread_ends_when_the_calling_thread_ends() -> None:
    def runner(timeout: float) -> threading.Thread:
        return threading.current_thread()

    workers: list[threading.Thread] = []
    caller = threading.Thread(target=lambda: workers.append(watched("commit_transaction", runner, 1.0, 1.0)))
    caller.start()
    caller.join(30)
    [worker] = workers
    # Its thread-local worker is collected with the caller; the finalizer tells the thread to end.
    worker.join(60)
    assert not worker.is_alive(), f"{worker.name} idles on after its caller ended"
