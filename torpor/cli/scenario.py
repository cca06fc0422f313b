"""Scenario files for `torpor local run`: one thread, a scripted model, and what people do.

A scenario is TOML (or JSON with the same shape)::

    [thread]                      # the root thread
    id = "agent"
    system_prompt = "..."
    tools = ["echo", "watch", "deploy"]     # local tools, by name

    [[model]]                     # scripted-model rules: the first that matches answers
    thread = "agent"              # predicates (all optional): thread, thread_prefix,
    last_contains = "ping"        #   kind (root|child|event|compaction), last_contains
    turns = [{ text = "Pinging.", calls = [{ name = "echo", arguments = { text = "ping" } }] }]

    [[steps]]                     # in order; each step is one of:
    say = "Hello"                 #   user text to the root thread
    wait = "idle"                 #   run until nothing is left to do (optional `timeout`)
    pause = 0.3                   #   keep running for that many seconds of wall time
    decide = "approve"            #   answer the oldest undecided approval request
    stop = "why"                  #   an operator's stop (also: control = "resume" ...)

A turn may also carry `chunks` (streamed pieces), `transient_failures`,
`permanent_failure`, `delay_s` and `usage`. Parsing raises `ScenarioError` naming the
offending entry; a bad file never half-runs.

`torpor local run` needs the whole file (`load`: `[thread]` with an `id`). `torpor
processor --script` needs only the `[[model]]` rules (`load_rules`): threads come from
`inputs` there, so a file of rules alone is a script, and a scenario's `[thread]` and
`[[steps]]` are accepted and not used.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from torpor.processors.models.provider import ScriptedCall, ScriptedTurn, ScriptRule
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Usage


class ScenarioError(ConfigError):
    """The scenario file is malformed: fix the entry the message names."""


@dataclass(frozen=True, slots=True)
class ThreadSpec:
    id: str
    system_prompt: str
    tools: tuple[str, ...]
    model: str = "scripted"
    context_window: int = 200_000


@dataclass(frozen=True, slots=True)
class Say:
    text: str


@dataclass(frozen=True, slots=True)
class WaitIdle:
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Decide:
    choice: str
    decided_by: str = "operator:scenario"


@dataclass(frozen=True, slots=True)
class Command:
    """An operator `Control` command (`stop`, `resume`, `park`, `unpark`, ...)."""

    command: str
    reason: str | None = None


Action = Say | WaitIdle | Pause | Decide | Command


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    thread: ThreadSpec
    rules: tuple[ScriptRule, ...]
    steps: tuple[Action, ...]


SCRIPT_TABLES: Final = frozenset({"model", "thread", "steps"})
"""What a model script may hold: the rules, and a scenario's thread and steps (not used)."""


def load(path: Path) -> Scenario:
    """Read and check a scenario file (`.toml` or `.json`). Raises `ScenarioError`."""
    return parse(_read(path), name=path.stem)


def load_rules(path: Path) -> tuple[ScriptRule, ...]:
    """The scripted-model rules of `path`: its `[[model]]` entries, in order.

    A file of rules alone is enough; a whole scenario file is accepted too (its `[thread]`
    and `[[steps]]` are not used). Raises `ScenarioError` for a file that cannot be read,
    a malformed rule (named), an unknown top-level key (a misspelt `[[models]]` would
    otherwise script nothing, silently), or a file with no rule at all.
    """
    data = _read(path)
    unknown = sorted(set(data) - SCRIPT_TABLES)
    if unknown:
        raise ScenarioError(
            f"model script {path}: unknown top-level {', '.join(unknown)}; a script holds "
            "[[model]] rules (and may hold a scenario's [thread] and [[steps]], which are not used)"
        )
    rules = _rules(data)
    if not rules:
        raise ScenarioError(
            f"model script {path}: no [[model]] rule; each rule is a [[model]] table with "
            "`turns` and optional predicates (thread, thread_prefix, kind, last_contains)"
        )
    return rules


