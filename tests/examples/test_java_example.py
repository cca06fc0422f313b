"""examples/java, built with Maven and run against a real broker and a processor with a key ring.

Issue 21's acceptance: a client written with nothing of Torpor but its `.avsc` files and
the documented rules (Apache Avro's Java library, the Kafka Java client, the JDK's
Ed25519) starts a thread, sends a message, serves the thread's tool as a connector and
follows its events and receipts until the tool round trip is done. `mvn package` runs
the example's JUnit tests, which assert the vectors of docs/wire-contract.md; the test
checks Surefire's report so that a build that ran no test does not pass.

Then, read back with Torpor's own Python: the Java client's creation, message and tool
result were folded (`applied`), every one `verified` against the key ring, and the
result's bytes decode and verify with Torpor's codec and signing rule. Last, the
writer-schema rule of the guide: an input written with a schema that differs from the
shipped one by one optional field is `parked`, its fingerprint unknown.

Java 17 and Maven must be installed (.ci/run installs them); without them the test
fails and says so. Maven downloads the example's dependencies on first use (into
MAVEN_OPTS' -Dmaven.repo.local when set, as CI does): about 20 s here, bounded by
MAVEN_SECONDS.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.processors.test_processor import REPO, TORPOR, Deployment, deployment
from tests.schemas import evolved
from tests.schemas.test_evolution import NEW_CATALOG
from tests.waiting import wait_until
from torpor.schemas import signing
from torpor.schemas.codec import Codec
from torpor.schemas.keyring import KeyRing, KeyVersion, keyring_toml
from torpor.schemas.records import CreateThread, ToolResult, UserMessage
from torpor.schemas.signer import public_key_bytes, write_private_key

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

__all__ = ["deployment"]  # the fixture, shared with test_processor

EXAMPLE: Final = REPO / "examples" / "java"
JAR: Final = "torpor-java-example.jar"
# The first build downloads Avro, the Kafka client, JUnit and Maven's plugins.
MAVEN_SECONDS: Final = 600
RUN_SECONDS: Final = 240
TOOL: Final = "reverse_text"
# Rules alone: `torpor processor --script` needs nothing else (issue 21).
SCRIPT: Final = """\
[[model]]
last_contains = "olleh"
turns = [{ text = "Reversed: olleh." }]

[[model]]
last_contains = "please reverse hello"
turns = [{ text = "Reversing.", calls = [{ name = "reverse_text", arguments = { text = "hello" } }] }]
"""


def _require(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"`{tool}` is not on PATH: the Java example needs Java 17 (a JDK) and Maven "
                    f"(Debian: apt-get install {package}; .ci/run installs them)")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mvn package` of the example into a temporary folder: its JUnit tests run, its jar is made."""
    _require("java", "openjdk-17-jdk-headless")
    _require("javac", "openjdk-17-jdk-headless")
    mvn = _require("mvn", "maven")
    target = tmp_path_factory.mktemp("java-example") / "target"
    # -B: no colours or progress bars; MAVEN_OPTS (a local repository, in CI) is inherited.
    done = subprocess.run([mvn, "-B", "--no-transfer-progress", "package",
                           f"-Dexample.buildDirectory={target}"],
                          cwd=EXAMPLE, capture_output=True, text=True, timeout=MAVEN_SECONDS, check=False)
    said = "\n".join(done.stdout.splitlines()[-60:])
    assert done.returncode == 0, f"mvn package failed:\n{said}\n{done.stderr}"
    return target


def test_the_java_example_asserts_the_guides_vectors(built: Path) -> None:
    reports = list((built / "surefire-reports").glob("TEST-*.xml"))
    assert reports, "Surefire wrote no report: the example's tests did not run"
    suite = ET.parse(reports[0]).getroot()
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert suite.get("name") == "example.torpor.WireContractTest"
    assert counts == {"tests": 6, "failures": 0, "errors": 0, "skipped": 0}, counts


def _key(root: Path, key_id: str, sources: tuple[str, ...], tools: tuple[str, ...] = ("*",)) -> KeyVersion:
    key = Ed25519PrivateKey.generate()
    write_private_key(root / f"{key_id}.pem", key)
    return KeyVersion(key_id=key_id, public_key=public_key_bytes(key), sources=sources, tools=tools)


@pytest.fixture
def signed_deployment(deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                      ) -> Iterator[tuple[Deployment, KeyRing]]:
    """The test's topics and a processor with a key ring: its own key, the Java connector's, a gateway's."""
    ring = KeyRing((
        _key(tmp_path, "proc-1", ("processor",)),
        _key(tmp_path, "java-1", ("connector:java",), (TOOL,)),
        _key(tmp_path, "gateway-1", ("user:*",)),
    ))
    (tmp_path / "keyring.toml").write_text(keyring_toml(ring))
    monkeypatch.setenv("TORPOR_KEYRING", str(tmp_path / "keyring.toml"))
    monkeypatch.setenv("TORPOR_PROCESSOR_KEY_ID", "proc-1")
    monkeypatch.setenv("TORPOR_PROCESSOR_KEY", str(tmp_path / "proc-1.pem"))
    script = tmp_path / "rules.toml"
    script.write_text(SCRIPT)
    deployment.start([TORPOR, "processor", "--instance", "p0", "--app", f"app-{deployment.prefix}",
                      "--store-dir", str(tmp_path / "stores"), "--script", str(script)], "processor")
    yield deployment, ring


