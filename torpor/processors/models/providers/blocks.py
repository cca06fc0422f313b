"""What the two content-block APIs, Anthropic Messages and Bedrock Converse, share (pure).

Both spell a turn as a list of typed content blocks, unlike OpenAI's chat messages, and
both mappings (`mapping_anthropic`, `mapping_bedrock`) need the same three things:

- `tool_input(arguments)`: a call's JSON arguments as the object both APIs require for a
  tool-use block's input. Arguments that are not a JSON object (a model's malformed
  call, which the fold already answered with an error result) go to the model as it
  wrote them, under `invalid_arguments`.
- `unsupported_image(block)`: the note a model reads in place of an image whose media
  type the API does not take.
- `StreamedBlock`: one content block of a streamed answer while its pieces arrive. Both
  APIs number the blocks of a turn, open each (its kind; for a tool call, its id and
  name), then send deltas of text, reasoning, signature or JSON input; the turn
  (`MessageTurn`, `ConverseTurn`) keeps the blocks by number until the stream ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torpor.schemas.jsontext import parse_json
from torpor.schemas.records import ImageBlock


def tool_input(arguments: str) -> dict[str, object]:
    """The JSON object for a tool-use block's input: `arguments` parsed, or under `invalid_arguments`."""
    try:
        value = parse_json(arguments or "{}")
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"invalid_arguments": arguments}


def unsupported_image(block: ImageBlock) -> str:
    """The text sent instead of `block`, whose media type the API does not take."""
    return f"[image of unsupported type {block.media_type} omitted]"


@dataclass(slots=True)
class StreamedBlock:
    """One content block of a streamed answer, its pieces gathered in arrival order."""

    kind: str
    """What the block is (`text`, `tool_use`, Anthropic's `thinking`, Converse's `reasoning`, ...)."""
    text: list[str] = field(default_factory=list)
    """Text, reasoning or the JSON input of a tool call, as the deltas brought it."""
    signature: str | None = None
    call_id: str = ""
    name: str = ""
    start_input: str = "{}"
    """A tool call's input as its block opened, used when no JSON delta followed: Anthropic
    may send one; Converse sends none, so it stays the empty object."""
