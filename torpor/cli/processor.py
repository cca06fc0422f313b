"""`torpor processor`: run one exactly-once processor instance against Kafka, or N of them.

Output contract: logs go to stderr, one line per event with the shell's fields. Exit
codes: 0 after a clean stop (SIGTERM/SIGINT, or `--until-idle` once caught up and idle);
1 for a configuration problem (the message says what to fix); 2 for a fatal runtime
error (fenced by another instance, a hung transaction call, a store out of step with the
group's offsets), printed as one `fatal:` line. A fatal exit does not wait for the
Kafka clients to close: a fenced or hung client may never close, and the restarted
instance cleans up after this one. With workers the command ends with the first failing
worker's status (128 + n for one killed by signal n) and stops the others.

This module reads the options, creates the topics and decides how many processes fold
(`torpor.cli.workers`); the process that folds is assembled by `torpor.cli.processor_run`,
imported only then, so that a supervisor of workers holds ~35 MiB, not a processor's 70.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Final

import click

from torpor.cli.logs import LOG_FORMAT_OPTION, announce, configure
from torpor.cli.scenario import load_rules
from torpor.cli.settings import default_group, read_settings, settings_options
from torpor.cli.traces import TRACES_OPTION
from torpor.cli.workers import (
    MAX_WORKERS,
    WORKERS_ENV,
    chosen_workers,
    layout_warning,
    supervise,
    worker_commands,
)
from torpor.schemas.errors import ConfigError
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import make_admin
from torpor.streams.deadline import Deadline

# Creating the topics on first start includes waiting for leaders; a laptop broker is quick.
ENSURE_TOPICS_SECONDS: Final = 60.0


@click.command("processor")
@click.option("--instance", required=True,
              help="This instance's stable name: its transactional id and static group member id "
                   "(with workers, theirs are <instance>-w<k>).")
@click.option("--until-idle", is_flag=True,
              help="Exit once every owned partition is caught up and nothing is in flight (with "
                   "--workers N, each worker once its own are).")
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
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None,
              envvar=WORKERS_ENV,
              help="Run N processor processes of this app, to use N cores: instances <instance>-w0.."
                   "-w<N-1>, stores under --store-dir/w<k>, metrics on consecutive ports, each "
                   "with its share of the [memory] budgets. This process supervises them and ends "
                   "with the first failing one's status. With 1 this process folds itself. "
                   "Default: the usable cores (affinity and CPU quota), at most one per partition "
                   "of inputs; 1 with --connector or --until-idle.")
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
              metrics_port: int | None, metrics_host: str, workers: int | None, log_level: str,
              log_format: str, traces: str, config_file: Path | None, bootstrap: str | None) -> None:
    """Fold the `inputs` topic into the RocksDB stores, exactly once, with the model stage beside it."""
    configure(log_level, log_format)
    # A stop asked for during startup (topics, stores) is honoured at the loop's first check.
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: stopping.append(number))
    settings = read_settings(config_file, bootstrap)
    app = app or default_group(settings, "processor")
    stores = store_dir or Path(".torpor") / "stores" / instance
    if workers is not None and workers > 1:  # refused before any topic is touched
        if connectors:
            raise click.BadParameter(f"a hosted --connector runs in one process: with --workers {workers} "
                                     "each worker would run every tool call; use --workers 1, or run "
                                     "the connector on its own (torpor connector run)",
                                     param_hint="--connector")
        worker_commands(ctx, workers, instance, stores, metrics_port)  # the ports fit
    try:
        rules = load_rules(script) if script is not None else ()  # a bad script touches no topic
        # Before any worker starts: the default number of workers follows the partitions.
        ensured = ensure_topics(make_admin(settings), settings, Deadline.after(ENSURE_TOPICS_SECONDS))
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    workers = chosen_workers(workers, partitions=ensured.partitions, hosting=bool(connectors),
                             until_idle=until_idle)
    unused = layout_warning(stores, workers)
    if unused is not None:
        announce(f"warning: {unused}", logging.WARNING)
    if workers > 1:
        commands = worker_commands(ctx, workers, instance, stores, metrics_port)
        sys.exit(supervise(commands, settings.memory.share(workers).environment(), stopping))
    # Imported only by the process that folds (the module docstring).
    from torpor.cli.processor_run import Folding, run_here

    run_here(Folding(
        instance=instance, app=app, until_idle=until_idle, store_dir=stores, rules=rules,
        default_model=default_model, openai_base_url=openai_base_url,
        openai_api_key_env=openai_api_key_env, anthropic_base_url=anthropic_base_url,
        anthropic_api_key_env=anthropic_api_key_env, bedrock_region=bedrock_region,
        bedrock_endpoint_url=bedrock_endpoint_url, connectors=connectors,
        metrics_port=metrics_port, metrics_host=metrics_host, traces=traces,
    ), settings, ensured.partitions, stopping)
