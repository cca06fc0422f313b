"""faust-streaming adapter (`pip install 'torpor[faust]'`): Torpor's topics in Faust apps.

- `App` (`app.py`): a `faust.App` whose consumer reads only committed records, on
  Torpor's bootstrap servers; Faust creates none of Torpor's topics.
- `TorporTopics` (`topics.py`): `outbox`, `events`, `receipts` and `inputs` as Faust
  topics whose values are Torpor's records, through `AvroCodec` (`codec.py`), Torpor's
  Avro codec registered as Faust codecs (``torpor_events``, ``torpor_receipts``, ...).
- `FaustConnector` (`connector.py`): a tool connector written as a Faust agent, with the
  effect journal and signed answers of the connector runtime (`connectors.intake`).

The exactly-once core (the processor) stays on confluent-kafka (DESIGN 6); this package
depends on `schemas`, `streams` and `connectors`, and nothing in Torpor depends on it.
Examples: `docs/faust/`.
"""

from __future__ import annotations

try:
    import faust  # noqa: F401  (the extra's presence, checked once with a useful message)
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("torpor.faust needs faust-streaming: pip install 'torpor[faust]'") from exc

from torpor.faust.app import App, broker_url
from torpor.faust.codec import CODEC_NAMES, AvroCodec, register_codecs
from torpor.faust.connector import FaustConnector, ToolCall
from torpor.faust.topics import TorporTopics

__all__ = ["CODEC_NAMES", "App", "AvroCodec", "FaustConnector", "ToolCall", "TorporTopics", "broker_url",
           "register_codecs"]
