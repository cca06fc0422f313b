"""The `torpor` command. The only module that composes processors and connectors.

Subcommands live in modules of their own and are imported only when used, so
`torpor broker start` does not pay for importing the processor.
"""

from __future__ import annotations

import importlib
from typing import Final

import click

from torpor import __version__

# command name -> "module:attribute" of a click command. One line per subcommand.
COMMANDS: Final[dict[str, str]] = {
    "approve": "torpor.cli.approve:approve",
    "broker": "torpor.cli.broker:broker",
    "connector": "torpor.cli.connector:connector",
    "control": "torpor.cli.control:control",
    "demo": "torpor.cli.demo:demo",
    "history": "torpor.cli.history:history",
    "keys": "torpor.cli.keys:keys",
    "local": "torpor.cli.local:local",
    "processor": "torpor.cli.processor:processor",
    "replay": "torpor.cli.replay:replay",
    "send": "torpor.cli.send:send",
    "tail": "torpor.cli.tail:tail",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="torpor")
def main() -> None:
    """Torpor: a durable runtime for long-waiting LLM agents, built on Kafka."""
