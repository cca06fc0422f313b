"""The transactional producer's calls under librdkafka's rules: retry, abort, or exit.

librdkafka's transactional API (rdkafka.h, `rd_kafka_commit_transaction` and siblings)
says what a failed call asks of the caller, by the error's flags:

- retriable: call the SAME function again. A timed-out `commit_transaction` or
  `abort_transaction` (`_TIMED_OUT`, "retry call to resume") keeps running in the
  background, and until it is resumed to completion every other transactional call is
  refused with `_CONFLICT` ("Conflicting commit_transaction API call is already in
  progress"). Aborting a commit that timed out is therefore not a remedy: it spins.
- `txn_requires_abort()`: call `abort_transaction`, then start a new transaction.
- fatal (or fenced): the producer is unusable; exit, and let the restart's
  `init_transactions` (same `transactional.id`) settle whatever was left open.

`remedy(call, error, budget_left)` is that table as a pure function, with one Torpor
rule on top: a retry is taken only while the call's budget lasts. Exhausted, a
retriable `send_offsets_to_transaction` aborts the checkpoint (that call is not
resumable in librdkafka, so `abort_transaction` may follow it), while a retriable
`init_transactions`, `commit_transaction` or `abort_transaction` exits: none of them
may be followed by another call, and the outcome of a commit left in progress is known
only to the broker. `backoff(attempt)` paces the retries, so a call that fails at once
(`_CONFLICT`, `_STATE`) is not repeated thousands of times a second.

`run_call` applies both, each attempt under a watchdog (`watched`): a librdkafka call can
overrun its own timeout, and one still running at its timeout plus the grace raises
`WatchdogExpiredError` (the producer's state is unknown: exit). The calls run on a
long-lived worker thread per calling thread, replaced when one hangs.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final, TypeVar, cast

from confluent_kafka import KafkaException

from torpor.schemas.errors import CheckpointAbortedError, FencedError, RetriableError, TorporError
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate

log: Final = logging.getLogger(__name__)

T = TypeVar("T")


class TxnCall(enum.Enum):
    """The transactional producer calls the checkpoint loop makes, by their librdkafka name."""

    INIT = "init_transactions"
    SEND_OFFSETS = "send_offsets_to_transaction"
    COMMIT = "commit_transaction"
    ABORT = "abort_transaction"


class Remedy(enum.Enum):
    """What the caller does after a failed call."""

    RETRY = "retry"  # call the same function again, after `backoff`
    ABORT = "abort"  # abort the transaction, drop the overlay, seek back
    EXIT = "exit"  # the producer is unusable or its state unknown: exit non-zero


# After an exhausted retry budget: whether the call may be followed by abort_transaction.
# send_offsets_to_transaction returns as "not resumable", so abort may follow it; a
# timed-out commit or abort stays the current call until it is resumed.
_ABORT_WHEN_EXHAUSTED: Final[frozenset[TxnCall]] = frozenset({TxnCall.SEND_OFFSETS})


def remedy(call: TxnCall, error: TorporError, *, budget_left: float) -> Remedy:
    """What librdkafka's rules (module docstring) ask after `call` failed with `error`.

    `error` is already translated (`streams.errors.translate`), which ranks the flags:
    fenced/fatal over requires-abort over retriable. `budget_left` is the time left to retry in.
    """
    if isinstance(error, FencedError):
        return Remedy.EXIT
    if isinstance(error, CheckpointAbortedError):
        # An abort that itself asks for an abort, or an init that does, cannot be helped.
        return Remedy.ABORT if call in (TxnCall.SEND_OFFSETS, TxnCall.COMMIT) else Remedy.EXIT
    if isinstance(error, RetriableError):
        if budget_left > 0:
            return Remedy.RETRY
        return Remedy.ABORT if call in _ABORT_WHEN_EXHAUSTED else Remedy.EXIT
    return Remedy.EXIT  # neither retriable nor abortable: nothing the loop can do about it


# The first pause between two attempts, and the ceiling it doubles up to. Short enough that
# a broker back from a restart is noticed within seconds; long enough that a call failing
# at once costs a few attempts a second, not thousands.
FIRST_PAUSE_S: Final = 0.05
MAX_PAUSE_S: Final = 2.0


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (1 for the first retry)."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    return min(MAX_PAUSE_S, FIRST_PAUSE_S * float(2 ** min(attempt - 1, 16)))


class WatchdogExpiredError(FencedError):
    """A transaction call ran past its deadline and its grace: the producer state is unknown.

    The remedy is that of fencing: exit. The restarted instance's `init_transactions`
    (same `transactional.id`) fences this producer and aborts its open transaction.
    """


class RetriesExhaustedError(FencedError):
    """A retriable call kept failing for its whole budget, and nothing may follow it but itself.

    Exit: the restart's `init_transactions` settles the open transaction (commits it if
    the broker had prepared the commit, aborts it otherwise), and restore brings the
    store to whatever the broker kept.
    """


class UnrecoverableCallError(FencedError):
    """`init_transactions` or `abort_transaction` failed with an error that asks for an abort. Exit."""


def run_call(call: TxnCall, fn: Callable[[float], T], *, per_call: float, budget: Deadline,
             grace: float, sleep: Callable[[float], None] = time.sleep) -> T:
    """Call `fn(timeout)` until it succeeds, following `remedy` after each failure.

    Each attempt may block `min(per_call, budget left)` seconds (at least a little: a
    resumed call needs a moment to collect its result), under the watchdog. Raises
    `CheckpointAbortedError` (abort the checkpoint), `FencedError` (exit: fenced, hung,
    or retries exhausted) or the translated error that no remedy covers (exit).
    """
    attempt = 0
    started = time.monotonic()
    while True:
        timeout = max(0.1, budget.timeout_for_call(per_call))
        try:
            result = watched(call.value, fn, timeout, grace)
        except KafkaException as exc:
            error = translate(exc, operation=call.value)
            verdict = remedy(call, error, budget_left=budget.remaining())
            if verdict is Remedy.RETRY:
                attempt += 1
                if attempt == 1:
                    log.warning("%s failed, calling it again until it succeeds (librdkafka's rule for "
                                "a retriable error), for at most %.0fs: %s", call.value, budget.remaining(),
                                error)
                sleep(min(backoff(attempt), budget.remaining()))
                continue
            if verdict is Remedy.ABORT:
                if isinstance(error, CheckpointAbortedError):
                    raise error from exc
                raise CheckpointAbortedError(f"{call.value} kept failing until its deadline: {error}") \
                    from exc
            if isinstance(error, CheckpointAbortedError):
                raise UnrecoverableCallError(
                    f"{call.value} failed asking for an abort, which cannot follow it: {error}. Exiting: the "
                    "restart's init_transactions settles the open transaction."
                ) from exc
            if isinstance(error, RetriableError):
                raise RetriesExhaustedError(
                    f"{call.value} kept failing for {time.monotonic() - started:.0f}s "
                    f"({attempt + 1} attempts; last: {error}). It may only be called again, not aborted: "
                    "exiting, so that the restart's init_transactions settles the open transaction."
                ) from exc
            raise error from exc
        if attempt:
            log.info("%s succeeded after %d retries (%.1fs)", call.value, attempt, time.monotonic() - started)
        return result


def watched(operation: str, call: Callable[[float], T], timeout: float, grace: float) -> T:
    """Run `call(timeout)` on the calling thread's call worker; raise WatchdogExpiredError if
    it outlives timeout + grace.

    The worker is one long-lived daemon thread per calling thread (a checkpoint makes two or
    three calls: starting a thread for each cost ~90 us of the loop's GIL, and a join). A
    worker whose call outlived its limit is abandoned to that call, never reused: the next
    call of the thread gets a new worker, so a hung call never delays another.
    """
    limit = timeout + grace
    worker = _CallWorker.of_this_thread()
    job = _Job(call, timeout)
    worker.submit(job)
    if not job.done.acquire(timeout=limit):
        worker.abandon()
        raise WatchdogExpiredError(
            f"{operation} did not return within {limit:.1f}s (its timeout plus the watchdog grace); "
            "the producer's state is unknown. A new producer with its transactional id (the loop's "
            "renewal, or a restart's) fences it and aborts its open transaction."
        )
    if job.failure is not None:
        raise job.failure
    return cast(T, job.outcome)


class _Job:
    """One watched call: what to run, and its outcome once `done` is released."""

    __slots__ = ("call", "done", "failure", "outcome", "timeout")

    def __init__(self, call: Callable[[float], object], timeout: float) -> None:
        self.call = call
        self.timeout = timeout
        self.outcome: object = None
        self.failure: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()  # released by the worker when the call has returned or raised

    def run(self) -> None:
        try:
            self.outcome = self.call(self.timeout)
        except BaseException as exc:  # handed to the caller's thread by `watched`
            self.failure = exc
        finally:
            self.done.release()


class _CallWorker:
    """A daemon thread that runs one calling thread's watched calls, one at a time."""

    _of_thread: Final = threading.local()

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # A daemon thread: if librdkafka never returns, the process can still exit. It holds
        # the queue, not this worker: when the calling thread ends, its thread-local worker
        # is collected, and the finalizer ends the thread (it used to idle on forever).
        caller = threading.current_thread().name
        self._thread = threading.Thread(target=_serve, args=(self._jobs,),
                                        name=f"torpor-txn-calls-of-{caller}", daemon=True)
        self._thread.start()
        weakref.finalize(self, self._jobs.put, None)

    @classmethod
    def of_this_thread(cls) -> _CallWorker:
        worker: _CallWorker | None = getattr(cls._of_thread, "worker", None)
        if worker is None:
            worker = cls._of_thread.worker = cls()
        return worker

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)

    def abandon(self) -> None:
        """Leave this worker to its hung call; it ends once the call returns, if ever."""
        self._jobs.put(None)
        if getattr(self._of_thread, "worker", None) is self:
            del self._of_thread.worker


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """A worker thread's loop: run each job in turn until told to end (None)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()
