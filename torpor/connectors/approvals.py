"""`deploy`: a tool that asks a person first (`ApprovalRequest`) and finishes on the decision.

On `invoke` it sends an `ApprovalRequest` (choices `approve`, `reject`) to the thread and
waits; nothing runs meanwhile, so local mode is idle and a person (or a scenario) can
decide. The fold turns the `ApprovalDecision` into an `approval_decision` dispatch back
to this tool, which then answers the original call: `deployed <target>` or a refusal.
The waiting calls live in memory (local mode); a durable journal is the connector
runtime's job (a later issue).
"""

from __future__ import annotations

import json
from typing import Final

from torpor.connectors.inprocess import Clock, InProcessConnector, InputSink, text
from torpor.schemas.records import ApprovalRequest, Dispatch, ToolSpec

APPROVE: Final = "approve"
REJECT: Final = "reject"

DEPLOY_SPEC: Final = ToolSpec(
    name="deploy",
    description="Deploy a target. A person must approve it first.",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {"target": {"type": "string"}},
            "required": ["target"],
            "additionalProperties": False,
        },
        sort_keys=True,
    ),
    result_schema=None,
    passive=False,
    toolset="local",
)


class DeployTool(InProcessConnector):
    name = "deploy"
    specs = (DEPLOY_SPEC,)

    def __init__(self, sink: InputSink, clock: Clock) -> None:
        super().__init__(sink, clock)
        self._waiting: dict[tuple[str, str], Dispatch] = {}  # (thread, call) -> the invoke

    def invoke(self, dispatch: Dispatch) -> None:
        target = str(json.loads(dispatch.arguments)["target"])
        self._waiting[(dispatch.thread_id, dispatch.call_id)] = dispatch
        request = ApprovalRequest(
            approval_id=f"approval-{dispatch.call_id}",
            call_id=dispatch.call_id,
            request_id=dispatch.request_id,
            prompt=f"Deploy {target}?",
            choices=(APPROVE, REJECT),
            default_choice=None,
            expires_at=None,
        )
        self.produce(dispatch.thread_id, dispatch.request_id, request, "approval")

    def decide(self, dispatch: Dispatch) -> None:
        invoke = self._waiting.pop((dispatch.thread_id, dispatch.call_id), None)
        if invoke is None:
            return  # decided twice, or after a cancel: nothing left to answer
        decision = json.loads(dispatch.arguments)
        target = str(json.loads(invoke.arguments)["target"])
        if decision.get("choice") == APPROVE:
            self.answer(invoke, ok=True, content=text(f"deployed {target}"))
        else:
            who = decision.get("decided_by", "someone")
            self.answer(invoke, ok=False, content=text(f"deployment of {target} rejected by {who}"))

    def cancel(self, thread_id: str, call_id: str) -> None:
        self._waiting.pop((thread_id, call_id), None)
        super().cancel(thread_id, call_id)
