"""What reaches Gradio from the network: an allow-list of routes and a check of every request's
envelope, in front of the mounted Gradio app (a plain ASGI middleware).

Gradio serves far more routes than this app uses (uploads, proxies, streams, run history,
component servers, ...) and answers some malformed calls with a 500 and a logged traceback. A
public Space should expose only what the page and the API need, and refuse everything else with
a 4xx whose message names the problem, logged in one line. Gradio's own checks stay in force
behind this (see internals.mark_launched); this layer does not replace them.

What a request may be:
  - the page and its static files (GET/HEAD);
  - Gradio's queue protocol for the app's own events: queue/join, queue/data, heartbeat, cancel,
    and call/<api_name> for the named endpoints; the JSON envelope is checked (envelope.py:
    fn_index, session_hash, data's arity, event_data, no file objects) and forwarded as checked;
  - file=<path> for files inside Gradio's cache folder (the images the app wrote);
  - extra routes of the app itself (/healthz, /readyz).
"""

from __future__ import annotations

import json
import logging
import os
import unicodedata
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs

from ..spec.values import shown
from .envelope import (Endpoint, ID, Refused, check_cached_file, check_envelope, check_fn_index, check_id, parse_json,
                       parse_json_object)
from .internals import QueueView

log = logging.getLogger("sdxl_tpu.http")

# A /generate call is a few kB; the page's carries the history the browser keeps too: 25 runs'
# two prompts of up to 20,000 characters (fields.MAX_PROMPT_CHARS), 4 bytes each in UTF-8 at most.
MAX_BODY_BYTES = 4 << 20
API = "/gradio_api"
STATIC_PAGES = frozenset(["/", "/config", "/config/", "/theme.css", "/favicon.ico", "/manifest.json", "/robots.txt",
                          f"{API}/info", f"{API}/info/", f"{API}/theme.css"])
STATIC_PREFIXES = ("/assets/", "/static/", "/svelte/")
# What the page's "Use via API" panel asks for although this app serves neither (monitoring and MCP
# are off): refused like anything else, but not logged, so opening the panel leaves the log quiet.
UNLOGGED = frozenset(["/monitoring/summary", f"{API}/mcp/schema"])


class Answered(Exception):
    """A request the guard answers itself (Gradio's route would do nothing with it)."""

    def __init__(self, status: int, body: dict):
        super().__init__(status)
        self.status, self.body = status, body


