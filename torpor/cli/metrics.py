"""Serving a Prometheus registry on `/metrics`, for the long-running commands.

The processor (`torpor.processors.metrics`) and the connectors (`torpor.connectors.metrics`)
each count into a registry of their own; the command line, which composes them, serves
it. `docs/metrics.md` lists what each exports.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from torpor.schemas.errors import ConfigError


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` on http://host:port/metrics from a daemon thread; returns the server
    (`server_port` is the port, when `port` is 0) and its thread. Raises `ConfigError` if it
    cannot listen there."""
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {error}") from None
