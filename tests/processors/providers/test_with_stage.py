"""The adapters under the real model stage: a thread's request, retried through 429 and 500, folds."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from tests.processors.fold_scenarios import config, create
from tests.processors.providers import wire
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.models.providers.registry import ModelRouter
from torpor.processors.models.providers.settings import EndpointSettings, ProviderSettings
from torpor.processors.models.stage import ModelStage, StageConfig
from torpor.processors.step import StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.schemas.records import Completion, Input, InputBody, ThreadEvent, ToolCall

FAST = StageConfig(backoff_initial_s=0.001, backoff_max_s=0.002, max_attempts=3)


@dataclass
class Sink:
    """Where the stage publishes: events and completion inputs, kept for the test."""

    events: list[ThreadEvent] = field(default_factory=list)
    completions: list[Input] = field(default_factory=list)

    def publish_event(self, event: ThreadEvent) -> None:
        self.events.append(event)

    def publish_completion(self, completion: Input) -> None:
        self.completions.append(completion)


def envelope(message_id: str, body: InputBody) -> Input:
    return Input(message_id, "t1", 1_000, "user:u", None, None, None, body)


def _thread(store: MemoryStore, model: str) -> RequestCompletion:
    cfg = dataclasses.replace(config(), model=model)
    (request,) = step(
        store, [StepRecord(envelope("m-create", create(cfg, initial="search cats")), 0, 0)]
    ).completions
    return request


def _serve(
    store: MemoryStore, request: RequestCompletion, replies: list[wire.Reply]
) -> tuple[Sink, wire.WireServer]:
    sink = Sink()

    async def go() -> wire.WireServer:
        async with wire.WireServer(replies) as server:
            settings = ProviderSettings(openai=EndpointSettings(base_url=f"{server.url}/v1"))
            router = ModelRouter(settings, default_model="scripted")
            stage = ModelStage(store, router, sink, lambda: 5_000, FAST)
            stage.submit(request)
            await stage.wait_idle()
            await router.aclose()
            return server

    return sink, asyncio.run(go())


def test_a_rate_limited_then_failing_server_is_retried_and_the_turn_folds() -> None:
    store = MemoryStore()
    request = _thread(store, "openai:gpt-4o-mini")
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "search", "arguments": '{"q": "cats"}'},
    }
    turn = [wire.oai_chunk({"role": "assistant", "tool_calls": [call]}), wire.oai_chunk({}, "tool_calls")]
    replies = [
        wire.json_reply(429, wire.oai_error("slow down", "requests"), {"retry-after-ms": "1"}),
        wire.json_reply(500, wire.oai_error("oops", "server_error")),
        wire.Reply(body=wire.openai_sse([*turn, wire.oai_usage(50, 5)])),
    ]
    sink, server = _serve(store, request, replies)
    assert [e.kind for e in sink.events] == ["completion_retried", "completion_retried"]
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is None
    assert answer.body.tool_calls == (ToolCall("call_1", "search", '{"q": "cats"}'),)
    sent = server.requests[-1].body
    assert sent["messages"][0] == {"role": "system", "content": "You are a test agent."}
    assert sent["messages"][1] == {"role": "user", "content": "search cats"}
    assert {"search", "spawn_thread", "sleep"} <= {t["function"]["name"] for t in sent["tools"]}
    out = step(store, [StepRecord(answer, 0, 1)])
    assert [r.disposition for r in out.receipts] == ["applied"]


def test_a_refused_request_becomes_an_error_completion_at_once() -> None:
    store = MemoryStore()
    request = _thread(store, "openai:gpt-4o-mini")
    sink, server = _serve(
        store, request, [wire.json_reply(400, wire.oai_error("bad", "invalid_request_error"))]
    )
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is not None
    assert (answer.body.error.kind, answer.body.error.attempts) == ("permanent", 1)
    assert len(server.requests) == 1
