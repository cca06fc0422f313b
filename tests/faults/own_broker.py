"""A broker of a test's own, to freeze, stop and bring back (never the shared one).

`OwnBroker.start(dir)` runs `torpor broker start --dir DIR --port <free>`. Then:

- `pause()` / `resume()`: SIGSTOP / SIGCONT the broker process. Requests in flight hang
  (a commit times out) without a connection being refused: a stalled broker, on purpose.
- `stop()`: SIGTERM, and wait until it is gone: the broker is away, connections refused.
- `restart()`: run the stopped broker's own command line again, same dir and port, its
  data kept (`torpor broker start` formats a fresh log every start, which would lose
  every topic), and wait until it answers with its topics.
- `close()`: stop whatever of it still runs (each process by its own pid).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka.admin import AdminClient

from tests.waiting import wait_until
from torpor.streams.broker import broker_status

REPO: Final = Path(__file__).resolve().parents[2]
TORPOR: Final = str(Path(sys.executable).with_name("torpor"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def is_running(pid: int) -> bool:
    """The process runs (a zombie not yet reaped by init counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@dataclass(slots=True)
class OwnBroker:
    directory: Path
    port: int
    bootstrap: str
    pid: int
    _argv: list[str] = field(default_factory=list)
    _restarted: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, directory: Path, port: int | None = None) -> OwnBroker:
        port = port or free_port()
        done = subprocess.run([TORPOR, "broker", "start", "--dir", str(directory), "--port", str(port)],
                              cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"torpor broker start failed: {done.stderr[-2000:]}")
        state = broker_status(directory)
        if state is None:
            raise RuntimeError(f"no broker runs from {directory} after its start")
        argv = Path(f"/proc/{state.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        return cls(directory, port, done.stdout.strip().splitlines()[-1], state.pid,
                   [a.decode() for a in argv])

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM the broker and wait until it is gone (a paused one is woken first)."""
        if not is_running(self.pid):
            return
        os.kill(self.pid, signal.SIGCONT)
        os.kill(self.pid, signal.SIGTERM)
        wait_until(lambda: not is_running(self.pid), timeout=90, message="the broker stops")

    def restart(self, *, topic: str | None = None) -> None:
        """Start the stopped broker again from its own command line; wait until it answers
        (and, given `topic`, until its metadata shows that topic again)."""
        with open(self.directory / "restarted.log", "ab") as log:
            self._restarted = subprocess.Popen(self._argv, cwd=self.directory, stdin=subprocess.DEVNULL,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self._restarted.pid
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

        def answers() -> bool:
            topics = admin.list_topics(timeout=5).topics
            return topic is None or topic in topics

        wait_until(answers, timeout=120, message=f"the restarted broker answers on port {self.port}")

    def close(self) -> None:
        if self._restarted is not None:
            if self._restarted.poll() is None:
                self._restarted.send_signal(signal.SIGCONT)
                self._restarted.terminate()
                try:
                    self._restarted.wait(60)
                except subprocess.TimeoutExpired:
                    self._restarted.kill()
                    self._restarted.wait(30)
            return
        if is_running(self.pid):
            os.kill(self.pid, signal.SIGCONT)
            subprocess.run([TORPOR, "broker", "stop", "--dir", str(self.directory)], cwd=REPO,
                           capture_output=True, timeout=120, check=False)
