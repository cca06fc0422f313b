"""One processor process, assembled from `torpor processor`'s options, and run until it stops.

`torpor.cli.processor` imports this only in the process that folds (a supervisor of
workers never does): it brings the processor, the model providers, the store, metrics
and tracing. Exit codes and output are `torpor.cli.processor`'s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import click

from torpor import native
from torpor.cli.hosted import HostedConnectors
from torpor.cli.logs import announce
from torpor.cli.metrics import serve_metrics
from torpor.cli.traces import start_tracing, stop_tracing
from torpor.processors.metrics import ProcessorMetrics
from torpor.processors.models.provider import ScriptRule
from torpor.processors.models.providers.registry import ModelRouter
from torpor.processors.models.providers.settings import BedrockSettings, EndpointSettings, ProviderSettings
from torpor.processors.models.stage import StageConfig
from torpor.processors.processor import Processor, ProcessorConfig
from torpor.processors.store.kv import StoreMemory, configure_memory
from torpor.schemas.errors import ConfigError, TorporError
from torpor.streams.config import Secret, Settings

# The hosts of the vendors' own endpoints (the providers' DEFAULT_BASE_URL): a key sent
# anywhere else is worth a warning at start.
OPENAI_HOST: Final = "api.openai.com"
ANTHROPIC_HOST: Final = "api.anthropic.com"
EXIT_FATAL: Final = 2


@dataclass(frozen=True, slots=True)
class Folding:
    """What the command line says about the one processor this process runs."""

    instance: str
    app: str
    until_idle: bool
    store_dir: Path
    rules: tuple[ScriptRule, ...]
    default_model: str
    openai_base_url: str | None
    openai_api_key_env: str
    anthropic_base_url: str | None
    anthropic_api_key_env: str
    bedrock_region: str | None
    bedrock_endpoint_url: str | None
    connectors: tuple[str, ...]
    metrics_port: int | None
    metrics_host: str
    traces: str


def run_here(options: Folding, settings: Settings, partitions: int, stopping: Sequence[int]) -> None:
    """Fold in this process until a stop (`stopping` gets a signal number) or `--until-idle`.

    `partitions`: the inputs topic's, as `ensure_topics` found them.
    """
    logging.getLogger(__name__).info("compiled core (torpor/native.py): %s", native.status())
    try:
        memory = settings.memory
        # Before any store opens: the block cache is made once per process.
        configure_memory(StoreMemory(block_cache_bytes=memory.block_cache_mib << 20,
                                     row_cache_bytes=memory.row_cache_mib << 20,
                                     write_buffer_bytes=memory.write_buffer_mib << 20))
        config = ProcessorConfig(instance=options.instance, app=options.app, store_dir=options.store_dir,
                                 stage=StageConfig(history_cache_entries=memory.history_cache_entries))
        providers = ProviderSettings(
            openai=EndpointSettings(base_url=options.openai_base_url,
                                    api_key=_key(options.openai_api_key_env)),
            anthropic=EndpointSettings(base_url=options.anthropic_base_url,
                                       api_key=_key(options.anthropic_api_key_env)),
            bedrock=BedrockSettings(region=options.bedrock_region,
                                    endpoint=EndpointSettings(base_url=options.bedrock_endpoint_url)))
        _warn_if_a_key_leaves("--openai-base-url", providers.openai, options.openai_api_key_env, OPENAI_HOST)
        _warn_if_a_key_leaves("--anthropic-base-url", providers.anthropic, options.anthropic_api_key_env,
                              ANTHROPIC_HOST)
        model = ModelRouter(providers, options.default_model, script=options.rules)
        tracing = start_tracing(options.traces, "torpor-processor")
        hosted = HostedConnectors(settings, options.connectors, app=options.app, instance=options.instance,
                                  store_dir=config.store_dir, tracing=tracing)
        metrics = None if options.metrics_port is None else ProcessorMetrics()
        runner = Processor(settings, config, model, inputs_partitions=partitions,
                           hosted_busy=hosted.busy, observer=metrics, tracing=tracing)
        if metrics is not None and options.metrics_port is not None:
            metrics.track_lag(runner.high_watermark)
            metrics.track_histories(runner.histories)
            server, _ = serve_metrics(metrics.registry, options.metrics_host, options.metrics_port)
            announce(f"metrics on http://{options.metrics_host}:{server.server_port}/metrics")
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    hosted.start()
    announce(f"processor {options.instance} started in group {options.app}")
    try:
        runner.run(lambda: bool(stopping) or bool(hosted.failed), until_idle=options.until_idle)
    except TorporError as error:
        _fatal(error)
    except Exception as error:  # a bug: still exit loudly and at once
        _fatal(error)
    hosted.stop()
    if hosted.failed:
        _fatal(RuntimeError("hosted connector failed: " + "; ".join(hosted.failed)))
    stop_tracing(tracing)
    loop = runner.loop
    announce(f"processor {options.instance} stopped: {loop.commits} commits, {loop.aborts} aborts")


def _key(variable: str) -> Secret | None:
    value = os.environ.get(variable, "").strip()
    return Secret(value) if value else None


def _warn_if_a_key_leaves(flag: str, endpoint: EndpointSettings, variable: str, vendor: str) -> None:
    """Say so at start when a provider key will be sent to a host that is not the vendor's."""
    if endpoint.api_key is None or endpoint.base_url is None:
        return
    host = urlsplit(endpoint.base_url).hostname or ""
    if host != vendor:
        announce(f"warning: the key in ${variable} will be sent to {host} ({flag}), not to {vendor}; "
                 f"unset {variable} (or point the key variable elsewhere) if {host} must not have it",
                 logging.WARNING)


def _fatal(error: BaseException) -> None:
    announce(f"fatal: {type(error).__name__}: {error}", logging.CRITICAL)
    os._exit(EXIT_FATAL)
