"""A Torpor tool connector written as a Faust agent, with the connector runtime's journal.

Contract::

    app = torpor.faust.App("weather-connector", settings=settings)
    weather = FaustConnector(app, name="weather", specs=(WEATHER_SPEC,),
                             journal_dir=Path("journal"), signer=signer)

    @weather.reconciler
    def already_done(call: ToolCall) -> object | None:   # did this call's effect happen?
        ...

    @app.agent(weather.outbox)
    async def serve(dispatches: faust.StreamT[Dispatch]) -> None:
        async for call in weather.calls(dispatches):
            call.answer(await forecast(call.arguments["city"]))   # or call.fail("why")

`calls(dispatches)` turns the agent's stream of the `outbox` into the calls this connector
must perform, with the guarantees of `ConnectorRuntime`, because it is the same code
(`connectors.intake.JournaledIntake` over `connectors.journal.EffectJournal`):

- before the first dispatch is taken: it waits for Torpor's topics, saying so once
  (`wait_for_topics=False`: `MissingTopicsError` naming them, in one line), reads the
  `inputs` partition count, publishes the tools' manifests to `toolsets`, and recovers
  the journal. A finished but
  undelivered answer is re-sent; an effect that was running when the previous worker died
  is `unknown`: the reconciler is asked whether it happened (its non-None return is the
  answer) and, if not, the call is yielded again (a re-run);
- every `invoke` for `specs` is journaled before it is yielded; a redelivered dispatch
  (a worker killed before Faust committed its offset) is never yielded twice, and a
  finished one has its stored answer re-sent instead; `cancel` and `close_thread` cancel
  the journaled effect, and a late answer of a cancelled call is dropped;
- `call.answer(value)` / `call.fail(why)` produce the call's one `ToolResult` to `inputs`
  (message id derived from the request id, so any copy is one input to the fold), at the
  partition murmur2 picks for the thread, signed with `signer`, journaled before it is
  produced and marked delivered when the broker acknowledges it. An answer too large for
  one input becomes an error result saying so.

So each dispatch has one effect across a worker's kill -9 and restart, given a
reconciler for tools whose effect is not idempotent. Faust reads the outbox
read_committed (`torpor.faust.App`), commits its offsets after the agent moves on; the
journal, not the offset, holds the effect from the moment it is journaled. Approval
requests, subscriptions and events are not offered to Faust tools (`ConnectorRuntime` and
`InProcessConnector` serve them); an approval decision is logged and ignored.

A call yielded and never answered stays `dispatched` in the journal: if the agent's loop
raises, Faust restarts the agent, and that call is settled only at the worker's next start
(reconciled, or run again). Catch what the tool can raise and `call.fail(why)`, so the
model hears of it at once. Answering later, from a task of your own, is fine.

`journal_dir` None keeps the journal in memory: no guarantee across a restart (tests).
One worker process per journal directory. With `concurrency=N` on the agent, the N
streams share the connector's queue of calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

from faust.types.tuples import FutureMessage

from torpor.connectors.functions import as_text
from torpor.connectors.inprocess import CLOSE_THREAD, InProcessConnector, text
from torpor.connectors.intake import DEFAULT_RETENTION_MS, JournaledIntake
from torpor.connectors.journal import EffectJournal
from torpor.connectors.manifest import publish_manifest
from torpor.connectors.runtime import now_ms
from torpor.faust.app import App
from torpor.faust.topics import TorporTopics
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Dispatch, Input, ToolSpec
from torpor.schemas.signer import Signer
from torpor.streams.clients import make_producer
from torpor.streams.partitioner import partition_for
from torpor.streams.topicwait import PAUSE_S as TOPIC_PAUSE_S
from torpor.streams.topicwait import TopicWait

log = logging.getLogger(__name__)

# How long start-up waits for the manifests' delivery.
START_SECONDS: Final = 10.0

Reconciler = Callable[["ToolCall"], object | None]
"""Asked after a crash: the call's result if its effect happened, None to run it again."""


class ToolCall:
    """One call to perform: the dispatch, its parsed arguments, and how to answer it."""

    __slots__ = ("_queue", "dispatch")

    def __init__(self, dispatch: Dispatch, queue: _CallQueue) -> None:
        self.dispatch = dispatch
        self._queue = queue

    @property
    def tool(self) -> str:
        return self.dispatch.tool

    @property
    def thread_id(self) -> str:
        return self.dispatch.thread_id

    @property
    def request_id(self) -> str:
        """The idempotency key of the call's effect: stable across redeliveries and re-runs."""
        return self.dispatch.request_id

    @property
    def arguments(self) -> dict[str, Any]:
        """The arguments, validated by the fold against the tool's JSON schema."""
        found = json.loads(self.dispatch.arguments or "{}")
        return found if isinstance(found, dict) else {}

    def answer(self, value: object) -> None:
        """Answer the call: a string as is, anything else as JSON."""
        self._queue.answer(self.dispatch, ok=True, content=text(as_text(value)))

    def fail(self, why: str) -> None:
        """Answer the call with an error result the model reads."""
        self._queue.answer(self.dispatch, ok=False, content=text(why))

    def __repr__(self) -> str:
        return f"ToolCall({self.tool!r}, request_id={self.request_id!r}, thread_id={self.thread_id!r})"


