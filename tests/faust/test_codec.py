"""`torpor.faust.codec`: Torpor's Avro records through Faust's codec machinery."""

from __future__ import annotations

import pytest
from faust.serializers import codecs as faust_codecs

from torpor.faust.codec import CODEC_NAMES, AvroCodec, codecs_for, register_codecs
from torpor.schemas.codec import Codec, encode_value
from torpor.schemas.errors import DecodeError
from torpor.schemas.records import Capability, Dispatch, Input, Receipt, ThreadEvent
from torpor.streams.config import Settings, TopicSettings

SETTINGS = Settings(topics=TopicSettings(prefix="test.faustcodec."))
DISPATCH = Dispatch(request_id="rq-1", thread_id="t-1", call_id="c-1", tool="effect", arguments="{}",
                    capability=Capability(tenant="test", tools=("effect",), scopes=(), expires_at=None),
                    attempt=0, created_at=1, deadline=None, kind="invoke")
EVENT = ThreadEvent(event_id="e-1", thread_id="t-1", created_at=5, kind="turn_committed", ephemeral=False,
                    seq=1, entry=None, text="hello", data=None)


def test_each_topic_has_the_record_type_of_the_wire_contract() -> None:
    found = codecs_for(SETTINGS)
    assert {role: c.record_type for role, c in found.items()} == {
        "inputs": Input, "outbox": Dispatch, "events": ThreadEvent, "receipts": Receipt}
    assert found["outbox"].topic == "test.faustcodec.outbox"


def test_a_value_written_by_torpor_reads_back_through_faust_by_name() -> None:
    register_codecs(SETTINGS)
    assert faust_codecs.loads(CODEC_NAMES["outbox"], encode_value(DISPATCH)) == DISPATCH
    written = faust_codecs.dumps(CODEC_NAMES["events"], EVENT)
    assert faust_codecs.loads(CODEC_NAMES["events"], written) == EVENT


def test_faust_writes_the_bytes_every_torpor_producer_writes() -> None:
    codec = AvroCodec(Dispatch, "test.faustcodec.outbox", Codec(None))
    assert codec.dumps(DISPATCH) == encode_value(DISPATCH)


def test_a_chained_codec_keeps_its_topic_and_type() -> None:
    # Faust clones a codec to chain it (`codec | binary`): the clone must still be ours.
    chained = AvroCodec(Dispatch, "test.faustcodec.outbox", Codec(None)) | faust_codecs.get_codec("binary")
    assert isinstance(chained, AvroCodec) and chained.topic == "test.faustcodec.outbox"
    assert chained.loads(chained.dumps(DISPATCH)) == DISPATCH


def test_bytes_of_another_record_type_are_a_decode_error_naming_the_topic() -> None:
    codec = AvroCodec(Dispatch, "test.faustcodec.outbox", Codec(None))
    with pytest.raises(DecodeError, match=r"test\.faustcodec\.outbox"):
        codec.loads(encode_value(EVENT))
    with pytest.raises(DecodeError):
        codec.loads(b"\xc3\x01garbage")
    with pytest.raises(DecodeError):
        codec.loads(encode_value(DISPATCH) + b"\x00")  # trailing bytes


def test_a_value_of_the_wrong_type_is_not_encoded() -> None:
    codec = AvroCodec(Dispatch, "test.faustcodec.outbox", Codec(None))
    with pytest.raises(TypeError, match="carries Dispatch records, not ThreadEvent"):
        codec.dumps(EVENT)
