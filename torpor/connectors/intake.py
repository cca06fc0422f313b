"""The effect journal's discipline, for any transport: what a connector does with a
dispatch, with an answer, and at start-up (DESIGN 7).

Contract. `JournaledIntake(journal, codec=..., inputs_topic=..., max_bytes=..., signer=...,
clock=..., produce=...)` holds no Kafka client: the transport that reads the outbox
(`ConnectorRuntime` on confluent-kafka, `torpor.faust.connector` on a Faust agent) hands
it each decoded dispatch, and it hands back records to produce through `produce(record,
request_id)`. The transport must call `delivered(request_id)` once the broker
acknowledged a record produced with a request id (a call's final answer).

- `route(dispatch, performer)`: an `invoke` is journaled before the performer sees it
  (a request id already journaled is never run twice; a finished one has its stored
  answer re-sent instead); `cancel` and `close_thread` cancel the journaled effect
  before the performer stops its work; an `approval_decision` is kept with the effect it
  decides, so a re-run gets it again.
- `send(record)`: the connector's input sink. It bounds the answer (one the processor
  would park unread as oversized is replaced by an error saying so), signs it when there
  is a signer, journals a final answer before producing it (`final_request`), and drops
  the late answer of a cancelled call.
- `route_all(dispatches, performer)`: `route` for a batch, with group commit: one sync
  for the batch's dispatches before any tool sees one, and one for the answers the tools
  give while they are handed the batch, before any of those is produced. An invoke whose
  call a later dispatch of the batch cancelled is not handed over at all.
- `recover(performer)`: at start, before any dispatch is taken: finished but undelivered
  answers are re-sent; an effect that was running when the previous process died is
  `unknown`, and the performer's `reconcile(dispatch)` decides, before any retry, whether
  it happened (it answers then) or must run again. Settled effects older than
  `retention_ms` are pruned (then hourly: `prune_due`).

A tool that raises (`Exception`, or an `asyncio.CancelledError` of its own) when it is
handed a dispatch or asked to reconcile one stops neither the batch nor the start: the
error is logged once, with the thread and request ids, and the call it leaves unanswered
is answered with the tool's error result (`Performer.failed`, `InProcessConnector.failed`),
which the journal settles like any answer; the rest is handed over. `KeyboardInterrupt`,
`SystemExit` and the journal's own errors propagate.

`TORPOR_CONNECTOR_FAULT=after_effect` kills the process (SIGKILL) when a tool hands over
its final answer, before the answer is journaled or produced: the crash window between
an effect and its result, for the crash tests of every transport. Unset, it costs one
comparison.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from torpor.connectors.inprocess import APPROVAL_DECISION, CANCEL, CLOSE_THREAD, INVOKE
from torpor.connectors.journal import Effect, EffectJournal, EffectState
from torpor.schemas.codec import Codec
from torpor.schemas.records import Dispatch, Input, TextBlock, TimerFired, ToolEvent, ToolResult
from torpor.schemas.signer import Signer
from torpor.streams.logfields import log_fields

log = logging.getLogger(__name__)

# How often settled effects older than the retention are forgotten (a scan of the journal).
PRUNE_SECONDS: Final = 3600.0
# Delivered effects are remembered this long: a dispatch redelivered within it never reruns.
DEFAULT_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
FAULT_ENV: Final = "TORPOR_CONNECTOR_FAULT"
AFTER_EFFECT: Final = "after_effect"
# What a tool may raise and be answered for (module docstring). CancelledError is a
# BaseException, but `route_all` and `recover` never await: the connector's own task cannot
# be cancelled inside them, so one raised there is the tool's (a cancelled future's result).
TOOL_ERRORS: Final = (Exception, asyncio.CancelledError)

Produce = Callable[[Input, "str | None", bytes], None]
"""Produces `record` to `inputs` as `value` (the record framed for `inputs` by the intake's
codec: encoded once, also for the journal); with a request id (a final answer) the
transport calls `JournaledIntake.delivered(request_id)` once the broker acknowledged it."""


class Performer(Protocol):
    """What does the work: `InProcessConnector`, `ToolRouter`, a Faust agent's call queue."""

    def submit(self, dispatch: Dispatch) -> None: ...

    def reconcile(self, dispatch: Dispatch) -> bool: ...

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        """Answer the call of `dispatch` (an invoke) with the error result of a tool that raised."""
        ...


