"""`torpor topics check|create`: the Torpor topics of a prefix, on purpose.

Output contract: one line per topic, `<name> <partitions> ok|missing|PROBLEM ...`, then,
for `check`, exit 0 when the layout holds (every topic present, partitions and required
configs right), 1 otherwise; configs that differ from the layout without breaking it are
shown as `drift`. `create` makes the missing topics (the partition count of an existing
`inputs` decides the others'; `TORPOR_PARTITIONS` only shapes a fresh `inputs`), then
prints the same lines, and exits 1 with the fix when an existing topic breaks the layout.
Nothing here alters an existing topic: the lines say which `kafka-configs.sh` or
`kafka-topics.sh` command does.
"""

from __future__ import annotations

from pathlib import Path

import click

from torpor.cli.settings import read_settings, settings_options
from torpor.streams.admin import TopicState, ensure_topics, inspect_topics
from torpor.streams.clients import make_admin
from torpor.streams.deadline import Deadline

DEADLINE_S = 60.0


@click.group("topics")
def topics() -> None:
    """Check or create the topics of a topic prefix (TORPOR_TOPIC_PREFIX)."""


@topics.command("check")
@settings_options
def check(config_file: Path | None, bootstrap: str | None) -> None:
    """Show each topic against the layout; exit 1 if one is missing or wrong."""
    settings = read_settings(config_file, bootstrap)
    states = inspect_topics(make_admin(settings), settings, Deadline.after(DEADLINE_S))
    _show(states)
    if any(state.problems for state in states):
        raise click.ClickException("the topics do not have the layout the processor needs "
                                   "(`torpor topics create` makes the missing ones)")


@topics.command("create")
@settings_options
def create(config_file: Path | None, bootstrap: str | None) -> None:
    """Create the missing topics; show them all."""
    settings = read_settings(config_file, bootstrap)
    admin = make_admin(settings)
    ensured = ensure_topics(admin, settings, Deadline.after(DEADLINE_S))
    for name in ensured.created:
        click.echo(f"created {name}")
    _show(inspect_topics(admin, settings, Deadline.after(DEADLINE_S)))


def _show(states: tuple[TopicState, ...]) -> None:
    width = max(len(state.spec.name) for state in states)
    for state in states:
        count = "-" if state.partitions is None else str(state.partitions)
        verdict = "PROBLEM " + "; ".join(state.problems) if state.problems else "ok"
        drift = f" (drift: {'; '.join(state.drift)})" if state.drift else ""
        click.echo(f"{state.spec.name:<{width}} {count:>3} {verdict}{drift}")
