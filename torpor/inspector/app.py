"""The ASGI app of `torpor ui`: the page, its JSON API and its server-sent event streams.

Routes:
  GET  /                        the page (static HTML; the operator token in a meta tag)
  GET  /static/...              its script and style sheet (no build step)
  GET  /api/threads             one page of the threads list: ?q=&status=&offset=&limit=
  GET  /api/threads/stream      SSE: `changed` whenever the list changed (the page re-asks)
  GET  /api/thread?id=          one thread's summary (404 if no record of it was seen)
  GET  /api/thread/stream?id=   SSE: the thread's snapshot, then each later record; every
                                message's id is the position after it, so a reconnecting
                                EventSource (Last-Event-ID) resumes with no gap and no repeat
  GET  /api/thread/at?id=&offset=   the thread as it stood after its input at that offset of
                                its partition (re-folded from `inputs`, as `torpor replay --at`);
                                the page's token required, as for the POSTs
  POST /api/approve, /api/control   an operator's decision or command, signed (`Desk`);
                                answers the message id, whose receipt the timeline shows
  GET  /api/lag?window=         the processor group's lag per `inputs` partition, its members
                                (instances) and the last `window` seconds of samples (`LagWatch`)
  POST /api/fork                a fork of a thread from one of its entries (`Desk.fork`):
                                answers the control's message id, the new thread's id and
                                its creation's message id (its receipt: the new timeline)

Security. Thread ids and model text are written by whoever produces inputs: the page
inserts every value as text, never as markup, and the Content-Security-Policy allows no
inline script, so a value that slipped through would still not run. POSTs carry the
operator's power (they are signed with the key the UI was started with), so each must
carry the per-process token of the page (`X-Torpor-Token`: a custom header, so a
cross-site form or fetch cannot send it without a CORS preflight this app never allows)
and, when the browser says where it comes from, an `Origin` of this server. Requests for
a Host that is not this server's are refused, so DNS rebinding cannot read the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from torpor.inspector.bridge import IDLE, iterate_in_thread
from torpor.inspector.desk import Desk, DeskError, ForkRequest
from torpor.inspector.feed import Feed
from torpor.inspector.index import ThreadIndex
from torpor.inspector.lag import WINDOW_MS
from torpor.inspector.lagwatch import LagWatch
from torpor.inspector.past import TimeTravel
from torpor.inspector.timeline import timeline
from torpor.schemas.errors import TorporError
from torpor.schemas.ids import id_problem
from torpor.streams.config import Settings
from torpor.streams.observer import Position

STATIC: Final = files("torpor.inspector") / "static"
LIST_POLL_SECONDS: Final = 0.5
KEEPALIVE_SECONDS: Final = 15.0
MAX_BODY: Final = 16 * 1024
# What each action's JSON body may name. Anything else (a `source`, an `operator`, a
# `decided_by`, a key or a signature) is refused: who acts is the operator and the key
# this UI was started with, never what a request says.
APPROVE_FIELDS: Final = frozenset({"thread_id", "approval_id", "choice"})
CONTROL_FIELDS: Final = frozenset({"thread_id", "command", "call_id", "model", "reason"})
FORK_FIELDS: Final = frozenset({"thread_id", "at_seq", "new_thread_id", "model", "reason"})
CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS: Final = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                  "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


@dataclass(frozen=True, slots=True)
class UiConfig:
    """What the app serves: the Kafka settings, the operator's desk and the hosts it answers to."""

    settings: Settings
    desk: Desk
    hosts: Sequence[str] = ("127.0.0.1", "localhost", "[::1]")
    time_travel: TimeTravel | None = None
    group: str | None = None  # the processor's consumer group (`--app`): the lag panel's subject
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