class _HeldUntilSynced:
    """A performer that holds what it is given (`held`) until the journal synced it."""

    def __init__(self, performer: Performer) -> None:
        self._performer = performer
        self.held: list[Dispatch] = []

    def submit(self, dispatch: Dispatch) -> None:
        self.held.append(dispatch)

    def reconcile(self, dispatch: Dispatch) -> bool:
        return self._performer.reconcile(dispatch)

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        self._performer.failed(dispatch, error)


def final_request(record: Input) -> str | None:
    """The request id `record` finishes, if it is a call's final answer."""
    body = record.body
    if isinstance(body, ToolResult) and not body.subscription:
        return body.request_id
    if isinstance(body, ToolEvent) and body.final:
        return body.request_id
    if isinstance(body, TimerFired):
        return body.request_id
    return None


class JournaledIntake:
    """A connector's journal discipline, transport-free (see the module docstring)."""

    def __init__(self, journal: EffectJournal, *, codec: Codec, inputs_topic: str, max_bytes: int,
                 signer: Signer | None, clock: Callable[[], int], produce: Produce,
                 retention_ms: int = DEFAULT_RETENTION_MS) -> None:
        self.journal = journal
        self._codec = codec
        self._inputs_topic = inputs_topic
        self._max_bytes = max_bytes
        self._signer = signer
        self._clock = clock
        self._produce = produce
        self._retention_ms = retention_ms
        self._fault = os.environ.get(FAULT_ENV) == AFTER_EFFECT
        self._last_prune = 0.0
        # While `route_all` hands a batch to the tools: what they send, in order, produced
        # once the batch's answers are synced (None: produce at once, each answer synced).
        self._held: list[tuple[Input, str | None, bytes]] | None = None
        if signer is None:
            log.warning("no signing key: answers are produced unsigned (a processor with a key ring "
                        "refuses them as missing_signature)")

    # --- answers -----------------------------------------------------------------------

    def send(self, record: Input) -> None:
        """The connector's sink: bound, sign, journal a final answer, produce."""
        record = self._bounded(record)
        if self._signer is not None:
            record = self._signer.sign(record)
        request_id = final_request(record)
        effect = None
        if request_id is not None:
            if self._fault:
                log.error("fault %s: killing the connector before the answer is produced", AFTER_EFFECT)
                os.kill(os.getpid(), signal.SIGKILL)
            effect = self.journal.entry(request_id)
            if effect is not None and effect.state == EffectState.CANCELLED:
                log.info("answer of a cancelled call dropped", extra={
                    "thread_id": record.thread_id, "message_id": record.message_id})
                return  # the fold answered it as interrupted already: a late result is only noise
        value = self._codec.encode(self._inputs_topic, record)
        if request_id is not None and effect is not None and \
                effect.state in (EffectState.DISPATCHED, EffectState.UNKNOWN):
            # Without a registry, the framed value is the single-object encoding the journal keeps.
            self.journal.finish(request_id, record, self._clock(),
                                encoded=value if self._codec.registry is None else None)
        if self._held is not None:
            self._held.append((record, request_id, value))
            return
        self._produce(record, request_id, value)

    def _resend(self, answer: Input, request_id: str) -> None:
        """Produce a stored answer again (its effect is `done`: not journaled again)."""
        self._produce(answer, request_id, self._codec.encode(self._inputs_topic, answer))

    def delivered(self, request_id: str) -> None:
        """The broker acknowledged the final answer of `request_id`."""
        self.journal.delivered(request_id, self._clock())

    def _bounded(self, record: Input) -> Input:
        """`record`, or, if the processor would park it unread as oversized (and the call
        would wait forever), the same answer with its content replaced by why. Encoded
        only when a cheap upper bound (4 bytes a character) does not show it fits."""
        body = record.body
        if not isinstance(body, ToolResult | ToolEvent):
            return record
        rough = sum(4 * len(b.text) if isinstance(b, TextBlock) else len(b.data) for b in body.content)
        if rough + 4_096 <= self._max_bytes:
            return record
        size = len(self._codec.encode(self._inputs_topic, record))
        if size <= self._max_bytes:
            return record
        why = (f"the tool's answer was {size} bytes, more than the {self._max_bytes} one input may carry "
               "(TORPOR_MAX_INPUT_BYTES): it was not delivered; ask for less")
        log.warning("answer too large, replaced by an error: %s", why,
                    extra={"thread_id": record.thread_id, "message_id": record.message_id})
        content = (TextBlock(why),)
        if isinstance(body, ToolResult):
            return dataclasses.replace(record, body=dataclasses.replace(body, ok=False, content=content))
        return dataclasses.replace(record, body=dataclasses.replace(body, content=content))

    # --- dispatches --------------------------------------------------------------------

    def route_all(self, dispatches: Sequence[Dispatch], performer: Performer) -> None:
        """`route` each of `dispatches` with one synced journal write for all (group
        commit): each is journaled, the journal synced once, and only then is any of them
        passed on to `performer`, in order. A tool never starts an effect whose journal
        row could still be lost. An invoke whose call was cancelled by a later dispatch of
        the batch (a `cancel`, a `close_thread`) is not passed on: the fold answered that
        call itself when it cancelled it, and expects nothing more from the tool.

        The answers the tools send while they are handed the batch (a tool that answers
        at once) are group-committed too: their `done` rows are synced together when the
        last dispatch is handed over, and only then is anything they sent produced, in
        the order sent. An answer sent later (by a task) is synced on its own in `send`.

        A tool that raises when handed a dispatch has that call answered with its error
        (module docstring), and the rest of the batch is handed over. What stays open: a
        process that dies (kill -9, or a journal write that raises here) after the batch's
        sync and before a dispatch is handed over leaves that dispatch `dispatched` though
        no tool saw it. The next start finds it `unknown`, like one that ran, and the
        tool's `reconcile` decides: a tool that runs at most once answers it "may have
        run" without running it. Telling the two apart would take a second synced write
        per batch."""
        held = _HeldUntilSynced(performer)
        with self.journal.group():
            for dispatch in dispatches:
                self.route(dispatch, held)
        sent: list[tuple[Input, str | None, bytes]] = []
        self._held = sent
        try:
            with self.journal.group():
                for dispatch in held.held:
                    with log_fields(thread_id=dispatch.thread_id, request_id=dispatch.request_id):
                        if dispatch.kind == INVOKE and self._is_cancelled(dispatch):
                            log.info("invoke not handed over: its call was cancelled in the same batch")
                            continue
                        self._hand_over(dispatch, performer)  # a task it starts keeps these log fields
        finally:
            self._held = None
            # Even if the journal raised, what the tools finished is synced by now (unless the
            # sync itself failed: then nothing goes out, and the next start re-sends it).
            if self.journal.is_synced:
                for record, request_id, value in sent:
                    self._produce(record, request_id, value)

    def _is_cancelled(self, dispatch: Dispatch) -> bool:
        effect = self.journal.entry(dispatch.request_id)
        return effect is not None and effect.state == EffectState.CANCELLED

    def route(self, dispatch: Dispatch, performer: Performer) -> None:
        """Journal `dispatch` and pass it on to `performer` (module docstring). What either
        logs meanwhile, and any task the performer starts for it, names its thread and request."""
        with log_fields(thread_id=dispatch.thread_id, request_id=dispatch.request_id):
            self._route(dispatch, performer)

    def _route(self, dispatch: Dispatch, performer: Performer) -> None:
        now = self._clock()
        if dispatch.kind == INVOKE:
            found = self.journal.begin(dispatch, now)
            if found is None:
                self._hand_over(dispatch, performer)
            elif found.state == EffectState.DONE and found.answer is not None:
                self._resend(found.answer, found.request_id)  # redelivered: re-send, do not rerun
            return
        if dispatch.kind == CANCEL:
            self.journal.cancel(dispatch.thread_id, dispatch.call_id, now)
        elif dispatch.kind == CLOSE_THREAD:
            for call_id in self.journal.running_calls(dispatch.thread_id):
                self.journal.cancel(dispatch.thread_id, call_id, now)
        elif dispatch.kind == APPROVAL_DECISION:
            self.journal.follow(dispatch, now)
        self._hand_over(dispatch, performer)

    def _hand_over(self, dispatch: Dispatch, performer: Performer) -> None:
        """`performer.submit(dispatch)`; if the tool raises, the call is answered with its error."""
        try:
            performer.submit(dispatch)
        except TOOL_ERRORS as error:
            self._tool_raised(dispatch, performer, error, f"when handed its {dispatch.kind} dispatch")

    def _tool_raised(self, dispatch: Dispatch, performer: Performer, error: BaseException, when: str) -> None:
        """Log `error` once, and answer with it the call `dispatch` leaves unanswered (if any)."""
        log.error("tool %s raised %s", dispatch.tool, when, exc_info=error, extra=_where(dispatch))
        owed = self._owed(dispatch)
        if owed is not None:
            performer.failed(owed.dispatch, error)

    def _owed(self, dispatch: Dispatch) -> Effect | None:
        """The running effect whose answer `dispatch` was to lead to: an invoke's own, an
        approval decision's call. None for a cancel or close_thread: the journal cancelled
        those effects, and the fold answered their calls when it cancelled them. None also
        if the tool answered before it raised (the call is settled)."""
        if dispatch.kind == INVOKE:
            effect = self.journal.entry(dispatch.request_id)
            running = effect is not None and effect.state in (EffectState.DISPATCHED, EffectState.UNKNOWN)
            return effect if running else None
        if dispatch.kind == APPROVAL_DECISION:
            return self.journal.running_effect(dispatch.thread_id, dispatch.call_id)
        return None

    # --- start-up and upkeep -----------------------------------------------------------

    def recover(self, performer: Performer) -> None:
        """Re-send, reconcile or re-run what the previous process left (module docstring).
        A tool whose `reconcile` raises cannot say whether the effect happened: the call is
        answered with its error and not run again (a tool with an outside effect runs at
        most once; the model may call it again)."""
        now = self._clock()
        pruned = self.prune()
        found = self.journal.recover(now)
        rerun = resent = reconciled = 0
        for effect in found:
            if effect.state == EffectState.DONE and effect.answer is not None:
                self._resend(effect.answer, effect.request_id)
                resent += 1
            elif effect.state == EffectState.UNKNOWN:
                with log_fields(thread_id=effect.dispatch.thread_id, request_id=effect.request_id):
                    # Before any retry: did the effect happen? (the tool answers if it did)
                    if self._reconciled(effect.dispatch, performer):
                        reconciled += 1
                        continue
                    self.journal.restart(effect.request_id, now)
                    for dispatch in (effect.dispatch, *effect.followups):
                        self._hand_over(dispatch, performer)
                    rerun += 1
        if found or pruned:
            log.info("journal recovered: %d answers re-sent, %d effects reconciled, %d re-run, %d pruned",
                     resent, reconciled, rerun, pruned)

    def _reconciled(self, dispatch: Dispatch, performer: Performer) -> bool:
        """`performer.reconcile(dispatch)`; if the tool raises, the call is answered with its error."""
        try:
            return performer.reconcile(dispatch)
        except TOOL_ERRORS as error:
            self._tool_raised(dispatch, performer, error,
                              "when asked whether a call ran: answered with its error, not run again")
            return True

    def prune(self) -> int:
        """Forget settled effects older than the retention; return how many."""
        self._last_prune = time.monotonic()
        return self.journal.prune(self._clock() - self._retention_ms)

    def prune_due(self) -> None:
        """`prune`, if the last one is `PRUNE_SECONDS` old."""
        if time.monotonic() - self._last_prune >= PRUNE_SECONDS:
            self.prune()


def _where(dispatch: Dispatch) -> dict[str, object]:
    return {"thread_id": dispatch.thread_id, "request_id": dispatch.request_id}