Handler = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class RequestGuard:
    """ASGI middleware: allow-listed routes only, envelopes checked, nothing unhandled escapes.

    `endpoints` are the Blocks' callable events (`endpoints_of(blocks.config)`), `queue` tells
    which sessions and events Gradio's queue holds, `cache_dir` is Gradio's cache folder,
    `app_routes` the app's own routes besides Gradio's (GET/HEAD).
    """

    def __init__(self, app: Handler, endpoints: dict[int, Endpoint], queue: QueueView, cache_dir: str | Path,
                 app_routes: Iterable[str] = (), max_body: int = MAX_BODY_BYTES,
                 closed: Callable[[], str | None] = lambda: None,
                 on_join: Callable[[int, int], None] | None = None):
        """`closed()` returns a message while new work must be refused (503 to new queue calls,
        e.g. while draining); `on_join(fn_index, status)` is told the answer to each new call."""
        self.app, self.endpoints, self.queue, self.max_body = app, endpoints, queue, max_body
        self.cache_dir = Path(os.path.realpath(cache_dir))
        self.pages = STATIC_PAGES | set(app_routes)
        self.closed, self.on_join = closed, on_join

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":  # the app serves no websockets
            await send({"type": "websocket.close", "code": 1008})
            return
        method, path = scope["method"], scope["path"]
        started = False
        joining = method == "POST" and (path == f"{API}/queue/join" or path.startswith(f"{API}/call/"))
        fn_index = None

        async def send_tracked(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self._joined(fn_index, message["status"])
            await send(message)

        try:
            checked = await self.check(scope, receive)
            if checked is not None:
                # Forward what was checked, re-encoded: Gradio parses exactly the values looked at here.
                body = json.dumps(checked, ensure_ascii=True).encode()
                fn_index = checked.get("fn_index") if joining else None
                receive = _replay(body, receive)
                scope = _with_body_length(scope, len(body))
            if fn_index is not None and (why := self.closed()):
                self._joined(fn_index, 503)
                log.info("refused %s %s from %s: %s", method, shown(path, 80), client_address(scope), why)
                await _send_json(send, 503, {"detail": why}, headers=[(b"retry-after", b"5")])
                return
            await self.app(scope, receive, send_tracked)
        except Answered as e:
            await _send_json(send, e.status, e.body)
        except Refused as e:  # raised by check(), before the app could start a response
            if path not in UNLOGGED:
                log.info("refused %s %s from %s: %s", method, shown(path, 80), client_address(scope), e.message)
            await _send_json(send, e.status, {"detail": e.message})
        except Exception as e:  # a bug, not a client's fault: one line, no traceback to the client
            where = _innermost_frame(e)
            log.error("error %s %s from %s: %s: %s (%s)", method, shown(path, 80), client_address(scope),
                      type(e).__name__, shown(str(e), 200), where)
            if not started:
                await _send_json(send, 500, {"detail": "Internal error; it has been logged."})
            else:  # end the response the app began (uvicorn would log an incomplete one again)
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def check(self, scope: dict, receive) -> dict | None:
        """Raises Refused, or returns the checked JSON body to forward (None: forward the request
        as it is)."""
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        if any(unicodedata.category(ch) == "Cc" for ch in path + query):
            raise Refused(400, "The URL contains control characters.")
        reading = method in ("GET", "HEAD")
        if reading and (path in self.pages or path.startswith(STATIC_PREFIXES)):
            return None
        if reading and path.startswith(f"{API}/file="):
            check_cached_file(path[len(f"{API}/file="):], self.cache_dir)
            return None
        if reading and path.startswith(f"{API}/heartbeat/"):
            check_id(path[len(f"{API}/heartbeat/"):])
            return None
        if method == "GET" and path == f"{API}/queue/data":
            values = parse_qs(query, keep_blank_values=True).get("session_hash", [None])
            if not self.queue.has_session(check_id(values[-1])):
                raise Refused(404, "No such session: join the queue first (it may have ended).")
            return None
        if method == "GET" and path.startswith(f"{API}/call/"):
            api_name, _, event_id = path[len(f"{API}/call/"):].partition("/")
            self._named(api_name)
            if not ID.fullmatch(event_id) or not self.queue.has_event(event_id):
                raise Refused(404, "No such event: POST to /gradio_api/call/<api_name> first (it may have ended).")
            return None
        if method == "POST" and path == f"{API}/reset":
            # gradio_client posts here when a job is cancelled; Gradio's route does nothing (the
            # client's closed stream is what tells the server), so the guard answers for it.
            data = parse_json_object(await _read_body(scope, receive, self.max_body))
            check_id(data.get("event_id"), "event_id")
            raise Answered(200, {"success": True})
        if method == "POST" and path in (f"{API}/queue/join", f"{API}/cancel") or (
                method == "POST" and path.startswith(f"{API}/call/")):
            return await self._checked_post(path, scope, receive)
        if path in self.pages or path.startswith((f"{API}/file=", f"{API}/heartbeat/", f"{API}/queue/data",
                                                  f"{API}/call/", f"{API}/queue/join", f"{API}/cancel",
                                                  f"{API}/reset")):
            raise Refused(405, f"{method} is not allowed here.")
        if path.startswith(f"{API}/upload"):
            raise Refused(403, "This app takes no file uploads.")
        raise Refused(404, "Not found. This server answers the page, the /generate endpoint through "
                           "Gradio's queue, /healthz and /readyz.")

    def _joined(self, fn_index: int | None, status: int) -> None:
        if fn_index is not None and self.on_join is not None:
            try:
                self.on_join(fn_index, status)
            except Exception:
                log.exception("on_join failed")

    def _named(self, api_name: str) -> Endpoint:
        for endpoint in self.endpoints.values():
            if endpoint.public and endpoint.api_name == api_name:
                return endpoint
        raise Refused(404, f"No endpoint named {shown(api_name)}; this app's API has /generate.")

    async def _checked_post(self, path: str, scope: dict, receive) -> dict:
        body = await _read_body(scope, receive, self.max_body)
        if path == f"{API}/cancel":
            data = parse_json_object(body)
            checked = {"session_hash": check_id(data.get("session_hash")),
                       "fn_index": check_fn_index(data.get("fn_index"), self.endpoints),
                       "event_id": check_id(data.get("event_id"), "event_id")}
        elif path == f"{API}/queue/join":
            checked = check_envelope(parse_json(body), self.endpoints)
            check_id(checked.get("session_hash"))
        else:
            api_name = path[len(f"{API}/call/"):].removesuffix("/")
            checked = check_envelope(parse_json(body), self.endpoints, fn_index=self._named(api_name).fn_index)
            if checked.get("session_hash") is not None:
                check_id(checked["session_hash"])
        return checked


async def _read_body(scope: dict, receive, limit: int) -> bytes:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            if not value.isdigit():
                raise Refused(400, "Content-Length is not a number.")
            if int(value) > limit:
                raise Refused(413, f"The request body is larger than {limit // 1024} KiB.")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "The client went away before sending the whole body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"The request body is larger than {limit // 1024} KiB.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later: the client's disconnect, as the app would have seen it

    return replay


def _with_body_length(scope: dict, length: int) -> dict:
    headers = [(k, v) for k, v in scope.get("headers", []) if k not in (b"content-length", b"transfer-encoding")]
    return {**scope, "headers": headers + [(b"content-length", str(length).encode())]}


async def _send_json(send, status: int, body: dict, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body, ensure_ascii=True).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


def client_address(scope: dict) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


def _innermost_frame(e: BaseException) -> str:
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else "?"