class _SecurityHeaders:
    """Adds `HEADERS` to every response (the page's and the API's alike)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((k.lower().encode(), v.encode()) for k, v in HEADERS.items()
                                        if k.lower().encode() not in present)]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(config: UiConfig, *, feed: bool = True) -> Starlette:
    """The app. With `feed` (the default) it reads the topics into its thread index while it runs."""
    index = ThreadIndex()
    reader = Feed(config.settings, index)
    lag = LagWatch(config.settings, config.group) if config.group else None
    page = (STATIC / "index.html").read_text().replace("{{TOKEN}}", config.token)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if feed:
            reader.start()
            if lag is not None:
                lag.start()
        try:
            yield
        finally:
            await asyncio.to_thread(reader.stop)
            if lag is not None:
                await asyncio.to_thread(lag.stop)

    async def home(_: Request) -> Response:
        return HTMLResponse(page)

    async def threads(request: Request) -> Response:
        try:
            offset = int(request.query_params.get("offset", "0"))
            limit = int(request.query_params.get("limit", "50"))
            found = index.query(request.query_params.get("q", "")[:200],
                                request.query_params.get("status", ""), offset, limit)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return JSONResponse({**found.as_json(), **_feed_state(reader, index)})

    async def thread(request: Request) -> Response:
        summary = index.summary(request.query_params.get("id", ""))
        if summary is None:
            return JSONResponse({"error": "no record of this thread has been seen"}, status_code=404)
        return JSONResponse(summary.as_json())

    async def threads_stream(_: Request) -> Response:
        return _event_stream(list_changes(lambda: {"version": index.version, **_feed_state(reader, index)}))

    async def thread_stream(request: Request) -> Response:
        thread_id = request.query_params.get("id", "")
        if not thread_id:
            return JSONResponse({"error": "which thread? (?id=)"}, status_code=400)
        resume = None
        if last := request.headers.get("last-event-id"):
            try:
                resume = Position.from_json(json.loads(last))
            except (ValueError, TypeError, AttributeError):
                return JSONResponse({"error": "Last-Event-ID is not a position this server gave"},
                                    status_code=400)

        async def records() -> AsyncIterator[str]:
            items = iterate_in_thread(lambda stopped: timeline(config.settings, thread_id, resume, stopped),
                                      KEEPALIVE_SECONDS)
            try:
                async for item in items:
                    if item is IDLE:
                        yield ": keepalive\n\n"
                        continue
                    position, message = item
                    yield _sse(str(message["kind"]), message, json.dumps(position.as_json()))
            except TorporError as error:
                yield _sse("failed", {"error": str(error)})
            finally:
                await items.aclose()

        return _event_stream(records())

    def may_exist(thread_id: str) -> bool:
        # Until the feed has read the topics to their end, an unlisted thread may still
        # exist: the fold judges it then (its receipt says).
        return not reader.caught_up.is_set() or index.summary(thread_id) is not None

    async def approve(request: Request) -> Response:
        return await _operate(request, config, lambda body: config.desk.approve(
            _text(body, "thread_id"), _text(body, "approval_id"), _text(body, "choice")),
            fields=APPROVE_FIELDS, known=may_exist)

    async def control(request: Request) -> Response:
        return await _operate(request, config, lambda body: config.desk.control(
            _text(body, "thread_id"), _text(body, "command"), call_id=_optional(body, "call_id"),
            model=_optional(body, "model"), reason=_optional(body, "reason")),
            fields=CONTROL_FIELDS, known=may_exist)

    async def fork(request: Request) -> Response:
        return await _operate(request, config, lambda body: config.desk.fork(
            _text(body, "thread_id"), _whole(body, "at_seq"), new_thread_id=_optional(body, "new_thread_id"),
            model=_optional(body, "model"), reason=_optional(body, "reason")),
            fields=FORK_FIELDS, known=may_exist)

    async def thread_at(request: Request) -> Response:
        # A re-fold costs the server a read of the partition: only the page may ask for one
        # (another site could make a browser send this GET, not the token).
        if (foreign := _not_from_the_page(request, config)) is not None:
            return foreign
        thread_id = request.query_params.get("id", "")
        try:
            offset = int(request.query_params.get("offset", ""))
        except ValueError:
            offset = -1
        if not thread_id or offset < 0:
            return JSONResponse({"error": "which thread (?id=) at which input offset (&offset=)?"},
                                status_code=400)
        if (problem := id_problem(thread_id)) is not None:  # no input can name it: no re-fold for it
            return JSONResponse({"error": f"not a thread id: {problem}"}, status_code=400)
        travel = config.time_travel
        if travel is None:
            return JSONResponse({"error": "time travel is not available in this server"}, status_code=501)
        try:
            past = await asyncio.to_thread(travel, thread_id, offset)
        except TorporError as error:
            return JSONResponse({"error": str(error)}, status_code=502)
        if past is None:
            return JSONResponse({"error": "the thread did not exist at that offset"}, status_code=404)
        return JSONResponse(past.as_json())

    async def lag_panel(request: Request) -> Response:
        if extra := sorted(set(request.query_params) - {"window"}):
            return JSONResponse({"error": f"unexpected parameter {extra[0][:40]!r}: /api/lag takes window"},
                                status_code=400)
        raw = request.query_params.get("window", str(WINDOW_MS // 1000))
        window = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 6 else 0
        if not 1 <= window <= WINDOW_MS // 1000:
            return JSONResponse({"error": f"window must be whole seconds, 1 to {WINDOW_MS // 1000}"},
                                status_code=400)
        if lag is None:
            return JSONResponse({"error": "this server watches no processor group"}, status_code=501)
        view = lag.view()
        since = (view.at_ms or 0) - window * 1000
        series = lag.series(since)
        return JSONResponse({**view.as_json(), "window": window,
                             "series": {str(p): [list(s) for s in samples] for p, samples in series.items()}})

    async def whoami(_: Request) -> Response:
        return JSONResponse({"operator": config.desk.source, "signed": config.desk.signer is not None,
                             "prefix": config.settings.topics.prefix})

    routes = [
        Route("/", home),
        Route("/api/threads", threads),
        Route("/api/threads/stream", threads_stream),
        Route("/api/thread", thread),
        Route("/api/thread/stream", thread_stream),
        Route("/api/thread/at", thread_at),
        Route("/api/approve", approve, methods=["POST"]),
        Route("/api/control", control, methods=["POST"]),
        Route("/api/fork", fork, methods=["POST"]),
        Route("/api/lag", lag_panel),
        Route("/api/whoami", whoami),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    middleware = [Middleware(_SecurityHeaders),
                  Middleware(TrustedHostMiddleware, allowed_hosts=list(config.hosts))]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


def _feed_state(reader: Feed, index: ThreadIndex) -> dict[str, object]:
    return {"caught_up": reader.caught_up.is_set(), "feed_error": reader.error, "count": len(index)}


async def list_changes(state: Callable[[], dict[str, object]],
                       poll_seconds: float = LIST_POLL_SECONDS) -> AsyncIterator[str]:
    """The list stream: a `changed` message whenever `state()` (version, feed state) changed.

    The feed catching up or failing changes no row, yet the page must hear it: a page that
    loaded mid-read would otherwise say "reading the topics…" for good.
    """
    seen: dict[str, object] | None = None
    quiet = 0.0
    while True:
        now = state()
        if now != seen:
            seen = now
            quiet = 0.0
            yield _sse("changed", now)
        elif quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield ": keepalive\n\n"
        await asyncio.sleep(poll_seconds)
        quiet += poll_seconds


def _sse(event: str, data: object, event_id: str | None = None) -> str:
    # json.dumps never emits a raw newline, so one `data:` line holds the message whole.
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _event_stream(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


class _BadRequest(Exception):
    pass


def _text(body: dict[str, object], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise _BadRequest(f"{name} must be a string")
    return value


def _whole(body: dict[str, object], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRequest(f"{name} must be a whole number")
    return value


def _optional(body: dict[str, object], name: str) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _BadRequest(f"{name} must be a string")
    return value


def _not_from_the_page(request: Request, config: UiConfig) -> Response | None:
    """A 403 unless the request carries the page's token and, if the browser names one, this origin."""
    token = request.headers.get("x-torpor-token", "")
    if not hmac.compare_digest(token.encode(), config.token.encode()):
        return JSONResponse({"error": "missing or wrong X-Torpor-Token: reload the page"}, status_code=403)
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
        return JSONResponse({"error": f"requests from {origin[:100]!r} are not accepted"}, status_code=403)
    return None


