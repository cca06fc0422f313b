"""A processor (scripted model), the deploy connector (an approval relay) and `torpor ui`, as
processes against a real broker, for the inspector's tests.

`inspected(...)` deploys them on topics of their own (tests.cli.rig.deploy), starts
`torpor ui --port 0` with the same settings and the processor's `--app` (whose lag the
page shows), and yields an `Inspected`: the deployment and the page's URL. The scripted
model asks for a deployment (which needs an approval) when told "deploy to staging",
answers `DONE` once deployed, spawns a child thread when told to "split the work" (the
child answers `CHILD_ANSWER`), and answers "hostile" with text that would run script if
a page ever parsed model text as HTML.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from confluent_kafka.admin import AdminClient

from tests.cli.rig import DEPLOY_RULES, DEPLOYED, answer, deploy, script
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until

DONE: Final = DEPLOYED
CHILD_TASK: Final = "Check region eu-west."
CHILD_ANSWER: Final = "Region eu-west is fine."
HOSTILE_TEXT: Final = "<img src=x onerror=window.pwned=1><script>window.pwned=2</script>"
# A thread id with no space or control character is a valid wire id, whatever else it holds.
HOSTILE_THREAD: Final = "<img/src=x/onerror=window.pwned=3>"
SCRIPT: Final = script(DEPLOY_RULES, f"""
[[model]]
last_contains = "split the work"
turns = [{{ text = "Asking a helper.", calls = [
  {{ name = "spawn_thread", arguments = {{ instructions = "{CHILD_TASK}" }} }},
] }}]
""", answer(CHILD_TASK, CHILD_ANSWER), answer("hostile", HOSTILE_TEXT))


@dataclass(frozen=True, slots=True)
class Inspected:
    deployment: Deployment
    url: str


@contextmanager
def inspected(bootstrap: str, admin: AdminClient, root: Path, *ui_args: str) -> Iterator[Inspected]:
    with deploy(bootstrap, admin, root, SCRIPT, "torpor.connectors.approvals:DeployTool") as deployment:
        deployment.start([TORPOR, "ui", "--port", "0", "--operator", "inspector-test",
                          "--app", f"app-{deployment.prefix}", *ui_args], "ui")
        found = wait_until(lambda: re.search(r"torpor ui: (http://\S+/)", deployment.log("ui")), timeout=60,
                           message="torpor ui's address on its output")
        yield Inspected(deployment, found.group(1))


def ui_log(inspected: Inspected) -> str:
    return inspected.deployment.log("ui")[-3000:]