def _run_client(deployment: Deployment, built: Path, keys: Path, thread: str, *extra: str
                ) -> subprocess.CompletedProcess[str]:
    """The example's jar on `thread`, its results signed with java-1 and its inputs with gateway-1."""
    java = _require("java", "openjdk-17-jdk-headless")
    return deployment.run([java, "-jar", str(built / JAR), "--bootstrap", deployment.bootstrap,
                           "--prefix", deployment.prefix, "--thread", thread,
                           "--text", "please reverse hello",
                           "--connector-key-id", "java-1", "--connector-key", str(keys / "java-1.pem"),
                           "--user-key-id", "gateway-1", "--user-key", str(keys / "gateway-1.pem"),
                           "--timeout", str(RUN_SECONDS - 60), *extra], timeout=RUN_SECONDS)


def test_a_java_client_completes_a_signed_tool_round_trip(
    built: Path, signed_deployment: tuple[Deployment, KeyRing], tmp_path: Path
) -> None:
    deployment, ring = signed_deployment
    thread = f"java-{uuid.uuid4().hex[:8]}"
    run = _run_client(deployment, built, tmp_path, thread)
    assert run.returncode == 0, (f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-3000:]}\n"
                                 f"processor log:\n{deployment.log('processor')[-3000:]}")
    assert "round trip complete" in run.stdout and "verified" in run.stdout, run.stdout

    # What Torpor itself read and decided, read back with its own codec.
    inputs = {i.message_id: i for i in deployment.inputs() if i.thread_id == thread}
    results = [i for i in inputs.values() if isinstance(i.body, ToolResult)]
    assert [i.source for i in results] == ["connector:java"]
    assert results[0].body.content[0].text == "olleh" and results[0].body.ok  # type: ignore[union-attr]
    assert signing.verify(results[0], ring, tool=TOOL).provenance == "verified"
    java_inputs = {m for m, i in inputs.items() if i.source != "processor"}
    assert {type(inputs[m].body) for m in java_inputs} == {CreateThread, UserMessage, ToolResult}
    receipts = {r.input_id: r for r in deployment.receipts() if r.thread_id == thread}
    judged = {(receipts[m].disposition, receipts[m].provenance) for m in java_inputs}
    assert judged == {("applied", "verified")}, judged
    assert deployment.answers(thread) == ["Reversing.", "Reversed: olleh."]


def test_an_input_written_with_a_changed_schema_is_parked_unknown_fingerprint(
    signed_deployment: tuple[Deployment, KeyRing],
) -> None:
    deployment, _ = signed_deployment
    thread = f"evolved-{uuid.uuid4().hex[:8]}"
    # The shipped Input plus one optional field: a writer that "only added a field".
    record = evolved.Input(f"{thread}-1", thread, 1_700_000_000_000, "user:x", None, None, None,
                           evolved.UserMessage((evolved.TextBlock("hi"),)), priority=None)
    deployment.send_raw(thread.encode(), Codec(catalog=NEW_CATALOG).encode("inputs", record))
    wait_until(lambda: any(r.thread_id == thread for r in deployment.receipts()), timeout=120,
               message=lambda: f"a receipt; processor log:\n{deployment.log('processor')[-2000:]}")
    [receipt] = [r for r in deployment.receipts() if r.thread_id == thread]
    assert receipt.disposition == "parked"
    assert "unknown schema fingerprint" in (receipt.reason or ""), receipt.reason



def test_a_java_client_whose_key_claims_another_connector_is_refused_and_the_partition_goes_on(
    built: Path, signed_deployment: tuple[Deployment, KeyRing], tmp_path: Path
) -> None:
    """The same client and key, but its results claim `connector:impostor`: java-1 may not sign that."""
    deployment, _ = signed_deployment
    thread = f"java-impostor-{uuid.uuid4().hex[:8]}"
    run = _run_client(deployment, built, tmp_path, thread, "--connector-name", "impostor")
    assert run.returncode == 1, f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-3000:]}"
    assert "FAILED: input" in run.stdout and "was rejected" in run.stdout, run.stdout

    inputs = {i.message_id: i for i in deployment.inputs() if i.thread_id == thread}
    [result] = [i for i in inputs.values() if isinstance(i.body, ToolResult)]
    assert result.source == "connector:impostor"
    receipts = {r.input_id: r for r in deployment.receipts() if r.thread_id == thread}
    assert receipts[result.message_id].disposition == "rejected:forged", receipts[result.message_id]
    assert receipts[result.message_id].reason == "key_not_allowed_for_source", receipts[result.message_id]
    # One receipt for it, and the thread still waits for its tool: nothing was folded from it.
    assert sum(r.input_id == result.message_id for r in deployment.receipts()) == 1
    assert deployment.answers(thread) == ["Reversing."]

    # The partition goes on: the honest client on another thread completes its round trip.
    honest = f"java-{uuid.uuid4().hex[:8]}"
    again = _run_client(deployment, built, tmp_path, honest)
    assert again.returncode == 0, (f"stdout:\n{again.stdout[-4000:]}\n"
                                   f"processor log:\n{deployment.log('processor')[-3000:]}")
