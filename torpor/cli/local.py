"""`torpor local`: run an agent in this process, no broker (DESIGN section 8, local mode).

`torpor local run SCENARIO` plays a scenario file (see `torpor.cli.scenario`) and prints
the transcript: the conversation, tool calls, child threads, events and receipts.
`torpor local chat` is the interactive twin: type lines to the agent, `/approve`,
`/reject`, `/stop`, `/quit`.

This module composes the two halves that may not import each other: the processor side
(`LocalRuntime`, `ScriptedModel`) and the connectors (echo, watch, deploy, timers).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import click

from torpor.cli.scenario import Command, Decide, Pause, Say, Scenario, ThreadSpec, WaitIdle, load
from torpor.cli.transcript import Transcript
from torpor.connectors.approvals import DeployTool
from torpor.connectors.echo import EchoTool
from torpor.connectors.router import ToolRouter
from torpor.connectors.subscriptions import WatchTool
from torpor.connectors.timers import TimerConnector
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms, tune_collector
from torpor.processors.models.provider import (
    CompletionRequest,
    ModelProvider,
    ScriptedCall,
    ScriptedModel,
    ScriptedTurn,
    recent_text,
)
from torpor.schemas.records import (
    ApprovalDecision,
    ApprovalRequest,
    Budgets,
    Capability,
    Control,
    CreateThread,
    Input,
    InputBody,
    TextBlock,
    ThreadConfig,
    UserEntry,
    UserMessage,
)

DEMO: Path = Path(__file__).resolve().parent.parent / "scenarios" / "demo.toml"


@dataclass(slots=True)
class LocalRun:
    """A composed local runtime, ready to be driven."""

    runtime: LocalRuntime
    router: ToolRouter
    transcript: Transcript
    thread_id: str
    _sent: int = 0

    def send(self, body: InputBody, source: str = "user:local") -> Input:
        self._sent += 1
        record = Input(
            message_id=f"local:{self.thread_id}:{self._sent}",
            thread_id=self.thread_id,
            created_at=self.runtime.clock(),
            source=source,
            expires_at=None,
            key_id=None,
            signature=None,
            body=body,
        )
        self.runtime.send(record)
        return record

    def open_approvals(self) -> list[ApprovalRequest]:
        """Approval requests of the root thread without a decision yet, oldest first."""
        asked: dict[str, ApprovalRequest] = {}
        for record in self.runtime.inputs():
            body = record.value.body
            if isinstance(body, ApprovalRequest):
                asked.setdefault(body.approval_id, body)
            elif isinstance(body, ApprovalDecision):
                asked.pop(body.approval_id, None)
        return list(asked.values())


def thread_config(spec: ThreadSpec, router: ToolRouter) -> ThreadConfig:
    tools = tuple(router.spec(name) for name in spec.tools)
    return ThreadConfig(
        model=spec.model,
        system_prompt=spec.system_prompt,
        tools=tools,
        capability=Capability(tenant="local", tools=spec.tools, scopes=("local",), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None,
        context_window=spec.context_window,
        compaction_threshold=0.8,
        allow_implicit_create=False,
    )


def compose(
    spec: ThreadSpec, provider: ModelProvider, config: LocalConfig, echo: bool = True, deltas: bool = False
) -> LocalRun:
    """Wire the runtime, the connectors and the transcript, and create the root thread."""
    runtime: LocalRuntime

    def connectors_sink(record: Input) -> None:
        runtime.send(record)  # bound late: the runtime needs the router, the router this sink

    router = ToolRouter(
        [
            EchoTool(connectors_sink, now_ms),
            WatchTool(connectors_sink, now_ms),
            DeployTool(connectors_sink, now_ms),
            TimerConnector(connectors_sink, now_ms),
        ],
        connectors_sink,
    )
    tune_collector()  # this process is the runtime's, as `torpor processor`'s is the processor's
    runtime = LocalRuntime(provider, router, config)
    transcript = Transcript(clock=now_ms, emit=click.echo if echo else None, deltas=deltas)
    runtime.observers.append(transcript.observe)
    run = LocalRun(runtime, router, transcript, spec.id)
    run.send(CreateThread(config=thread_config(spec, router), inherited=(), initial=()), source="user:local")
    return run


async def play(scenario: Scenario, config: LocalConfig, echo: bool = True) -> LocalRun:
    """Run `scenario` to its end; the returned run's log holds everything that happened."""
    run = compose(scenario.thread, ScriptedModel(scenario.rules), config, echo=echo)
    try:
        await run.runtime.run_until_idle()
        for action in scenario.steps:
            match action:
                case Say(text=text):
                    run.send(UserMessage(content=(TextBlock(text),)))
                case WaitIdle(timeout_s=timeout):
                    await run.runtime.run_until_idle(timeout)
                case Pause(seconds=seconds):
                    await _run_for(run.runtime, seconds)
                case Decide(choice=choice, decided_by=who):
                    approvals = run.open_approvals()
                    if not approvals:
                        raise click.ClickException("the scenario decides an approval, but none is open")
                    run.send(ApprovalDecision(approvals[0].approval_id, choice, who), source=who)
                case Command(command=command, reason=reason):
                    run.send(Control(command, None, None, reason), source="operator:scenario")
        await run.runtime.run_until_idle()
    finally:
        await run.runtime.close()
    return run


