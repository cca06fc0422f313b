"""`--traces otlp|console|off`: OpenTelemetry traces for the processor, connectors and `torpor send`.

Off by default (`TORPOR_TRACES` sets it too). `otlp` exports with the OTLP/HTTP exporter,
configured by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`, ...); `console` writes
one JSON object per finished span, one a line, to stderr. `OTEL_SERVICE_NAME` (or
`OTEL_RESOURCE_ATTRIBUTES`) names the service; the default is the command's
(`torpor-processor`, `torpor-connector`, `torpor-send`). Spans are exported in batches off
the fold's thread, and flushed when the command ends (`shutdown`).

Needs the optional extra `otel` (`pip install 'torpor[otel]'`); without it `--traces otlp`
is a configuration error and everything else runs as before. With `off`, nothing of
OpenTelemetry is imported.
"""

from __future__ import annotations

import atexit
import os
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import click

from torpor.schemas.errors import ConfigError

if TYPE_CHECKING:
    from torpor.streams.tracing import Tracing


class TraceExport(StrEnum):
    OFF = "off"
    OTLP = "otlp"
    CONSOLE = "console"


TRACES_OPTION: Final = click.option(
    "--traces", type=click.Choice([e.value for e in TraceExport]), default=TraceExport.OFF.value,
    envvar="TORPOR_TRACES", show_default=True,
    help="OpenTelemetry spans per input, model call, dispatch and effect, their context in the "
         "records' traceparent headers: otlp (OTEL_EXPORTER_OTLP_* variables) or console (JSON "
         "lines on stderr). Needs the otel extra.")


def start_tracing(export: str, service: str) -> Tracing | None:
    """The `Tracing` for `export` (None when off), its spans flushed at exit.

    Raises `ConfigError` when the otel extra is not installed."""
    if TraceExport(export) is TraceExport.OFF:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

        from torpor.streams.tracing import Tracing
    except ImportError as error:
        raise ConfigError(f"--traces {export} needs OpenTelemetry: pip install 'torpor[otel]' "
                          f"({error})") from None
    # The variables name the service when set; the command's name otherwise.
    attributes = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in attributes
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": service}))
    exporter: SpanExporter
    if TraceExport(export) is TraceExport.OTLP:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        def one_line(span: ReadableSpan) -> str:
            return str(span.to_json(indent=None)) + "\n"

        exporter = ConsoleSpanExporter(out=sys.stderr, formatter=one_line)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    atexit.register(provider.shutdown)  # the last batch is exported before the process ends
    return Tracing(provider)


def stop_tracing(tracing: Tracing | None) -> None:
    """Export what is still batched (a command that ends on purpose calls it; exit does too)."""
    shutdown = getattr(tracing.provider, "shutdown", None) if tracing is not None else None
    if shutdown is not None:
        atexit.unregister(shutdown)
        shutdown()
