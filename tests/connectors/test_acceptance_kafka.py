"""Issue 5's acceptance in Kafka mode: four kinds of tool, signed, across a connector restart.

A processor (scripted model, key ring, its own signing key), a tools connector serving
`run_command`, `http_request` and an MCP server's `demo_add` (signing with its key), and
the timer connector (signing with its own). One agent runs a command whose output
streams back while it runs, posts to a local HTTP server, calls the MCP tool, and
sleeps on a durable timer. The tools connector is killed -9 while the HTTP request is in
flight (the server has it, the answer was never produced) and restarted: the journal
finds the effect unknown, the HTTP tool runs it again with the same Idempotency-Key (what
lets a server deduplicate it), and the conversation goes on. At the
end every input from a connector, the timer or the processor was `verified`, nothing
was rejected, each call has exactly one applied result, and the agent said it was done.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import StdioServerParameters

from tests.connectors.acceptance_tools import PREFIX
from tests.connectors.test_mcp_bridge import SERVER
from tests.processors.test_processor import REPO, TORPOR, Deployment, deployment
from tests.waiting import wait_until
from torpor.connectors.http_tool import HttpTool
from torpor.connectors.mcp_bridge import discover_blocking
from torpor.connectors.subprocess_tool import SubprocessTool
from torpor.schemas.keyring import KeyRing, KeyVersion, keyring_toml
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Input,
    TextBlock,
    ThreadConfig,
    ToolEvent,
    ToolResult,
    UserMessage,
)
from torpor.schemas.signer import Signer, SignerSettings, public_key_bytes, write_private_key

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

__all__ = ["deployment"]  # the fixture, shared with test_processor

COMMAND = "echo first-line; sleep 0.5; echo second-line >&2; exit 4"
FINAL = "All four tools worked. Done."


REQUESTS: list[tuple[str | None, str]] = []  # (Idempotency-Key, body) as the server saw them
RELEASE = threading.Event()  # the first request is held until the test has killed the connector


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        key = self.headers.get("Idempotency-Key")
        REQUESTS.append((key, body))
        if len(REQUESTS) == 1:
            RELEASE.wait(60)  # the connector dies while this effect is in flight
        reply = json.dumps({"from": "http-server", "body": body, "key": key})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


def _rule(last: str | None, text: str, tool: str | None = None, arguments: str = "{}") -> str:
    rule = "[[model]]\n" + (f"last_contains = {json.dumps(last)}\n" if last else "")
    rule += f"[[model.turns]]\ntext = {json.dumps(text)}\n"
    if tool is not None:
        rule += f"[[model.turns.calls]]\nname = {json.dumps(tool)}\narguments = {arguments}\n"
    return rule


def _script(url: str) -> str:
    command = json.dumps(COMMAND)
    rules = [
        _rule("Slept for", FINAL),
        _rule('"result": 42', "The sum is 42. Resting a second.", "sleep", "{ seconds = 1 }"),
        _rule("HTTP 200", "Posted. Now the MCP tool.", "demo_add", "{ a = 20, b = 22 }"),
        _rule("exit code 4", "The command ended.", "http_request",
              f'{{ method = "POST", url = "{url}", body = "from the agent" }}'),
        _rule("please use the tools", "Running the command.", "run_command",
              f"{{ command = {command}, timeout_s = 20 }}"),
        # Output events wake the model while the command runs: a few plain answers.
        "[[model]]\n" + '[[model.turns]]\ntext = "Watching."\n' * 6,
    ]
    return '[thread]\nid = "unused"\n\n' + "\n".join(rules)


def _key(root: Path, key_id: str, source: str) -> tuple[Path, KeyVersion]:
    key = Ed25519PrivateKey.generate()
    pem = root / f"{key_id}.pem"
    write_private_key(pem, key)
    return pem, KeyVersion(key_id=key_id, public_key=public_key_bytes(key), sources=(source,))


def test_an_agent_uses_four_tools_through_kafka_across_a_connector_restart(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_file = tmp_path / "mcp_server.py"
    server_file.write_text(SERVER)
    mcp_server = StdioServerParameters(command=sys.executable, args=[str(server_file)])
    tools_pem, tools_key = _key(tmp_path, "tools-1", "connector:*")
    timer_pem, timer_key = _key(tmp_path, "timer-1", "timer")
    proc_pem, proc_key = _key(tmp_path, "proc-1", "processor")
    # The tenant's gateway signs the user's inputs, granting the thread tenant `test`.
    gateway_pem, gateway_key = _key(tmp_path, "gateway-1", "user:*")
    gateway = Signer.from_settings(SignerSettings("gateway-1", gateway_pem))
    ring = tmp_path / "keyring.toml"
    ring.write_text(keyring_toml(KeyRing((tools_key, timer_key, proc_key, gateway_key))))
    for name, value in {"TORPOR_KEYRING": str(ring), "TORPOR_PROCESSOR_KEY_ID": "proc-1",
                        "TORPOR_PROCESSOR_KEY": str(proc_pem), "PYTHONPATH": str(REPO),
                        "TORPOR_MCP_SERVER": f"{sys.executable} {server_file}"}.items():
        monkeypatch.setenv(name, value)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/agent"
    script = tmp_path / "script.toml"
    script.write_text(_script(url))

    discovered = discover_blocking(mcp_server, PREFIX)
    specs = {s.name: s for s in (*SubprocessTool.specs, *HttpTool.specs, *discovered)}
    names = ("run_command", "http_request", "demo_add")
    thread = f"acceptance-{uuid.uuid4().hex[:8]}"
    config = ThreadConfig(
        model="scripted", system_prompt="Use the tools.", tools=tuple(specs[n] for n in names),
        capability=Capability(tenant="test", tools=names, scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False)

    def envelope(label: str, body: CreateThread | UserMessage) -> Input:
        return gateway.sign(Input(f"{thread}-{label}", thread, 1_000 + len(label), "user:test", None, None,
                                  None, body))

    # A member killed -9 holds its partitions until its session times out: 6 s, the broker's least.
    quick = tmp_path / "quick-session.toml"
    quick.write_text('[kafka.librdkafka]\n"session.timeout.ms" = 6000\n"heartbeat.interval.ms" = 1000\n')

    def tools_connector(name: str) -> list[str]:
        return [TORPOR, "connector", "run", "tests.connectors.acceptance_tools:tools", "--config", str(quick),
                "--group",
                f"tools-{deployment.prefix}", "--journal-dir", str(tmp_path / "tools-journal"),
                "--signing-key-id", "tools-1", "--signing-key", str(tools_pem)]

    try:
        deployment.send(envelope("create", CreateThread(config, (), ())),
                        envelope("ask", UserMessage((TextBlock("please use the tools"),))))
        processor = deployment.start([
            TORPOR, "processor", "--instance", "p0", "--app", f"app-{deployment.prefix}",
            "--store-dir", str(tmp_path / "stores"), "--script", str(script)], "processor")
        timers = deployment.start([
            TORPOR, "connector", "run-timers", "--group", f"timers-{deployment.prefix}",
            "--journal-dir", str(tmp_path / "timer-journal"), "--signing-key-id", "timer-1",
            "--signing-key", str(timer_pem)], "timers")
        first = deployment.start(tools_connector("tools-0"), "tools-0")

        REQUESTS.clear()
        RELEASE.clear()
        wait_until(lambda: len(REQUESTS) >= 1, timeout=120,
                   message=lambda: f"the HTTP request; tools log:\n{deployment.log('tools-0')[-3000:]}\n"
                           f"processor log:\n{deployment.log('processor')[-2000:]}")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        RELEASE.set()
        second = deployment.start(tools_connector("tools-1"), "tools-1")
        wait_until(lambda: FINAL in deployment.answers(thread), timeout=120,
                   message=lambda: f"the final answer; answers {deployment.answers(thread)}\n"
                           f"tools log:\n{deployment.log('tools-1')[-3000:]}")
    finally:
        RELEASE.set()
        httpd.shutdown()
        httpd.server_close()

    inputs = deployment.inputs()
    receipts = deployment.receipts()
    assert not [r for r in receipts if r.disposition.startswith("rejected")], \
        [(r.disposition, r.reason) for r in receipts if r.disposition.startswith("rejected")]
    from_machines = {i.message_id for i in inputs if i.source != "user:test"}
    applied = [r for r in receipts if r.disposition == "applied" and r.input_id in from_machines]
    assert applied and {r.provenance for r in applied} == {"verified"}
    sources = {i.source for i in inputs}
    assert {"connector:subprocess", "connector:http", "connector:mcp", "timer", "processor"} <= sources
    results = {i.message_id: i for i in inputs if isinstance(i.body, ToolResult)}
    per_call = Counter(i.body.call_id for i in results.values() if isinstance(i.body, ToolResult)
                       and not i.body.subscription)
    decisive = Counter(r.input_id for r in receipts if r.input_id in results and r.disposition == "applied")
    assert all(n == 1 for n in decisive.values()) and len(per_call) == 2  # http, mcp (run_command streams)
    streamed = [i.body for i in inputs if isinstance(i.body, ToolEvent)]
    output = "\n".join(b.text for e in streamed for b in e.content if isinstance(b, TextBlock))
    assert "first-line" in output and "second-line" in output and "exit code 4" in output
    assert deployment.answers(thread)[-1] == FINAL
    # The HTTP effect ran twice under one key (at least once, idempotent by key): the agent
    # saw one result. Everything after it was served by the restarted connector.
    assert [k for k, _ in REQUESTS] == [REQUESTS[0][0]] * 2 and REQUESTS[0][0] is not None
    assert "0 effects reconciled, 1 re-run" in deployment.log("tools-1")
    assert "dispatch invoke demo_add journaled" in deployment.log("tools-1")
    for process in (processor, timers, second):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
