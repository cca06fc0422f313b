"""`torpor ui`: the inspector, a web page of the threads, their timelines and the operator's controls.

Output contract: `torpor ui: http://HOST:PORT/` on stdout once the server listens (with
`--port 0`, the port the system chose), then uvicorn's access log on stderr until
interrupted. The page reads `events` and `receipts` (read_committed); approvals and
controls given from it are produced as `operator:<--operator>` inputs, signed with
`--signing-key-id`/`--signing-key` when given (a processor with a key ring refuses them
unsigned), exactly as `torpor approve` and `torpor control` would produce them.

It listens on 127.0.0.1 by default and answers only requests addressed to this host's
names (`--allow-host` adds one, for a proxy or another interface): whoever can reach
the page can act as the operator, so put it behind your own authentication before
exposing it.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import socket
from pathlib import Path

import click
import uvicorn
from uvicorn.config import LOGGING_CONFIG

from torpor.cli.logs import LOG_FORMAT_OPTION, LogFormat, configure
from torpor.cli.send import produce_inputs
from torpor.cli.settings import default_group, read_settings, settings_options
from torpor.cli.signing import signer_for, signing_options
from torpor.inspector.app import UiConfig, create_app
from torpor.inspector.desk import Desk
from torpor.inspector.past import PastState
from torpor.processors.refold import refold
from torpor.processors.replay import thread_head
from torpor.processors.store.tables import read_entries
from torpor.schemas.records import Input
from torpor.streams.config import Settings


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The port (0: any free one, printed).")
@click.option("--allow-host", "allowed", multiple=True,
              help="Another Host name the page may be reached by (repeatable).")
@click.option("--operator", default=None,
              help="Who acts from the page: operator:<name> (default: login name).")
@click.option("--app", default=None,
              help="The processor's --app (its consumer group), whose lag the page shows "
                   "(default: the processor's default for these settings).")
@LOG_FORMAT_OPTION
@signing_options
@settings_options
def ui(host: str, port: int, allowed: tuple[str, ...], operator: str | None, app: str | None, log_format: str,
       signing_key_id: str | None, signing_key: Path | None, config_file: Path | None,
       bootstrap: str | None) -> None:
    """Serve the inspector: the threads, their timelines, approvals and operator controls."""
    json_logs = log_format == LogFormat.JSON
    if json_logs:  # uvicorn's loggers then propagate to the JSON handler instead of their own
        configure("info", log_format)
    settings = read_settings(config_file, bootstrap)
    signer = signer_for(signing_key_id, signing_key)

    def submit(record: Input) -> None:
        produce_inputs(settings, [record])

    hosts = ["127.0.0.1", "localhost", "[::1]", *allowed]
    if host not in ("0.0.0.0", "::"):
        hosts.append(host)
    desk = Desk(operator or getpass.getuser(), signer, submit)
    page = create_app(UiConfig(settings=settings, desk=desk, hosts=tuple(hosts),
                               time_travel=functools.partial(past_state, settings),
                               group=app or default_group(settings, "processor")))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # before the address is printed: a client that connects at once waits, not refused
    except OSError as error:
        raise click.ClickException(f"cannot listen on {host}:{port}: {error}") from None
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    click.echo(f"torpor ui: http://{shown}:{sock.getsockname()[1]}/", nl=True)
    server = uvicorn.Server(uvicorn.Config(page, log_level="info", timeout_graceful_shutdown=3,
                                           log_config=None if json_logs else LOGGING_CONFIG))
    # uvicorn re-raises the Ctrl-C it stopped on: a clean stop (exit 0), not click's "Aborted!".
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


def past_state(settings: Settings, thread_id: str, offset: int) -> PastState | None:
    """`thread_id` as it stood after the input at `offset` of its partition: what
    `torpor replay --thread --at` prints (`refold`). None if it did not exist then."""
    refolded = refold(settings, thread_id=thread_id, at=offset)
    store = refolded.stores.get(refolded.partition) if refolded.partition is not None else None
    head = thread_head(store, thread_id) if store is not None else None
    if store is None or head is None:
        return None
    return PastState(thread_id, offset, head.status, head.history_len, head.head,
                     tuple(read_entries(store, thread_id)))
