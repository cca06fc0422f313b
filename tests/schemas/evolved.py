"""Version 2 of a few records, as a future build would declare them: an evolution fixture.

`Input` gains an optional `priority` (an envelope field) and `TextBlock` an optional
`lang` (a field deep inside a union inside an array), both with default null; the schema
is `input_v2_schema()`. The classes have the wire names, so the codec maps them to that
schema when it is in the catalog; other records stay those of `records.py`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torpor.schemas import records as r
from torpor.schemas.codec import shipped_catalog


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Plain text, with its language (v2)."""

    text: str
    lang: str | None = None


@dataclass(frozen=True, slots=True)
class UserMessage:
    """A user message whose text blocks carry a language (v2)."""

    content: tuple[TextBlock | r.ImageBlock, ...]


Body = (
    r.CreateThread
    | UserMessage
    | r.Completion
    | r.ToolResult
    | r.ToolEvent
    | r.ChildReport
    | r.ParentMessage
    | r.TimerFired
    | r.ApprovalRequest
    | r.ApprovalDecision
    | r.Control
)


@dataclass(frozen=True, slots=True)
class Input:
    """The input envelope with a priority (v2)."""

    message_id: str
    thread_id: str
    created_at: int
    source: str
    expires_at: int | None
    key_id: str | None
    signature: bytes | None
    body: Body
    priority: int | None = None


def _find_record(node: object, name: str) -> dict[str, object] | None:
    if isinstance(node, list):
        for n in node:
            found = _find_record(n, name)
            if found is not None:
                return found
    elif isinstance(node, dict):
        if node.get("type") == "record":
            if node["name"] == name:
                return node
            for f in node["fields"]:
                found = _find_record(f["type"], name)
                if found is not None:
                    return found
        elif node.get("type") == "array":
            return _find_record(node["items"], name)
    return None


def input_v2_schema() -> dict[str, object]:
    """The current `Input.avsc` plus `Input.priority` and `TextBlock.lang` (both optional)."""
    schema = copy.deepcopy(shipped_catalog().current["Input"].schema)
    fields = schema["fields"]
    assert isinstance(fields, list)
    fields.append(
        {"name": "priority", "type": ["null", "long"], "default": None, "doc": "Scheduling priority (v2)."}
    )
    text_block = _find_record(schema, "TextBlock")
    assert text_block is not None
    text_fields = text_block["fields"]
    assert isinstance(text_fields, list)
    text_fields.append(
        {"name": "lang", "type": ["null", "string"], "default": None, "doc": "BCP 47 tag (v2)."}
    )
    return schema


def input_with_new_branch_schema() -> dict[str, object]:
    """The current `Input.avsc` with a new body branch `Snooze`: not forward compatible."""
    schema = copy.deepcopy(shipped_catalog().current["Input"].schema)
    fields = schema["fields"]
    assert isinstance(fields, list)
    for field in fields:
        if field["name"] == "body":
            field["type"].append(
                {
                    "type": "record",
                    "name": "Snooze",
                    "doc": "A body no current reader knows.",
                    "fields": [{"name": "until", "type": "long", "doc": "Until when."}],
                }
            )
    return schema