class _CallQueue(InProcessConnector):
    """The performer the journal hands calls to: it queues them for the agent's loop."""

    def __init__(self, name: str, specs: tuple[ToolSpec, ...], sink: Callable[[Input], None],
                 clock: Callable[[], int]) -> None:
        super().__init__(sink, clock)
        self.name = name
        self.specs = specs
        self.ready: deque[ToolCall] = deque()
        self.reconciler: Reconciler | None = None

    def invoke(self, dispatch: Dispatch) -> None:
        self.ready.append(ToolCall(dispatch, self))

    def reconcile(self, dispatch: Dispatch) -> bool:
        if self.reconciler is None:
            return False
        value = self.reconciler(ToolCall(dispatch, self))
        if value is None:
            return False
        self.answer(dispatch, ok=True, content=text(as_text(value)))
        return True


class FaustConnector:
    """Serves `specs` from a Faust agent over the outbox (module docstring)."""

    def __init__(self, app: App, *, name: str, specs: Sequence[ToolSpec], journal_dir: Path | None,
                 signer: Signer | None, retention_ms: int = DEFAULT_RETENTION_MS,
                 clock: Callable[[], int] = now_ms, topics: TorporTopics | None = None,
                 wait_for_topics: bool = True) -> None:
        self.topics = topics or TorporTopics.of(app)
        self.outbox = self.topics.outbox
        self._app = app
        self._journal_dir = journal_dir
        self._waits_for_topics = wait_for_topics
        self._signer = signer
        self._retention_ms = retention_ms
        self._clock = clock
        self._queue = _CallQueue(name, tuple(specs), self._send, clock)
        self._tools = frozenset(spec.name for spec in specs)
        self._intake: JournaledIntake | None = None
        self._partitions = 0
        self._starting = asyncio.Lock()
        self.handled = 0

    @property
    def source(self) -> str:
        return self._queue.source

    def reconciler(self, fn: Reconciler) -> Reconciler:
        """Decorator: the reconcile hook (module docstring)."""
        self._queue.reconciler = fn
        return fn

    async def calls(self, dispatches: AsyncIterable[Dispatch]) -> AsyncIterator[ToolCall]:
        """The calls to perform, from the agent's stream of the outbox (module docstring)."""
        await self._start()
        intake = self._intake
        assert intake is not None
        while self._queue.ready:  # re-runs from the journal come first
            yield self._queue.ready.popleft()
        async for dispatch in dispatches:
            if dispatch.tool not in self._tools and dispatch.kind != CLOSE_THREAD:
                continue  # another connector's
            intake.route(dispatch, self._queue)
            self.handled += 1
            log.info("dispatch %s %s journaled", dispatch.kind, dispatch.tool,
                     extra={"thread_id": dispatch.thread_id, "message_id": dispatch.request_id})
            intake.prune_due()
            while self._queue.ready:
                yield self._queue.ready.popleft()

    # --- start-up ----------------------------------------------------------------------

    async def _start(self) -> None:
        async with self._starting:  # several streams (agent concurrency) start it once
            if self._intake is not None:
                return
            self._partitions = await self._wait_for_topics()
            try:
                journal = EffectJournal(self._journal_dir)
            except Exception as error:  # rocksdict raises a bare Exception for a locked directory
                raise ConfigError(f"effect journal {self._journal_dir}: cannot open it: {error} "
                                  "(is another worker using it?)") from None
            self._app.keep_open(journal)
            settings = self._app.torpor_settings
            self._intake = JournaledIntake(
                journal, codec=self.topics.codec, inputs_topic=self.topics.names.inputs,
                max_bytes=settings.inputs.max_bytes, signer=self._signer, clock=self._clock,
                produce=self._produce, retention_ms=self._retention_ms)
            self._intake.recover(self._queue)

    async def _wait_for_topics(self) -> int:
        """Wait for the topics (saying so once, as `ConnectorRuntime` does), publish the
        manifests; return the partition count of `inputs`. Blocking calls run in a thread."""
        names = self.topics.names
        settings = self._app.torpor_settings
        producer = make_producer(settings)
        wait = TopicWait(producer, (names.outbox, names.inputs, names.toolsets),
                         settings.kafka.bootstrap_servers, wait=self._waits_for_topics)
        while (found := await asyncio.to_thread(wait.check)) is None:
            await asyncio.sleep(TOPIC_PAUSE_S)
        publish_manifest(producer, names.toolsets, self._queue.specs, source=self.source)
        if await asyncio.to_thread(producer.flush, START_SECONDS) > 0:
            log.warning("the toolset manifests of %s were not delivered in %.0f s",
                        self.source, START_SECONDS)
        return found[names.inputs]

    # --- answers -----------------------------------------------------------------------

    def _send(self, record: Input) -> None:
        assert self._intake is not None, "an answer before the start: calls() starts the connector"
        self._intake.send(record)

    def _produce(self, record: Input, request_id: str | None, value: bytes) -> None:
        key = record.thread_id.encode("utf-8")
        callback = None if request_id is None else partial(self._delivered, request_id)
        self.topics.inputs.send_soon(key=key, value=value, partition=partition_for(key, self._partitions),
                                     callback=callback)

    def _delivered(self, request_id: str, message: FutureMessage) -> None:
        # Faust calls back only on success; an answer not delivered stays `done` and is
        # re-sent at the next start.
        assert self._intake is not None
        self._intake.delivered(request_id)
