"""The approval relay: tools that ask a person first and act on the decision, exactly once.

`ApprovalRelay` is the base. On `invoke` it checks the capability, then sends an
`ApprovalRequest` (id `approval-<call_id>`, message id derived from the request id) and
waits; nothing runs meanwhile, so local mode is idle and a person (or a scenario) can
decide. The fold keeps the approval pending, accepts one `ApprovalDecision` for it
(unknown, expired or invalid-choice decisions are rejected there) and turns it into an
`approval_decision` dispatch back to this tool; the relay then calls `decided(invoke,
choice, decided_by)`, which answers the original call.

Exactly once: the decision acts only while its call is waiting, and the waiting entry
is taken before acting, so a redelivered decision dispatch (same request id: ignored by
`InProcessConnector.submit`) or a second decision for the same call (another request
id) finds nothing and does nothing; so does a decision after a `cancel`. A capability
that expired between the request and the decision refuses the action (error result).

After a restart the waiting calls (in memory) are gone; the connector runtime submits
every unfinished `invoke` again before its later dispatches (the journal), and a
re-sent invoke sends the same `ApprovalRequest` (same message id: a duplicate to the
fold) and waits again, so the decision still finds its call. A decision for a call that
is not waiting is logged, never acted on.

`deploy` (`DeployTool`) is the relay used by local mode: `deployed <target>` or a refusal.
"""

from __future__ import annotations

import json
import logging
from typing import Final

from torpor.connectors.capability import check
from torpor.connectors.inprocess import Clock, InProcessConnector, InputSink, text
from torpor.schemas.records import ApprovalRequest, Dispatch, ToolSpec

log = logging.getLogger(__name__)

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


def approval_id(dispatch: Dispatch) -> str:
    return f"approval-{dispatch.call_id}"


class ApprovalRelay(InProcessConnector):
    """Base for tools that need a person's decision before they act."""

    choices: tuple[str, ...] = (APPROVE, REJECT)
    approval_ttl_ms: int | None = None
    """How long a person has to decide (None: no limit); the fold rejects a later decision."""
    required_scopes: tuple[str, ...] = ()

    def __init__(self, sink: InputSink, clock: Clock) -> None:
        super().__init__(sink, clock)
        self._waiting: dict[tuple[str, str], Dispatch] = {}  # (thread, call) -> the invoke

    @property
    def waiting(self) -> int:
        """Calls waiting for a decision (not `busy`: a person, not this process, moves next)."""
        return len(self._waiting)

    def question(self, invoke: Dispatch) -> str:
        """The prompt a person sees. Subclasses override; raise ValueError for bad arguments."""
        return f"Run {invoke.tool} with {invoke.arguments}?"

    def decided(self, invoke: Dispatch, choice: str, decided_by: str) -> None:
        """Act on the decision and answer `invoke` (called at most once per call)."""
        if choice == APPROVE:
            self.answer(invoke, ok=True, content=text(f"{invoke.tool} approved by {decided_by}"))
        else:
            self.answer(invoke, ok=False, content=text(f"{invoke.tool} {choice} by {decided_by}"))

    def invoke(self, dispatch: Dispatch) -> None:
        refusal = check(dispatch, self._clock(), self.required_scopes)
        if refusal is not None:
            self.answer(dispatch, ok=False, content=text(refusal))
            return
        try:
            prompt = self.question(dispatch)
        except (ValueError, KeyError, TypeError) as error:
            self.answer(dispatch, ok=False, content=text(f"{dispatch.tool}: bad arguments: {error!r}"))
            return
        self._waiting[(dispatch.thread_id, dispatch.call_id)] = dispatch
        expires_at = None if self.approval_ttl_ms is None else dispatch.created_at + self.approval_ttl_ms
        request = ApprovalRequest(
            approval_id=approval_id(dispatch),
            call_id=dispatch.call_id,
            request_id=dispatch.request_id,
            prompt=prompt,
            choices=self.choices,
            default_choice=None,
            expires_at=expires_at,
        )
        self.produce(dispatch.thread_id, dispatch.request_id, request, "approval")

    def decide(self, dispatch: Dispatch) -> None:
        where = {"thread_id": dispatch.thread_id, "message_id": dispatch.request_id}
        invoke = self._waiting.pop((dispatch.thread_id, dispatch.call_id), None)
        if invoke is None:
            log.warning("approval decision for call %s, which is not waiting: ignored", dispatch.call_id,
                        extra=where)
            return
        try:
            decision = json.loads(dispatch.arguments)
            choice = str(decision["choice"])
            decided_by = str(decision.get("decided_by", "someone"))
        except (ValueError, KeyError, TypeError) as error:
            self.answer(invoke, ok=False, content=text(f"{invoke.tool}: unreadable decision: {error!r}"))
            return
        if decision.get("approval_id", approval_id(invoke)) != approval_id(invoke):
            self.answer(invoke, ok=False, content=text(f"{invoke.tool}: decision for another approval"))
            return
        # The capability may have expired while a person thought it over.
        refusal = check(invoke, self._clock(), self.required_scopes)
        if refusal is not None:
            self.answer(invoke, ok=False, content=text(refusal))
            return
        self.decided(invoke, choice, decided_by)

    def cancel(self, thread_id: str, call_id: str) -> None:
        self._waiting.pop((thread_id, call_id), None)
        super().cancel(thread_id, call_id)


class DeployTool(ApprovalRelay):
    name = "deploy"
    specs = (DEPLOY_SPEC,)

    def question(self, invoke: Dispatch) -> str:
        return f"Deploy {self._target(invoke)}?"

    def decided(self, invoke: Dispatch, choice: str, decided_by: str) -> None:
        target = self._target(invoke)
        if choice == APPROVE:
            self.answer(invoke, ok=True, content=text(f"deployed {target}"))
        else:
            self.answer(invoke, ok=False, content=text(f"deployment of {target} rejected by {decided_by}"))

    @staticmethod
    def _target(invoke: Dispatch) -> str:
        return str(json.loads(invoke.arguments)["target"])
