"""`torpor demo`, the README's main job, against the test broker: it must pass, and clean up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.waiting import wait_until

pytestmark = pytest.mark.kafka

TORPOR = str(Path(sys.executable).with_name("torpor"))


def test_the_demo_runs_one_agent_exactly_once_and_deletes_its_topics(
    kafka_bootstrap: str, admin: AdminClient
) -> None:
    result = subprocess.run([TORPOR, "demo", "--bootstrap", kafka_bootstrap], capture_output=True, text=True,
                            timeout=180, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # Every input signed: the user's two by the tenant's gateway key, the rest by the processor
    # and the connectors.
    assert "done: 7 inputs, 7 receipts (all applied, 7 signed and verified)" in out
    assert "The build is green, and I waited two seconds to be sure. Done." in out
    prefix = out.split("topics ", 1)[1].split("*", 1)[0]
    assert prefix.startswith("demo.")
    # Deletion is asynchronous on the broker: wait for it, with a deadline.
    wait_until(lambda: not [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)],
               timeout=60, message=f"the demo's topics {prefix}* deleted")
