"""The issue-7 workload, shared by every benchmark: texts, the model, the tool, the inputs.

Contract. N agents `agent-{i}`, each created with `thread_config()` (one tool,
`run_command`; compaction off), get `turns` user texts of about 111 characters
(`user_text`). `BenchModel` answers every request with the same 12 chunks of 94
characters and, when the last history entry is not a tool result, one `run_command`
call; usage is zero. `BenchTool` answers every `run_command` at once with the 340
character `TOOL_RESULT`. So each turn is two completions and one tool round trip.
Everything here is a pure function of its arguments: the runs are reproducible.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Final

from torpor.connectors.inprocess import InProcessConnector, text
from torpor.processors.models.provider import CompletionRequest, Finished, ModelInfo, ModelOutput, TextDelta
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Dispatch,
    Input,
    InputBody,
    TextBlock,
    ThreadConfig,
    ToolCall,
    ToolResultEntry,
    ToolSpec,
    Usage,
    UserMessage,
)

TOOL: Final = "run_command"
ARGUMENTS: Final = json.dumps({"command": "cargo test --workspace"})
CHUNK: Final = (
    "The workspace tests were re-run; here is what failed and which modules the failures touch. "
)[:94].ljust(94, ".")
CHUNKS: Final = (CHUNK,) * 12
SUMMARY_LINE: Final = "test result: ok. 142 passed; 0 failed; 3 ignored; finished in 12.07s"
TOOL_RESULT: Final = SUMMARY_LINE * 5
ZERO: Final = Usage(0, 0, 0)
MODEL: Final = "scripted:bench"  # the processor routes by model string: the scripted backend

RUN_COMMAND_SPEC: Final = ToolSpec(
    name=TOOL,
    description="Run a shell command in the workspace and return its output.",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
            "additionalProperties": False,
        },
        sort_keys=True,
    ),
    result_schema=None,
    passive=False,
    toolset="bench",
)


def agent_id(index: int) -> str:
    return f"agent-{index}"


def user_text(turn: int, thread_id: str) -> str:
    return (
        f"Turn {turn}: re-run the affected tests for {thread_id} and summarize any failures "
        "along with the modules they belong to."
    )


def thread_config() -> ThreadConfig:
    return ThreadConfig(
        model=MODEL,
        system_prompt="You are a build agent.",
        tools=(RUN_COMMAND_SPEC,),
        capability=Capability(tenant="bench", tools=(TOOL,), scopes=("bench",), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        # context_window 0: the fold never compacts (pending.py compares against window > 0).
        parent=None,
        context_window=0,
        compaction_threshold=0.8,
        allow_implicit_create=False,
    )


def make_input(thread_id: str, message_id: str, created_at: int, body: InputBody) -> Input:
    return Input(
        message_id=message_id,
        thread_id=thread_id,
        created_at=created_at,
        source="user:bench",
        expires_at=None,
        key_id=None,
        signature=None,
        body=body,
    )


def create_input(thread_id: str, created_at: int) -> Input:
    return make_input(thread_id, f"{thread_id}:create", created_at, CreateThread(thread_config(), (), ()))


def turn_input(thread_id: str, turn: int, created_at: int) -> Input:
    body = UserMessage((TextBlock(user_text(turn, thread_id)),))
    return make_input(thread_id, f"{thread_id}:turn-{turn}", created_at, body)


def wants_tool(request: CompletionRequest) -> bool:
    return not (request.history and isinstance(request.history[-1].body, ToolResultEntry))


class BenchModel:
    """The scripted model of the workload, stateless (a `ModelProvider`)."""

    def models(self) -> tuple[ModelInfo, ...]:
        return (ModelInfo(MODEL, 200_000, supports_images=False),)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        for chunk in CHUNKS:
            yield TextDelta(chunk)
        # Named as hosted providers name calls (`call_...`, `toolu_...`: letters, digits and
        # `_`, unique per turn), so the stage keeps the id as it came (`callids.carried_calls`).
        calls = (ToolCall(f"call_{request.request_id[3:]}", TOOL, ARGUMENTS),) if wants_tool(request) else ()
        yield Finished((TextBlock("".join(CHUNKS)),), calls, ZERO, MODEL)


class BenchTool(InProcessConnector):
    """`run_command`, answered at once with the fixed test summary (no process is run)."""

    name = "bench"
    specs = (RUN_COMMAND_SPEC,)

    def invoke(self, dispatch: Dispatch) -> None:
        self.answer(dispatch, ok=True, content=text(TOOL_RESULT))


class ForgetfulBenchTool(BenchTool):
    """Local mode's tool: no in-memory set of handled dispatches.

    Local mode hands each committed dispatch out exactly once, and the set would grow by
    one entry per tool call, in the very process whose idle memory is measured (in Kafka
    mode the connector's journal is on disk, in another process).
    """

    def submit(self, dispatch: Dispatch) -> None:
        if dispatch.kind == "invoke":
            self.invoke(dispatch)
