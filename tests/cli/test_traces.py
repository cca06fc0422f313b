"""`--traces otlp`: `torpor send` exports its span over OTLP/HTTP where the standard
variables point (a collector stand-in on 127.0.0.1 that decodes what it is sent), and a
bad `--traces` value is refused before anything is sent."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.processors.test_processor import TORPOR, Deployment, deployment
from tests.waiting import wait_until

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]]  # each fixture's subclass has its own

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    received: list[tuple[str, bytes]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()
    server.server_close()


def test_send_exports_its_span_over_otlp_http_where_the_variables_say(
    deployment: Deployment, collector: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-gateway")
    thread_id = f"otlp-{uuid.uuid4().hex[:8]}"
    sent = deployment.run([TORPOR, "send", thread_id, "hello", "--new", "--model", "scripted",
                           "--traces", "otlp"])
    assert sent.returncode == 0, sent.stderr[-3000:]
    wait_until(lambda: received, timeout=30, message="an OTLP export")
    paths = {path for path, _ in received}
    assert paths == {"/v1/traces"}
    spans = []
    services = set()
    for _, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services.update(a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name")
            for scope in resource_spans.scope_spans:
                spans.extend(scope.spans)
    assert [s.name for s in spans] == ["send UserMessage"]
    assert services == {"my-gateway"}
    attributes = {a.key: a.value.string_value for a in spans[0].attributes}
    assert attributes["torpor.thread_id"] == thread_id


def test_an_unknown_traces_value_is_refused(deployment: Deployment) -> None:
    refused = deployment.run([TORPOR, "send", "t-1", "hello", "--traces", "jaeger"], timeout=60)
    assert refused.returncode == 2 and "jaeger" in refused.stderr