async def _operate(request: Request, config: UiConfig,
                   act: Callable[[dict[str, object]], str | ForkRequest], *,
                   fields: frozenset[str] | None = None,
                   known: Callable[[str], bool] | None = None) -> Response:
    """Check that the request comes from this UI's page, then `act` on its JSON body.

    Refused before anything is produced, each with a 4xx status and a reason: no token or
    another origin (403), not JSON (415), over `MAX_BODY` (413, read no further), not one
    JSON object or nested past the parser's depth (400), a field outside `fields` (400),
    a well-formed thread id `known` does not know (404: the page acts on threads it lists),
    and whatever `act` raises `DeskError` for (400).
    """
    if (foreign := _not_from_the_page(request, config)) is not None:
        return foreign
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return JSONResponse({"error": "send JSON (Content-Type: application/json)"}, status_code=415)
    raw = await _bounded_body(request)
    if raw is None:
        return JSONResponse({"error": f"request too large (at most {MAX_BODY} bytes)"}, status_code=413)
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise _BadRequest("the body must be a JSON object")
        if fields is not None and (extra := sorted(set(body) - fields)):
            raise _BadRequest(f"unexpected field {extra[0][:40]!r}: this action takes "
                              f"{', '.join(sorted(fields))}; it is sent as {config.desk.source}, "
                              "signed with the UI's key")
        thread_id = body.get("thread_id")
        if (known is not None and isinstance(thread_id, str) and id_problem(thread_id) is None
                and not known(thread_id)):
            return JSONResponse({"error": f"no record of thread {thread_id!r} has been seen: the page "
                                          "acts only on threads it lists"}, status_code=404)
        done = await asyncio.to_thread(act, body)  # produces and waits for the ack
    except RecursionError:  # nested deeper than the parser goes: not a request the page sends
        return JSONResponse({"error": "the body is nested too deeply"}, status_code=400)
    except (ValueError, _BadRequest, DeskError) as error:  # ValueError: not JSON, not UTF-8
        return JSONResponse({"error": str(error)[:500]}, status_code=400)
    except TorporError as error:
        return JSONResponse({"error": str(error)}, status_code=502)
    answer: dict[str, object] = {"source": config.desk.source, "signed": config.desk.signer is not None}
    if isinstance(done, ForkRequest):
        answer.update(message_id=done.message_id, new_thread_id=done.new_thread_id,
                      creation_id=done.creation_id)
    else:
        answer["message_id"] = done
    return JSONResponse(answer)


async def _bounded_body(request: Request) -> bytes | None:
    """The request's body, or None once it is over `MAX_BODY`, declared or streamed: never
    more than that is read into memory."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            return None
    return bytes(raw)
