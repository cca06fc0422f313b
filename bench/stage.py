"""`python -m bench.stage`: the model stage alone, CPU us per completion.

Contract. Builds `--agents` threads of the workload (`bench.workload`) in a `MemoryStore`,
`--turns` turns each (folded by `step`, answered by `BenchModel` and `ForgetfulBenchTool`),
then one more user text each, so every thread awaits the model with a history of about
4 x turns entries. Then it submits those requests to a `ModelStage` `--repeat` times over
(the thread never moves on, so each round serves the same requests again: the history
cache extends nothing, `ScriptedModel` answers a request id as it did before) and prints
the CPU time per completion of the timed rounds. `--model router` serves them as the
processor does in `bench.kafka` (`ModelRouter` with `bench.kafka.script`'s scripted
rules), `--model bench` as `bench.local` does (`BenchModel`). The sink only counts: what
a real sink costs (encoding, producing) is not in the figure.

For changes to `processors/models/` or `HistoryCache`: steadier than a whole benchmark,
and with `valgrind --tool=callgrind` the instructions per completion are exact (run two
`--repeat` values and take the difference over the extra completions: the build cancels).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.kafka import script
from bench.workload import BenchModel, ForgetfulBenchTool, agent_id, create_input, turn_input
from torpor.cli.scenario import load_rules
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.local import tune_collector
from torpor.processors.models.provider import ModelProvider
from torpor.processors.models.providers.registry import ModelRouter
from torpor.processors.models.providers.settings import ProviderSettings
from torpor.processors.models.stage import ModelStage
from torpor.processors.step import StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.schemas.records import Input, ThreadEvent


class CountingSink:
    """A `StageSink` that counts what it is given."""

    def __init__(self) -> None:
        self.events = 0
        self.completions = 0

    def publish_event(self, event: ThreadEvent) -> None:
        self.events += 1

    def publish_completion(self, completion: Input) -> None:
        self.completions += 1


class QueueSink:
    """A `StageSink` that queues the completions for the build to fold."""

    def __init__(self, queue: list[Input]) -> None:
        self._queue = queue

    def publish_event(self, event: ThreadEvent) -> None:
        pass

    def publish_completion(self, completion: Input) -> None:
        self._queue.append(completion)


async def build(store: MemoryStore, agents: int, turns: int) -> list[RequestCompletion]:
    """Fold `turns` turns of `agents` threads into `store`; return one request per thread, pending."""
    queue: list[Input] = []
    tool = ForgetfulBenchTool(queue.append, lambda: 1)
    stage = ModelStage(store, BenchModel(), QueueSink(queue), lambda: 1)
    offset = 0

    async def drain() -> None:
        nonlocal offset
        while queue:
            batch, queue[:] = list(queue), []
            for item in batch:
                out = step(store, [StepRecord(item, 0, offset)])
                offset += 1
                for dispatch in out.dispatches:
                    tool.submit(dispatch)
                for request in out.completions:
                    stage.submit(request)
            await stage.wait_idle()

    queue.extend(create_input(agent_id(i), 1) for i in range(agents))
    await drain()
    for turn in range(1, turns + 1):
        queue.extend(turn_input(agent_id(i), turn, 2) for i in range(agents))
        await drain()
    pending: list[RequestCompletion] = []
    for i in range(agents):
        text = turn_input(agent_id(i), turns + 1, 2)
        pending.extend(step(store, [StepRecord(text, 0, offset)]).completions)
        offset += 1
    return pending


def provider(kind: str, rounds: int) -> ModelProvider:
    if kind == "bench":
        return BenchModel()
    with tempfile.TemporaryDirectory(prefix="torpor-bench-stage-") as work:
        path = Path(work) / "script.toml"
        path.write_text(script(rounds))
        return ModelRouter(ProviderSettings(), "scripted", script=load_rules(path))


async def run(agents: int, turns: int, repeat: int, kind: str) -> tuple[int, float]:
    """Completions timed and their CPU seconds."""
    store = MemoryStore()
    requests = await build(store, agents, turns)
    sink = CountingSink()
    stage = ModelStage(store, provider(kind, turns + 2), sink, lambda: 1)
    for request in requests:  # a warm-up round: the history cache filled, the script's turns chosen
        stage.submit(request)
    await stage.wait_idle()
    before, started = sink.completions, time.process_time()
    for _ in range(repeat):
        for request in requests:
            stage.submit(request)
        await stage.wait_idle()
    return sink.completions - before, time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--model", choices=("router", "bench"), default="router")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.turns < 0 or args.repeat < 1:
        parser.error("--agents and --repeat must be at least 1, --turns at least 0")
    tune_collector()  # as the processor and local mode run the stage
    done, cpu = asyncio.run(run(args.agents, args.turns, args.repeat, args.model))
    if done != args.agents * args.repeat:
        print(f"stage: {done} completions, expected {args.agents * args.repeat}")
        return 1
    each = cpu / done * 1e6
    print(f"stage ({args.model}): {done} completions, {cpu:.3f}s CPU = {each:.1f} us per completion")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