async def _run_for(runtime: LocalRuntime, seconds: float) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        runtime.run_once()
        await asyncio.sleep(min(left, 0.01))


@click.group()
def local() -> None:
    """Run agents in this process, with no broker (local mode)."""


@local.command()
@click.argument("scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@click.option("--store", type=click.Choice(["rocks", "memory"]), default="rocks", show_default=True)
@click.option("--partitions", type=int, default=1, show_default=True)
def run(scenario: Path | None, store: str, partitions: int) -> None:
    """Play SCENARIO (default: the bundled demo) and print the transcript."""
    path = scenario or DEMO
    loaded = load(path)
    click.echo(f"scenario {loaded.name}: thread {loaded.thread.id}, {len(loaded.steps)} steps\n")
    started = time.perf_counter()
    done = asyncio.run(play(loaded, LocalConfig(partitions=partitions, store=store)))
    elapsed = time.perf_counter() - started
    receipts = done.runtime.log.read_all(done.runtime.topics.receipts)
    inputs = done.runtime.inputs()
    click.echo(
        f"\n{len(inputs)} inputs, {len(receipts)} receipts, {done.runtime.steps} steps, "
        f"{len(done.transcript.names)} threads in {elapsed:.2f}s"
    )


@local.command()
@click.option("--thread", "thread_id", default="chat", show_default=True)
@click.option("--store", type=click.Choice(["rocks", "memory"]), default="memory", show_default=True)
def chat(thread_id: str, store: str) -> None:
    """Talk to a scripted agent; /approve, /reject, /stop, /quit."""
    asyncio.run(_chat(thread_id, LocalConfig(store=store)))


CHAT_HELP = (
    "The scripted agent obeys command words: 'echo TEXT', 'watch TOPIC', 'deploy TARGET', "
    "'sleep SECONDS', 'spawn INSTRUCTIONS'; anything else is answered in words. "
    "/approve, /reject, /stop, /quit."
)


def chat_turn(request: CompletionRequest) -> ScriptedTurn:
    """The chat agent: a deterministic reading of the last user text (no real model here)."""
    if request.parent is not None:  # children and event children finish at once
        report = recent_text(request.history).splitlines()[-1] if request.history else "done"
        return ScriptedTurn(
            chunks=("Done.",), tool_calls=(ScriptedCall("close_thread", _args(report=report)),)
        )
    last = request.history[-1].body if request.history else None
    if not isinstance(last, UserEntry):
        return ScriptedTurn(chunks=(f"Noted: {_short(recent_text(request.history))}",))
    said = " ".join(b.text for b in last.content if isinstance(b, TextBlock)).strip()
    word, _, rest = said.partition(" ")
    calls = {
        "echo": ("echo", _args(text=rest)),
        "watch": ("watch", _args(topic=rest or "feed")),
        "deploy": ("deploy", _args(target=rest or "web")),
        "spawn": ("spawn_thread", _args(instructions=rest or "look around")),
        "sleep": ("sleep", json.dumps({"seconds": float(rest) if rest.replace(".", "", 1).isdigit() else 1})),
    }
    if word in calls:
        name, arguments = calls[word]
        return ScriptedTurn(chunks=(f"Calling {name}.",), tool_calls=(ScriptedCall(name, arguments),))
    return ScriptedTurn(chunks=(f"You said: {said}. ", CHAT_HELP))


def _args(**values: str) -> str:
    return json.dumps(values, sort_keys=True)


def _short(text: str) -> str:
    return text if len(text) < 120 else text[:119] + "…"


async def _chat(thread_id: str, config: LocalConfig) -> None:
    spec = ThreadSpec(id=thread_id, system_prompt="You are a local agent.", tools=("echo", "watch", "deploy"))
    run = compose(spec, ScriptedModel((), fallback=chat_turn), config)
    click.echo(CHAT_HELP)
    try:
        await run.runtime.run_until_idle()
        while True:
            line = await asyncio.to_thread(input, "> ")
            if line in ("/quit", "/exit"):
                break
            if line in ("/approve", "/reject"):
                approvals = run.open_approvals()
                if approvals:
                    choice = line[1:]
                    run.send(ApprovalDecision(approvals[0].approval_id, choice, "user:local"))
            elif line == "/stop":
                run.send(Control("stop", None, None, "stopped from chat"), source="operator:local")
            elif line.strip():
                run.send(UserMessage(content=(TextBlock(line),)))
            await run.runtime.run_until_idle()
    finally:
        await run.runtime.close()
