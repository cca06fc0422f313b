"""A processor with a key ring (and its own key) on a real broker, for the signed tests.

`keyed_processor` makes the keys with `torpor keys new` (the processor's and those the
test names), starts `torpor processor` with the ring, and yields the deployment whose
commands share that environment; its topics go when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tests.cli.rig import answer, script, settings_of, tear_down
from tests.processors.test_processor import TORPOR, Deployment
from torpor.streams.admin import ensure_topics
from torpor.streams.deadline import Deadline


@dataclass
class KeyedDeployment(Deployment):
    """A deployment whose processes share extra environment (the key ring)."""

    extra: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **self.extra}

    def signed(self, key_id: str) -> list[str]:
        """The command-line options that sign with `key_id`'s key."""
        return ["--signing-key-id", key_id, "--signing-key", str(self.root / "keys" / f"{key_id}.pem")]


@contextmanager
def keyed_processor(bootstrap: str, admin: AdminClient, root: Path, prefix: str,
                    keys: tuple[tuple[str, str], ...]) -> Iterator[KeyedDeployment]:
    """A processor signing with `proc-1`; a key per (id, source) of `keys` in the ring too."""
    found = KeyedDeployment(bootstrap, root, prefix=prefix)
    ensure_topics(admin, settings_of(found), Deadline.after(60))
    ring, key_dir = root / "keyring.toml", root / "keys"
    for key_id, source in (("proc-1", "processor"), *keys):
        made = found.run([TORPOR, "keys", "new", "--id", key_id, "--source", source,
                          "--out-dir", str(key_dir), "--keyring", str(ring)])
        assert made.returncode == 0, made.stderr
    found.extra = {"TORPOR_KEYRING": str(ring), "TORPOR_PROCESSOR_KEY_ID": "proc-1",
                   "TORPOR_PROCESSOR_KEY": str(key_dir / "proc-1.pem")}
    (root / "script.toml").write_text(script(answer("hello", "Hello to you.")))
    found.start([TORPOR, "processor", "--instance", "p0", "--app", f"app-{found.prefix}", "--store-dir",
                 str(root / "stores"), "--script", str(root / "script.toml")], "processor")
    try:
        yield found
    finally:
        tear_down(found, admin)
