"""A deleted thread stays deleted on a real broker, against the bytes of its own creation.

A processor with a key ring; a gateway creates a thread with its key (`torpor send
--new`), an operator deletes it (`torpor control delete`). The attacker can read
`inputs`: it copies the creation record, byte for byte (signature included), and
produces it again. The copy gets one receipt, `duplicate`, with the genuine provenance
(`verified`): the deleted thread kept its seen rows. A creation sent after the deletion
starts the thread anew, and the old copy, produced again into the new life, is a
duplicate there too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient

from tests.processors.keyed_deployment import KeyedDeployment, keyed_processor
from tests.processors.test_processor import TORPOR
from tests.waiting import wait_until
from torpor.schemas.codec import decode_value
from torpor.schemas.records import CreateThread, Input, Receipt

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0


@pytest.fixture
def keyed(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[KeyedDeployment]:
    with keyed_processor(kafka_bootstrap, admin, tmp_path, f"test.deleted.{uuid.uuid4().hex[:10]}.",
                         (("ops-1", "operator:*"), ("gw-1", "user:*"))) as found:
        yield found


def _create(deployment: KeyedDeployment, thread: str) -> None:
    sent = deployment.run([TORPOR, "send", thread, "hello", "--new", "--model", "scripted", "--source",
                           "user:alice", "--wait", "60", *deployment.signed("gw-1")])
    assert sent.returncode == 0, sent.stdout + sent.stderr


def _receipts_of(deployment: KeyedDeployment, message_id: str, count: int) -> list[Receipt]:
    return wait_until(
        lambda: found if len(found := [r for r in deployment.receipts() if r.input_id == message_id]) >= count
        else None,
        timeout=WAIT_S, message=lambda: f"{count} receipts of {message_id}; processor log:\n"
                                f"{deployment.log('processor')[-2000:]}")


def test_the_captured_bytes_of_a_deleted_threads_creation_do_not_bring_it_back(
        keyed: KeyedDeployment) -> None:
    thread = f"gone-{uuid.uuid4().hex[:8]}"
    _create(keyed, thread)
    [(key, value, partition)] = [
        (k, v, p) for k, v, p in keyed.records("inputs")
        if (record := decode_value(v or b"", Input)).thread_id == thread
        and isinstance(record.body, CreateThread)]
    creation = decode_value(value or b"", Input)
    assert creation.signature is not None and creation.key_id == "gw-1"

    deleted = keyed.run([TORPOR, "control", thread, "delete", "--reason", "done", "--wait", "60",
                         *keyed.signed("ops-1")])
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr

    keyed.send_raw(key or b"", value or b"", partition)  # the attacker's copy, byte for byte
    first, copy = _receipts_of(keyed, creation.message_id, 2)
    assert (first.disposition, copy.disposition) == ("applied", "duplicate"), copy
    assert copy.provenance == "verified", copy  # a genuine signature: the seen row absorbs it

    _create(keyed, thread)  # made after the deletion: applied (`--wait` exits 1 otherwise), anew
    keyed.send_raw(key or b"", value or b"", partition)  # and once more, into the new life
    *_, again = _receipts_of(keyed, creation.message_id, 3)
    assert again.disposition == "duplicate", again
