"""The fault harness's supervisor: a service that exits while it should run is restarted and reported.

No broker: the services are stand-in processes; what is checked is the harness's own rule
(the connector always, the processors only while `supervising`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.faults.harness import Soak, SoakConfig


def _service(soak: Soak, name: str, code: str) -> tuple[subprocess.Popen[bytes], Path]:
    return soak.start([sys.executable, "-c", code], name)


def test_an_exited_service_is_restarted_and_reported_only_when_it_should_run(tmp_path: Path) -> None:
    said: list[str] = []
    soak = Soak(SoakConfig(kills=0, threads=1, seed=1, root=tmp_path, broker_dir=tmp_path / "broker"),
                said.append)
    restarted: list[str] = []

    def again(name: str) -> tuple[subprocess.Popen[bytes], Path]:
        restarted.append(name)
        started = _service(soak, name, "import time; time.sleep(60)")
        soak.services[name] = (*started, lambda: again(name))
        return started

    for name in ("echo", "p0"):
        process, log = _service(soak, name, "print('fatal: FencedError: gone')")
        process.wait(30)
        soak.services[name] = (process, log, lambda n=name: again(n))  # type: ignore[misc]
    try:
        soak.supervise()  # not supervising the processors: only the connector comes back
        assert restarted == ["echo"]
        assert len(soak.report.restarts) == 1
        assert soak.report.restarts[0].startswith("echo exited 0 at ")
        assert "fatal: FencedError: gone" in soak.report.restarts[0]
        soak.supervising = True
        soak.supervise()
        assert restarted == ["echo", "p0"] and soak.report.restarts[1].startswith("p0 exited 0")
        soak.supervise()  # both run now: nothing more
        assert len(soak.report.restarts) == 2
        assert "restarted by the supervisor: echo exited 0" in soak.report.summary()
        assert said == [f"  supervisor: {line}" for line in soak.report.restarts]
    finally:
        for process in soak.processes:
            if process.poll() is None:
                process.kill()
                process.wait(30)
