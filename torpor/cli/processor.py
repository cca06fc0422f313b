"""`torpor processor`: run one exactly-once processor instance against Kafka.

Output contract: logs go to stderr, one line per event with the shell's fields. Exit
codes: 0 after a clean stop (SIGTERM/SIGINT, or `--until-idle` once caught up and idle);
1 for a configuration problem (the message says what to fix); 2 for a fatal runtime
error (fenced by another instance, a hung transaction call, a store out of step with the
group's offsets), printed as one `fatal:` line. A fatal exit does not wait for the
Kafka clients to close: a fenced or hung client may never close, and the restarted
instance cleans up after this one.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import click

from torpor import native
from torpor.cli.hosted import HostedConnectors
from torpor.cli.logs import LOG_FORMAT_OPTION, announce, configure
from torpor.cli.metrics import serve_metrics
from torpor.cli.scenario import load_rules
from torpor.cli.settings import default_group, read_settings, settings_options
from torpor.cli.traces import TRACES_OPTION, start_tracing, stop_tracing
from torpor.cli.workers import supervise, worker_commands
from torpor.processors.metrics import ProcessorMetrics
from torpor.processors.models.providers.registry import ModelRouter
from torpor.processors.models.providers.settings import BedrockSettings, EndpointSettings, ProviderSettings
from torpor.processors.models.stage import StageConfig
from torpor.processors.processor import Processor, ProcessorConfig
from torpor.processors.store.kv import StoreMemory, configure_memory
from torpor.schemas.errors import ConfigError, TorporError
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import make_admin
from torpor.streams.config import Secret
from torpor.streams.deadline import Deadline

# The hosts of the vendors' own endpoints (the providers' DEFAULT_BASE_URL): a key sent
# anywhere else is worth a warning at start.
OPENAI_HOST: Final = "api.openai.com"
ANTHROPIC_HOST: Final = "api.anthropic.com"
EXIT_FATAL: Final = 2
# Creating the topics on first start includes waiting for leaders; a laptop broker is quick.
ENSURE_TOPICS_SECONDS: Final = 60.0


@click.command("processor")
@click.option("--instance", required=True,
              help="This instance's stable name: its transactional id and static group member id.")
@click.option("--until-idle", is_flag=True,
              help="Exit once every owned partition is caught up and nothing is in flight.")
@click.option("--store-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the partitions' RocksDB stores live. Default: .torpor/stores/<instance>.")
@click.option("--script", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="A TOML (or JSON) file of [[model]] rules for the scripted model (`scripted` "
                   "threads); nothing else is needed. A `torpor local run` scenario works too: "
                   "its [thread] and [[steps]] are not used.")
@click.option("--app", default=None,
              help="The consumer group; instances of one app share the partitions. Default: "
                   "torpor-processor, or <topic prefix>processor under another topic prefix.")
@click.option("--default-model", default="scripted", show_default=True, envvar="TORPOR_DEFAULT_MODEL",
              help="The model for a request whose thread names none: openai:<model>, "
                   "anthropic:<model>, bedrock:<model id> or scripted. Each thread's own model "
                   "(ThreadConfig) wins.")
@click.option("--openai-base-url", default=None, envvar="TORPOR_OPENAI_BASE_URL",
              help="An OpenAI-compatible server up to /v1 (vLLM, Ollama, llama.cpp, LiteLLM). "
                   "Default: api.openai.com.")
@click.option("--openai-api-key-env", default="OPENAI_API_KEY", show_default=True,
              help="The variable holding the OpenAI-compatible key (unset: none sent, for local servers).")
@click.option("--anthropic-base-url", default=None, envvar="TORPOR_ANTHROPIC_BASE_URL",
              help="The Anthropic API's URL. Default: api.anthropic.com.")
@click.option("--anthropic-api-key-env", default="ANTHROPIC_API_KEY", show_default=True,
              help="The variable holding the Anthropic key.")
@click.option("--bedrock-region", default=None, envvar=["TORPOR_BEDROCK_REGION", "AWS_REGION"],
              help="The AWS region of Bedrock (e.g. us-east-1), needed for bedrock: models. "
                   "Default: TORPOR_BEDROCK_REGION, else AWS_REGION. Credentials come from boto3's "
                   "standard chain (AWS_* variables, ~/.aws, an instance or container role).")
@click.option("--bedrock-endpoint-url", default=None, envvar="TORPOR_BEDROCK_ENDPOINT_URL",
              help="A bedrock-runtime endpoint URL (a VPC endpoint, a proxy). Default: the region's own.")
@click.option("--connector", "connectors", multiple=True, metavar="MODULE:NAME",
              help="Host this connector in the processor's process, for development (repeatable; "
                   "e.g. torpor.connectors.echo:EchoTool). It gets dispatches once committed.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, envvar="TORPOR_METRICS_PORT",
              help="Serve Prometheus metrics on http://--metrics-host:PORT/metrics (0: any free port, "
                   "printed). Default: no metrics.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="The address of /metrics.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              envvar="TORPOR_PROCESSOR_WORKERS",
              help="Run N processor processes of this app, to use N cores: instances <instance>-w0.."
                   "-w<N-1>, stores under --store-dir/w<k>, metrics on consecutive ports. This "
                   "process supervises them and ends with the first failing one's status.")
@click.option("--log-level", default="info", show_default=True)
@LOG_FORMAT_OPTION
@TRACES_OPTION
@settings_options
@click.pass_context
def processor(ctx: click.Context, instance: str, until_idle: bool, store_dir: Path | None,
              script: Path | None, app: str | None,
              default_model: str, openai_base_url: str | None, openai_api_key_env: str,
              anthropic_base_url: str | None, anthropic_api_key_env: str, bedrock_region: str | None,
              bedrock_endpoint_url: str | None, connectors: tuple[str, ...],
              metrics_port: int | None, metrics_host: str, workers: int, log_level: str, log_format: str,
              traces: str, config_file: Path | None, bootstrap: str | None) -> None:
    """Fold the `inputs` topic into the RocksDB stores, exactly once, with the model stage beside it."""
    configure(log_level, log_format)
    if workers > 1:
        commands = worker_commands(ctx, workers, instance, store_dir or Path(".torpor") / "stores" / instance,
                                   metrics_port)
        sys.exit(supervise(commands))
    logging.getLogger(__name__).info("compiled core (torpor/native.py): %s", native.status())
    # A stop asked for during startup (topics, stores) is honoured at the loop's first check.
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: stopping.append(number))
    settings = read_settings(config_file, bootstrap)
    app = app or default_group(settings, "processor")
    try:
        rules = load_rules(script) if script is not None else ()  # a bad script touches no topic
        ensured = ensure_topics(make_admin(settings), settings, Deadline.after(ENSURE_TOPICS_SECONDS))
        memory = settings.memory
        # Before any store opens: the block cache is made once per process.
        configure_memory(StoreMemory(block_cache_bytes=memory.block_cache_mib << 20,
                                     row_cache_bytes=memory.row_cache_mib << 20,
                                     write_buffer_bytes=memory.write_buffer_mib << 20))
        config = ProcessorConfig(instance=instance, app=app,
                                 store_dir=store_dir or Path(".torpor") / "stores" / instance,
                                 stage=StageConfig(history_cache_entries=memory.history_cache_entries))
        providers = ProviderSettings(
            openai=EndpointSettings(base_url=openai_base_url, api_key=_key(openai_api_key_env)),
            anthropic=EndpointSettings(base_url=anthropic_base_url, api_key=_key(anthropic_api_key_env)),
            bedrock=BedrockSettings(region=bedrock_region,
                                    endpoint=EndpointSettings(base_url=bedrock_endpoint_url)))
        _warn_if_a_key_leaves("--openai-base-url", providers.openai, openai_api_key_env, OPENAI_HOST)
        _warn_if_a_key_leaves("--anthropic-base-url", providers.anthropic, anthropic_api_key_env,
                              ANTHROPIC_HOST)
        model = ModelRouter(providers, default_model, script=rules)
        tracing = start_tracing(traces, "torpor-processor")
        hosted = HostedConnectors(settings, connectors, app=app, instance=instance,
                                  store_dir=config.store_dir, tracing=tracing)
        metrics = None if metrics_port is None else ProcessorMetrics()
        runner = Processor(settings, config, model, inputs_partitions=ensured.partitions,
                           hosted_busy=hosted.busy, observer=metrics, tracing=tracing)
        if metrics is not None and metrics_port is not None:
            metrics.track_lag(runner.high_watermark)
            server, _ = serve_metrics(metrics.registry, metrics_host, metrics_port)
            announce(f"metrics on http://{metrics_host}:{server.server_port}/metrics")
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    hosted.start()
    announce(f"processor {instance} started in group {app}")
    try:
        runner.run(lambda: bool(stopping) or bool(hosted.failed), until_idle=until_idle)
    except TorporError as error:
        _fatal(error)
    except Exception as error:  # a bug: still exit loudly and at once
        _fatal(error)
    hosted.stop()
    if hosted.failed:
        _fatal(RuntimeError("hosted connector failed: " + "; ".join(hosted.failed)))
    stop_tracing(tracing)
    loop = runner.loop
    announce(f"processor {instance} stopped: {loop.commits} commits, {loop.aborts} aborts")


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
