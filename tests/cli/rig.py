"""A processor (scripted model) and a connector as processes, for the command-line tests.

`deploy(...)` makes a `Deployment` (topics of its own) running `torpor processor` with
`script` and `torpor connector run <target>`, and tears it all down afterwards. `send`
and `start_thread` drive it through `torpor send`, as a user would; `tailed` reads what
`torpor tail` shows.

The scripted model's file is composed of rules: `script(*rules)` puts them under the
header every test's script has (the first rule whose `last_contains` matches answers);
`answer(contains, text)` is a rule that answers with text, and `DEPLOY_RULES` are the
rules of an agent that asks the deploy tool (an approval relay) to deploy staging when
told to "deploy to staging" and says `DEPLOYED` once it is.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from confluent_kafka.admin import AdminClient

from tests.processors.test_processor import PARTITIONS, TORPOR, Deployment
from tests.waiting import wait_until
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.topics import TopicNames


def script(*rules: str) -> str:
    """A scripted model's file of `rules`, in order."""
    return '[thread]\nid = "unused"\n' + "".join(rules)


def answer(contains: str, text: str) -> str:
    """A rule: when the last history entry contains `contains`, answer `text` (no quotes in either)."""
    return f'\n[[model]]\nlast_contains = "{contains}"\nturns = [{{ text = "{text}" }}]\n'


DEPLOYED: Final = "Deployed to staging."
DEPLOY_RULES: Final = answer("deployed staging", DEPLOYED) + """
[[model]]
last_contains = "deploy to staging"
turns = [{ text = "Asking first.", calls = [{ name = "deploy", arguments = { target = "staging" } }] }]
"""


@contextmanager
def deploy(
    bootstrap: str, admin: AdminClient, root: Path, script: str, connector: str
) -> Iterator[Deployment]:
    found = Deployment(bootstrap, root, prefix=f"test.cli.{uuid.uuid4().hex[:10]}.")
    ensure_topics(admin, settings_of(found), Deadline.after(60))
    path = root / "cli-script.toml"
    path.write_text(script)
    found.start([TORPOR, "processor", "--instance", "p0", "--app", f"app-{found.prefix}", "--store-dir",
                 str(root / "stores"), "--script", str(path)], "processor")
    found.start([TORPOR, "connector", "run", connector, "--group", f"connector-{found.prefix}",
                 "--journal-dir", str(root / "journal")], "connector")
    try:
        yield found
    finally:
        tear_down(found, admin)


def tear_down(found: Deployment, admin: AdminClient) -> None:
    """Kill what `found` started and delete its topics."""
    found.stop_all()
    for future in admin.delete_topics(list(TopicNames.for_prefix(found.prefix).all()),
                                      operation_timeout=30).values():
        future.result(timeout=60)


def settings_of(deployment: Deployment) -> Settings:
    return Settings(kafka=KafkaSettings(bootstrap_servers=deployment.bootstrap),
                    topics=TopicSettings(prefix=deployment.prefix, partitions=PARTITIONS))


def send(deployment: Deployment, thread: str, text: str, *extra: str) -> str:
    done = deployment.run([TORPOR, "send", thread, text, *extra])
    assert done.returncode == 0, done.stderr
    return done.stdout


def start_thread(deployment: Deployment, thread: str, text: str, tool: str) -> None:
    # A connector publishes its manifest when it starts; `send --new` resolves the tool from it.
    wait_until(lambda: deployment.run([TORPOR, "send", thread, text, "--new", "--tool", tool, "--model",
                                       "scripted"]).returncode == 0,
               timeout=60, message=lambda: f"send --new; connector log:\n"
                                           f"{deployment.log('connector')[-2000:]}")


def tailed(deployment: Deployment, thread: str, root: Path) -> str:
    """What `torpor tail THREAD --receipts --no-follow` prints now, from the thread's start."""
    done = deployment.run([TORPOR, "tail", thread, "--receipts", "--no-follow", "--restart", "--resume-file",
                           str(root / "tail.json")])
    assert done.returncode == 0, done.stderr
    return done.stdout