def _read(path: Path) -> dict[str, object]:
    try:
        raw = path.read_bytes()
        data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    return _table(data, str(path))


def _rules(data: dict[str, object]) -> tuple[ScriptRule, ...]:
    return tuple(
        _rule(_table(r, f"[[model]] #{i + 1}"), i)
        for i, r in enumerate(_list(data.get("model", []), "model"))
    )


def parse(data: dict[str, object], name: str = "scenario") -> Scenario:
    """A whole scenario (`torpor local run`): `[thread]` with an `id`, rules, steps."""
    if data.get("thread") is None:
        raise ScenarioError(
            "[thread]: a scenario for `torpor local run` needs a [thread] table with an `id` "
            "(a file of [[model]] rules alone is a script for `torpor processor --script`)"
        )
    thread = _table(data.get("thread"), "[thread]")
    spec = ThreadSpec(
        id=_str(thread, "id", "[thread]"),
        system_prompt=str(thread.get("system_prompt", "You are a helpful agent.")),
        tools=tuple(str(t) for t in _list(thread.get("tools", []), "[thread].tools")),
        model=str(thread.get("model", "scripted")),
        context_window=int(str(thread.get("context_window", 200_000))),
    )
    rules = _rules(data)
    steps = tuple(
        _step(_table(s, f"[[steps]] #{i + 1}"), i)
        for i, s in enumerate(_list(data.get("steps", []), "steps"))
    )
    return Scenario(name=name, thread=spec, rules=rules, steps=steps)


def _rule(rule: dict[str, object], index: int) -> ScriptRule:
    where = f"[[model]] #{index + 1}"
    turns = tuple(
        _turn(_table(t, f"{where} turn {j + 1}")) for j, t in enumerate(_list(rule.get("turns", []), where))
    )
    return ScriptRule(
        turns=turns,
        thread=_opt(rule, "thread"),
        thread_prefix=_opt(rule, "thread_prefix"),
        kind=_opt(rule, "kind"),
        last_contains=_opt(rule, "last_contains"),
    )


def _turn(turn: dict[str, object]) -> ScriptedTurn:
    chunks = tuple(str(c) for c in _list(turn.get("chunks", []), "chunks"))
    if not chunks and "text" in turn:
        words = str(turn["text"]).split(" ")
        chunks = tuple(w if i == len(words) - 1 else w + " " for i, w in enumerate(words))
    calls = tuple(
        ScriptedCall(
            name=_str(call, "name", "call"), arguments=json.dumps(call.get("arguments", {}), sort_keys=True)
        )
        for call in (_table(c, "call") for c in _list(turn.get("calls", []), "calls"))
    )
    usage = turn.get("usage")
    return ScriptedTurn(
        chunks=chunks,
        tool_calls=calls,
        usage=Usage(*(int(str(x)) for x in _list(usage, "usage"))) if usage is not None else None,
        transient_failures=int(str(turn.get("transient_failures", 0))),
        permanent_failure=bool(turn.get("permanent_failure", False)),
        delay_s=float(str(turn.get("delay_s", 0.0))),
    )


def _step(step: dict[str, object], index: int) -> Action:
    where = f"[[steps]] #{index + 1}"
    if "say" in step:
        return Say(_str(step, "say", where))
    if "wait" in step:
        return WaitIdle(float(str(step.get("timeout", 30.0))))
    if "pause" in step:
        return Pause(float(str(step["pause"])))
    if "decide" in step:
        return Decide(_str(step, "decide", where), str(step.get("by", "operator:scenario")))
    if "stop" in step:
        return Command("stop", str(step["stop"]))
    if "control" in step:
        return Command(_str(step, "control", where), _opt(step, "reason"))
    raise ScenarioError(
        f"{where}: expected one of say, wait, pause, decide, stop, control; got {sorted(step)}"
    )


def _table(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a table, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _str(table: dict[str, object], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}: `{key}` must be a non-empty string")
    return value


def _opt(table: dict[str, object], key: str) -> str | None:
    value = table.get(key)
    return None if value is None else str(value)
