"""The short fault run for CI: every kill point once, one zombie, one broker restart.

It runs `tests.faults.harness.run_soak` with its own broker (in the test's tmp dir, not
the shared one): 7 threads, 7 kills (one at each point of `torpor.streams.faults.POINTS`),
then the read_committed audit. The long soak is `python -m tests.faults.soak` (docs/faults.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Final

import pytest

from tests.faults.harness import SoakConfig, run_soak
from torpor.streams import faults

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CONFIG: Final = SoakConfig(kills=len(faults.POINTS), threads=7, seed=20261203, root=Path("run"),
                           broker_dir=Path("broker"))
# pytest-timeout must not cut the harness short of its own report: the phases before the
# finish wait take about a minute here (each bounded: a kill by `kill_timeout`, the zombie's
# waits by 60-90 s), then come the finish wait, a minute for the processes to stop and the
# audit. 600 s more than the finish wait leaves the harness time to report on a slow
# machine, and keeps a stuck run well inside CI's budget.
TIMEOUT: Final = CONFIG.finish_timeout + 600


@pytest.mark.timeout(TIMEOUT)
def test_kills_at_every_point_a_zombie_and_a_broker_restart_lose_nothing_and_repeat_nothing(
        tmp_path: Path) -> None:
    report = run_soak(replace(CONFIG, root=tmp_path / "run", broker_dir=tmp_path / "broker"))
    print(report.summary())
    assert report.problems == [], report.summary()
    assert dict(report.kills) == {point: 1 for point in faults.POINTS}, report.summary()
    assert not report.missed, report.summary()
    assert report.receipts >= report.inputs > 0
    assert "exited 2" in report.zombie or "its transaction refused" in report.zombie, report.zombie


def test_an_unset_fault_is_a_no_op_and_a_malformed_one_is_a_clear_error() -> None:
    assert faults.parse(None) is None and faults.parse("  ") is None
    for bad in ("after_commit:3", "before_commit:0", "before_commit:x", "mid_transaction:1:pause",
                "random:1:0", "random:x:0.5", "nonsense"):
        with pytest.raises(faults.FaultSpecError, match=faults.ENV):
            faults.parse(bad)
    plan = faults.parse("before_commit:2:stop")
    assert plan is not None and plan.target == "before_commit" and plan.nth == 2 and plan.stop
    faults.point("before_commit")  # TORPOR_FAULT is unset in the test process: nothing happens
