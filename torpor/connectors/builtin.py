"""What the built-in tools that act on the world (`http_request`, `run_command`) share.

- `builtin_spec(name, description, parameters)`: the tool's `ToolSpec`: toolset
  `builtin`, active (the model calls it; `passive=False`), no result schema, and
  `parameters` written as JSON with sorted keys, so the spec is the same text every run.
- `arguments_object(arguments)`: a call's JSON arguments as an object, or `BadArguments`
  saying why not; `timeout_argument(args, default_s, max_s)`: its `timeout_s`, checked.
  Each tool then reads its own fields and raises `BadArguments` for those too; the tool
  answers the call with the message as an error result.
- `BuiltinTool`: the base of such a tool. `answer_if_refused(dispatch)` is the check it
  makes before any work (`capability.check` against its `required_scopes`): a refused
  call is answered with the reason, and the tool does nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from torpor.connectors.capability import check
from torpor.connectors.inprocess import InProcessConnector, text
from torpor.schemas.records import Dispatch, ToolSpec


def builtin_spec(name: str, description: str, parameters: Mapping[str, object]) -> ToolSpec:
    """The spec of an active `builtin` tool without a result schema (module docstring)."""
    return ToolSpec(
        name=name,
        description=description,
        parameters=json.dumps(parameters, sort_keys=True),
        result_schema=None,
        passive=False,
        toolset="builtin",
    )


class BadArguments(ValueError):
    """The arguments do not describe a call the tool can make: the call gets an error result."""


def arguments_object(arguments: str) -> dict[str, object]:
    """The call's arguments, which must be a JSON object. Raises `BadArguments` otherwise."""
    try:
        parsed = json.loads(arguments)
    except ValueError as error:
        raise BadArguments(f"arguments are not JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise BadArguments("arguments must be an object")
    return parsed


def timeout_argument(args: Mapping[str, object], default_s: float, max_s: float) -> float:
    """The `timeout_s` of `args` (`default_s` if absent), seconds in (0, `max_s`].

    Raises `BadArguments` for anything else.
    """
    timeout = args.get("timeout_s", default_s)
    # bool is an int to Python, but `true` is no number of seconds.
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= max_s:
        raise BadArguments(f"timeout_s must be a number in (0, {max_s:g}]")
    return float(timeout)


class BuiltinTool(InProcessConnector):
    """An in-process tool that acts only on a dispatch its capability allows."""

    required_scopes: tuple[str, ...] = ()
    """Scopes a thread's capability must hold for the tool to act (a deployment subclasses to require one)."""

    def answer_if_refused(self, dispatch: Dispatch) -> bool:
        """True if the capability refuses `dispatch`; the call is then answered here with the reason."""
        refusal = check(dispatch, self._clock(), self.required_scopes)
        if refusal is None:
            return False
        self.answer(dispatch, ok=False, content=text(refusal))
        return True
