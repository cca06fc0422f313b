"""Restore from the changelog, and the offset check that gates folding.

Broker tests run the counter task (`tests/streams/counter_task.py`) in a child process:
a wiped store must come back from the changelog alone, equal to what it was, without
folding any input again; a store whose input offset disagrees with the group's
committed offset must make the processor refuse to fold, loudly, and exit non-zero.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from tests.conftest import TopicFactory
from tests.streams.counter_rig import CounterRig, assert_exactly_once
from torpor.schemas.errors import StoreCorruptedError
from torpor.streams.restore import (
    OffsetMismatchError,
    check_offsets,
    decode_checkpoint,
    encode_checkpoint,
)


@pytest.fixture
def rig(kafka_bootstrap: str, topic_factory: TopicFactory, tmp_path: Path) -> Iterator[CounterRig]:
    rig = CounterRig(
        bootstrap=kafka_bootstrap,
        inputs=topic_factory(2),
        changelog=topic_factory(2, {"cleanup.policy": "compact"}),
        out=topic_factory(2),
        parked=topic_factory(2),
        group=f"restore-{uuid.uuid4().hex[:12]}",
        store=tmp_path / "stores",
        partitions=2,
    )
    yield rig
    rig.kill_all()


def test_the_checkpoint_record_carries_the_input_offset() -> None:
    assert decode_checkpoint(encode_checkpoint(1234)) == 1234
    with pytest.raises(StoreCorruptedError):
        decode_checkpoint(b"\x01")


def test_a_store_in_step_with_the_group_may_fold() -> None:
    check_offsets("inputs", 0, None, None)
    check_offsets("inputs", 0, 17, 17)


@pytest.mark.parametrize(("stored", "committed"), [(None, 5), (5, None), (4, 5), (6, 5)])
def test_a_store_out_of_step_with_the_group_is_refused_naming_both_offsets(
    stored: int | None, committed: int | None
) -> None:
    with pytest.raises(OffsetMismatchError, match=r"refusing to fold inputs\[2\]"):
        check_offsets("inputs", 2, stored, committed)


@pytest.mark.kafka
def test_a_wiped_store_rebuilds_from_the_changelog_without_folding_again(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(400)
    assert rig.run_until_idle().returncode == 0
    before = rig.counts()
    shutil.rmtree(rig.store)
    result = rig.run_until_idle()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "changelog records from offset 0" in result.stderr
    assert rig.counts() == before
    assert_exactly_once(rig, inputs)  # nothing reached `out` twice: the inputs were not re-folded


@pytest.mark.kafka
def test_a_store_whose_input_offset_disagrees_with_the_group_refuses_to_fold(rig: CounterRig) -> None:
    inputs = rig.produce_inputs(200)
    assert rig.run_until_idle().returncode == 0
    partition = next(p for p, offset in rig.committed_offsets().items() if offset > 0)
    db = Rdict(str(rig.store / f"p{partition}"), Options(raw_mode=True))
    db[b"\x00meta.input"] = b"3"  # the store now claims only three inputs were folded
    db.close()
    more = rig.produce_inputs(50, first=200)
    refused = rig.run_until_idle()
    assert refused.returncode == 2
    assert f"refusing to fold {rig.inputs}[{partition}]" in refused.stderr
    assert "offset 3" in refused.stderr
    # Deleting the bad store is the documented remedy: it rebuilds from the changelog.
    shutil.rmtree(rig.store / f"p{partition}")
    assert rig.run_until_idle().returncode == 0
    assert_exactly_once(rig, inputs + more)
