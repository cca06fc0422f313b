"""A Torpor tool connector written as a Faust agent: `effect` appends a line to a file.

The effect is outside Torpor (a file here; a payment, an e-mail, a ticket elsewhere), so
the tool has a reconciler: after a crash between the effect and its answer, the next
worker finds the effect by the call's request id and answers without doing it again.
Answers are signed with the connector's key and journaled (`torpor.faust.connector`).

Run it, with Torpor's topics created (`torpor topics create`) and a processor whose key
ring holds this connector's key:

    torpor keys new --id faust-1 --source connector:effect --tool effect \
        --out-dir keys --keyring keyring.toml        # the processor runs with TORPOR_KEYRING=keyring.toml
    export TORPOR_BOOTSTRAP=127.0.0.1:9092
    export TORPOR_SIGNING_KEY_ID=faust-1 TORPOR_SIGNING_KEY=keys/faust-1.pem
    export EFFECT_FILE=effects.txt
    python docs/faust/effect_connector.py worker --without-web --loglevel=info

Settings come from the `TORPOR_*` variables (`torpor.streams.config.load_settings`);
`TORPOR_JOURNAL_DIR` moves the effect journal (default `.torpor/faust/<app id>`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import faust

from torpor.faust import App, FaustConnector, ToolCall
from torpor.schemas.records import Dispatch, ToolSpec
from torpor.schemas.signer import Signer, SignerSettings
from torpor.streams.config import load_settings

EFFECT_SPEC = ToolSpec(
    name="effect",
    description="Write a note into the effect file (an effect outside Torpor).",
    parameters=json.dumps({"type": "object", "properties": {"note": {"type": "string"}},
                           "additionalProperties": False}, sort_keys=True),
    result_schema=None,
    passive=False,
    toolset="faust",
)

settings = load_settings(os.environ, None)
key_id, key_file = os.environ.get("TORPOR_SIGNING_KEY_ID"), os.environ.get("TORPOR_SIGNING_KEY")
signer = Signer.from_settings(SignerSettings(key_id, Path(key_file))) if key_id and key_file else None
app_id = f"{settings.topics.prefix}faust-effect"
app = App(
    app_id,
    settings=settings,
    # A restarted worker takes its predecessor's place in the group at once (static
    # membership) instead of waiting for the dead member's session to time out.
    consumer_group_instance_id=f"{app_id}-0",
    broker_session_timeout=10.0,
    topic_disable_leader=True,  # no Faust leader election, so no topic of Faust's own is created
)
effect = FaustConnector(
    app, name="effect", specs=(EFFECT_SPEC,), signer=signer,
    journal_dir=Path(os.environ.get("TORPOR_JOURNAL_DIR", f".torpor/faust/{app_id}")),
)
EFFECTS = Path(os.environ.get("EFFECT_FILE", "effects.txt"))


def performed() -> dict[str, str]:
    """Request id -> note, for every effect in the file."""
    if not EFFECTS.exists():
        return {}
    lines = (line.split(" ", 1) for line in EFFECTS.read_text().splitlines() if line)
    return {parts[0]: parts[1] if len(parts) > 1 else "" for parts in lines}


@effect.reconciler
def already_written(call: ToolCall) -> str | None:
    """Asked after a crash: did this call's effect happen? Its answer if so."""
    note = performed().get(call.request_id)
    return None if note is None else f"wrote {note!r} (found after a restart)"


@app.agent(effect.outbox)
async def serve(dispatches: faust.StreamT[Dispatch]) -> None:
    async for call in effect.calls(dispatches):
        note = str(call.arguments.get("note", ""))
        try:
            with EFFECTS.open("a") as out:  # the effect, durable before it is answered
                out.write(f"{call.request_id} {note}\n")
                out.flush()
                os.fsync(out.fileno())
        except OSError as error:  # answered now, rather than at the worker's next start
            call.fail(f"could not write the note: {error}")
            continue
        call.answer(f"wrote {note!r}")


if __name__ == "__main__":
    app.main()
