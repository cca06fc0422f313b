"""A `ThreadTask` tells its observer only what a checkpoint committed, without a broker.

The task is driven as the loop drives it: a batch folded and then aborted (its work is
dropped with the overlay), the same batch folded again and committed. The observer
counts the inputs once, with the offset the commit reached; a poison record counts as
its one `parked` receipt. The processor's Kafka clients are built but never used: their
bootstrap address answers nothing.
"""

from __future__ import annotations

from pathlib import Path

from tests.processors.test_processor import _conversation
from torpor.processors.metrics import ProcessorMetrics
from torpor.processors.models.provider import ScriptedModel
from torpor.processors.processor import Processor, ProcessorConfig
from torpor.schemas.codec import encode_value
from torpor.streams.config import KafkaSettings, Settings
from torpor.streams.task import InputRecord, StoredOffsets


def test_an_aborted_batch_is_not_counted_and_its_refold_is_counted_once(tmp_path: Path) -> None:
    metrics = ProcessorMetrics()
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"))  # nothing listens there
    processor = Processor(settings, ProcessorConfig(instance="p0", store_dir=tmp_path), ScriptedModel([]),
                          inputs_partitions=1, observer=metrics)
    try:
        topic = processor.topics.inputs
        values = [encode_value(i) for i in _conversation("t-1", "hello")] + [b"poison"]
        records = [InputRecord(topic, 0, offset, b"t-1", value, 1_000) for offset, value in enumerate(values)]
        task = processor._open_task(0)
        task.start()
        task.process(records)
        task.abort()
        assert metrics.registry.get_sample_value("torpor_inputs_total", {"disposition": "applied",
                                                                         "reason": ""}) is None
        task.process(records)
        task.commit(StoredOffsets(None, 3))
        assert metrics.registry.get_sample_value("torpor_inputs_total", {"disposition": "applied",
                                                                         "reason": ""}) == 2
        assert metrics.registry.get_sample_value("torpor_inputs_total", {"disposition": "parked",
                                                                         "reason": ""}) == 1
        assert metrics.owned()[0][1] == 3
        task.close()
        assert metrics.owned() == {}
    finally:
        processor.stages.stop()
