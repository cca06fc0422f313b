"""The operator's desk: the approvals and controls a person gives from the page, signed.

Contract. `Desk(operator, signer, submit)` turns a decision or a command into the same
`Input` that `torpor approve` / `torpor control` would produce (same bodies, same
message-id rules), as source `operator:<operator>`, signed with the key the UI was
started with (unsigned only in development, without one), and hands it to `submit`
(which produces it to the thread's partition of `inputs` and returns once the broker
acknowledged it). It returns the message id, whose receipt the page then waits for on
the thread's timeline. A request the processor would refuse outright (a bad id, an
unknown command, a missing call id or model) raises `DeskError` before anything is sent;
everything else is the fold's to judge, and its receipt says how it did.

`fork` sends the `fork` control `torpor fork` sends (a new id chosen by the page's user or
generated as the CLI does) and returns a `ForkRequest`: the control's message id (its
receipt is on this thread's timeline), the new thread's id and the message id of its
creation, whose receipt is on the new thread's timeline.
"""

from __future__ import annotations

import time
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from torpor.schemas.errors import TorporError
from torpor.schemas.ids import derive_id, fork_creation_id, fork_thread_id, id_problem
from torpor.schemas.records import ApprovalDecision, Control, Input, InputBody
from torpor.schemas.signer import Signer

# The operator controls the page offers (`delete` is left to the command line on purpose).
COMMANDS: Final = ("stop", "resume", "park", "unpark", "compact", "cancel_call", "set_model")
MAX_TEXT: Final = 1_000


class DeskError(TorporError):
    """A request from the page that is refused before anything is produced (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """A fork the desk asked for: the control's message id, the new thread and its creation's id."""

    message_id: str
    new_thread_id: str
    creation_id: str


@dataclass(frozen=True, slots=True)
class Desk:
    operator: str
    signer: Signer | None
    submit: Callable[[Input], None]

    @property
    def source(self) -> str:
        return f"operator:{self.operator}"

    def approve(self, thread_id: str, approval_id: str, choice: str) -> str:
        _check_id("thread", thread_id)
        _check_id("approval", approval_id)
        _check_text("choice", choice)
        message_id = derive_id(approval_id, "decision", choice)  # as `torpor approve`: twice is a duplicate
        body = ApprovalDecision(approval_id=approval_id, choice=choice, decided_by=self.source)
        return self._send(thread_id, message_id, body)

    def control(self, thread_id: str, command: str, *, call_id: str | None = None, model: str | None = None,
                reason: str | None = None) -> str:
        _check_id("thread", thread_id)
        if command not in COMMANDS:
            raise DeskError(f"unknown command {command[:40]!r}; the page offers {', '.join(COMMANDS)}")
        if (command == "cancel_call") != bool(call_id):
            raise DeskError("a call id goes with cancel_call, and cancel_call needs one")
        if (command == "set_model") != bool(model):
            raise DeskError("a model goes with set_model, and set_model needs one")
        if call_id:
            _check_id("call", call_id)
        for name, value in (("model", model), ("reason", reason)):
            if value is not None:
                _check_text(name, value)
        message_id = derive_id(thread_id, "control", command, uuid.uuid4().hex)
        body = Control(command=command, call_id=call_id or None, model=model or None, reason=reason or None)
        return self._send(thread_id, message_id, body)

    def fork(self, thread_id: str, at_seq: int, *, new_thread_id: str | None = None, model: str | None = None,
             reason: str | None = None) -> ForkRequest:
        _check_id("thread", thread_id)
        if isinstance(at_seq, bool) or not isinstance(at_seq, int) or not 0 <= at_seq < 2**63:
            raise DeskError("at_seq must be the seq of an entry: a whole number from 0")
        new_id = new_thread_id or fork_thread_id(thread_id, uuid.uuid4().hex)
        _check_id("new thread", new_id)
        if new_id == thread_id:
            raise DeskError("a fork needs a new id, not the id of the thread it forks")
        for name, value in (("model", model), ("reason", reason)):
            if value is not None:
                _check_text(name, value)
        message_id = derive_id(thread_id, "fork", new_id, uuid.uuid4().hex)
        body = Control(command="fork", call_id=None, model=model or None, reason=reason or None,
                       new_thread_id=new_id, at_seq=at_seq)
        self._send(thread_id, message_id, body)
        return ForkRequest(message_id, new_id, fork_creation_id(message_id, new_id))

    def _send(self, thread_id: str, message_id: str, body: InputBody) -> str:
        record = Input(message_id=message_id, thread_id=thread_id, created_at=time.time_ns() // 1_000_000,
                       source=self.source, expires_at=None, key_id=None, signature=None, body=body)
        self.submit(self.signer.sign(record) if self.signer is not None else record)
        return message_id


def _check_id(what: str, value: str) -> None:
    _check_unicode(what, value)
    problem = id_problem(value)
    if problem is not None:
        raise DeskError(f"not a {what} id the processor accepts: {problem}")


def _check_text(what: str, value: str) -> None:
    _check_unicode(what, value)
    if not value or len(value) > MAX_TEXT:
        raise DeskError(f"the {what} must be 1 to {MAX_TEXT} characters")
    # Control characters (an escape sequence, a NUL) would be written as they are into
    # terminals (`torpor tail`) and logs that show the input; a person types none but
    # tab and newline.
    control = next((c for c in value if unicodedata.category(c) == "Cc" and c not in "\t\n"), None)
    if control is not None:
        raise DeskError(f"the {what} holds the control character {control!r}")


def _check_unicode(what: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON can carry and no wire text may
        raise DeskError(f"the {what} is not valid Unicode text") from None
