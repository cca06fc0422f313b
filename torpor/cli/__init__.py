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
    "fork": "torpor.cli.fork:fork",
    "history": "torpor.cli.history:history",
    "keys": "torpor.cli.keys:keys",
    "local": "torpor.cli.local:local",
    "processor": "torpor.cli.processor:processor",
    "replay": "torpor.cli.replay:replay",
    "send": "torpor.cli.send:send",
    "tail": "torpor.cli.tail:tail",
    "topics": "torpor.cli.topics:topics",
    "ui": "torpor.cli.ui:ui",
}


# librdkafka error codes that mean "no broker answered", for the one line a command prints.
UNREACHABLE: Final = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE"})


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use.

    A Kafka or Torpor error a subcommand lets escape ends the command with one line on
    stderr and exit code 1 (click's usage errors keep their code 2), never a traceback:
    an operator needs what failed and what to check, not where in the code.
    """

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            line = _one_line(exc)
            if line is None:
                raise
            raise click.ClickException(line) from exc

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


def _one_line(exc: Exception) -> str | None:
    """What to print for `exc`, or None to let it escape (a bug: its traceback helps)."""
    from confluent_kafka import KafkaException  # here: only a failing command pays the import

    from torpor.schemas.errors import TorporError
    from torpor.streams.errors import kafka_error_of, translate

    if isinstance(exc, KafkaException):
        error = kafka_error_of(exc)
        if error.name() in UNREACHABLE:
            return (f"cannot reach the Kafka broker ({error.str()}): check that it runs and "
                    "that --bootstrap, TORPOR_BOOTSTRAP or the config file name it")
        return str(translate(exc, operation="the Kafka call"))
    if isinstance(exc, TorporError):
        return str(exc)
    return None
