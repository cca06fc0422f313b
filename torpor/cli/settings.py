"""Where the command line reads configuration: flags, `TORPOR_*` variables, a TOML file.

This is the one place that reads `os.environ` for settings (STYLE 10). Commands take a
`--config FILE` and a `--bootstrap` flag; the flag wins over the variables, which win
over the file, which wins over the defaults of `torpor.streams.config`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from torpor.schemas.errors import ConfigError
from torpor.streams.config import Settings, TopicSettings, load_settings

F = TypeVar("F", bound=Callable[..., object])


def settings_options(command: F) -> F:
    """Add `--config` and `--bootstrap` to a click command."""
    command = click.option(
        "--bootstrap",
        default=None,
        help="Kafka bootstrap servers (overrides TORPOR_BOOTSTRAP and the config file).",
    )(command)
    command = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        envvar="TORPOR_CONFIG",
        help="A TOML settings file (or TORPOR_CONFIG).",
    )(command)
    return command


def read_settings(config_file: Path | None, bootstrap: str | None) -> Settings:
    """Load the settings, or exit with the one-line cause of a `ConfigError`."""
    env = dict(os.environ)
    if bootstrap:
        env["TORPOR_BOOTSTRAP"] = bootstrap
    try:
        return load_settings(env, config_file)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None


def default_group(settings: Settings, role: str) -> str:
    """The consumer group (and transactional id family) of `role` when none is given.

    `torpor-<role>` under the default topic prefix, `<prefix><role>` under any other: two
    deployments on one cluster (two prefixes) then never share a group, where a shared
    one would split partitions across unrelated topics and, for processors, fence each
    other's transactional ids.
    """
    prefix = settings.topics.prefix
    return f"torpor-{role}" if prefix == TopicSettings().prefix else f"{prefix}{role}"
