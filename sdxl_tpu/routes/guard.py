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
  - file=<path> for the images the app wrote, and for uploads as fresh PNG pixels (uploads.py);
  - uploads (POST upload: one file of at most 16 MB, multipart) where the page takes an image;
  - extra routes of the app itself (/healthz, /readyz), and the APIs other tools speak (A1111's,
    OpenAI's: routes that read and check their bodies themselves);
  - with MCP on, Gradio's MCP server (streamable HTTP, SSE, its schema), bodies bounded; its tool
    calls come back through the queue as any other call of /generate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs
from starlette.types import ASGIApp, Message

from ..request.errors import RequestError
from ..imaging.image_input import MAX_BYTES, decode_image
from ..request.values import shown
from .asgi_io import (FILE_HEADERS, client_address, innermost_frame, read_body, replay, send_bytes, send_json,
                      with_body_length)
from .envelope import (Endpoint, ID, Refused, check_cached_file, check_envelope, check_fn_index, check_id, parse_json,
                       parse_json_object)
from .internals import QueueView
from ..server.uploads import Uploads

log = logging.getLogger("sdxl_tpu.http")

# A /generate call is a few kB; the page's carries the history the browser keeps too: 25 runs'
# two prompts of up to 20,000 characters (fields.MAX_PROMPT_CHARS), 4 bytes each in UTF-8 at most.
MAX_BODY_BYTES = 4 << 20
MAX_UPLOAD_BYTES = MAX_BYTES + (64 << 10)  # one image file and its multipart headers
API = "/gradio_api"
STATIC_PAGES = frozenset(["/", "/config", "/config/", "/theme.css", "/favicon.ico", "/manifest.json", "/robots.txt",
                          f"{API}/info", f"{API}/info/", f"{API}/theme.css"])
STATIC_PREFIXES = ("/assets/", "/static/", "/svelte/")
# What the page's "Use via API" panel asks for although this app may serve neither (monitoring, MCP
# when off): refused like anything else, but not logged, so opening the panel leaves the log quiet.
UNLOGGED = frozenset(["/monitoring/summary", f"{API}/mcp/schema"])
MCP_ROUTES = {f"{API}/mcp/": ("GET", "POST", "DELETE"), f"{API}/mcp/sse": ("GET",), f"{API}/mcp/messages/": ("POST",),
              f"{API}/mcp/schema": ("GET",)}  # (Gradio's: streamable HTTP, SSE and its posts, the tools' schema)


class Answered(Exception):
    """A request the guard answers itself (Gradio's route would do nothing with it, or must not
    answer it: an upload served back): a JSON body, or bytes of `media_type`."""

    def __init__(self, status: int, body: dict | bytes, media_type: str = "application/json"):
        super().__init__(status)
        self.status, self.body, self.media_type = status, body, media_type


Handler = ASGIApp


class RequestGuard:
    """ASGI middleware: allow-listed routes only, envelopes checked, nothing unhandled escapes.

    `endpoints` are the Blocks' callable events (`endpoints_of(blocks.config)`), `queue` tells
    which sessions and events Gradio's queue holds, `cache_dir` is Gradio's cache folder,
    `app_routes` the app's own routes besides Gradio's (GET/HEAD), `api_prefixes` where the routes of
    other tools' APIs are (any method); `ours(path)` whether the app wrote a file (its images:
    served), `uploads` what people uploaded (None: no uploads taken); `mcp` whether Gradio's MCP
    server is on.
    """

    def __init__(self, app: Handler, endpoints: dict[int, Endpoint], queue: QueueView, cache_dir: str | Path,
                 app_routes: Iterable[str] = (), max_body: int = MAX_BODY_BYTES,
                 closed: Callable[[], str | None] = lambda: None,
                 on_join: Callable[[int, int], None] | None = None,
                 ours: Callable[[str], bool] = lambda path: False, uploads: Uploads | None = None,
                 api_prefixes: tuple[str, ...] = (), mcp: bool = False):
        """`closed()` returns a message while new work must be refused (503 to new queue calls,
        e.g. while draining); `on_join(fn_index, status)` is told the answer to each new call."""
        self.app, self.endpoints, self.queue, self.max_body = app, endpoints, queue, max_body
        self.ours, self.uploads = ours, uploads
        self.cache_dir = Path(os.path.realpath(cache_dir))
        self.pages = STATIC_PAGES | set(app_routes)
        self.closed, self.on_join = closed, on_join
        self.api_prefixes, self.mcp = api_prefixes, mcp

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

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self._joined(fn_index, message["status"])
            await send(message)

        try:
            checked = await self.check(scope, receive)
            if checked is not None:
                # Forward what was checked, re-encoded: Gradio parses exactly the values looked at here.
                body = checked if isinstance(checked, bytes) else json.dumps(checked, ensure_ascii=True).encode()
                fn_index = checked.get("fn_index") if joining and isinstance(checked, dict) else None
                receive = replay(body, receive)
                scope = with_body_length(scope, len(body))
            if fn_index is not None and (why := self.closed()):
                self._joined(fn_index, 503)
                log.info("refused %s %s from %s: %s", method, shown(path, 80), client_address(scope), why)
                await send_json(send, 503, {"detail": why}, headers=[(b"retry-after", b"5")])
                return
            await self.app(scope, receive, send_tracked)
        except Answered as e:
            if isinstance(e.body, bytes):
                await send_bytes(send, e.status, e.body, e.media_type, FILE_HEADERS)
            else:
                await send_json(send, e.status, e.body)
        except Refused as e:  # raised by check(), before the app could start a response
            if path not in UNLOGGED:
                log.info("refused %s %s from %s: %s", method, shown(path, 80), client_address(scope), e.message)
            # (a refused call, as Gradio's clients read one: a failed validation, its message shown)
            detail = [{"__type__": "validate", "is_valid": False, "parameter_name": "request",
                       "message": e.message}] if joining and e.status == 422 else e.message
            await send_json(send, e.status, {"detail": detail})
        except Exception as e:  # a bug, not a client's fault: one line, no traceback to the client
            where = innermost_frame(e)
            log.error("error %s %s from %s: %s: %s (%s)", method, shown(path, 80), client_address(scope),
                      type(e).__name__, shown(str(e), 200), where)
            if not started:
                await send_json(send, 500, {"detail": "Internal error; it has been logged."})
            else:  # end the response the app began (uvicorn would log an incomplete one again)
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def check(self, scope: dict, receive) -> dict | bytes | None:
        """Raises Refused, or returns the checked body to forward (JSON, or bytes as they came;
        None: forward the request as it is)."""
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        if any(unicodedata.category(ch) == "Cc" for ch in path + query):
            raise Refused(400, "The URL contains control characters.")
        reading = method in ("GET", "HEAD")
        if reading and (path in self.pages or path.startswith(STATIC_PREFIXES)) or path.startswith(self.api_prefixes):
            return None
        if self.mcp and path in MCP_ROUTES:
            if method not in MCP_ROUTES[path]:
                raise Refused(405, f"{method} is not allowed here.")
            return await self._mcp_message(scope, receive) if method == "POST" else None
        if reading and path.startswith(f"{API}/file="):
            file = path[len(f"{API}/file="):]
            check_cached_file(file, self.cache_dir)
            if self.ours(file):
                return None
            if self.uploads is not None and self.uploads.holds(file):
                try:
                    raise Answered(200, self.uploads.png(file), "image/png")
                except (RequestError, OSError):
                    raise Refused(415, "That upload is not an image this app reads (PNG, JPEG or WebP).") from None
            raise Refused(404, "No such image (only files this app wrote are served, while they last).")
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
            data = parse_json_object(await read_body(scope, receive, self.max_body))
            check_id(data.get("event_id"), "event_id")
            raise Answered(200, {"success": True})
        if method == "POST" and path in (f"{API}/queue/join", f"{API}/cancel") or (
                method == "POST" and path.startswith(f"{API}/call/")):
            return await self._checked_post(path, scope, receive)
        if path in self.pages or path.startswith((f"{API}/file=", f"{API}/heartbeat/", f"{API}/queue/data",
                                                  f"{API}/call/", f"{API}/queue/join", f"{API}/cancel",
                                                  f"{API}/reset")):
            raise Refused(405, f"{method} is not allowed here.")
        if method == "POST" and path == f"{API}/upload" and self.uploads is not None:
            return await self._checked_upload(scope, receive)
        if path.startswith(f"{API}/upload"):
            raise Refused(403, "This app takes no other file uploads." if self.uploads else
                          "This app takes no file uploads.")
        raise Refused(404, "Not found. This server answers the page, the /generate endpoint through "
                           "Gradio's queue, /healthz and /readyz" + (", the APIs of A1111 (/sdapi/v1) and OpenAI "
                           "(/v1/images)" if self.api_prefixes else "") + (", MCP" if self.mcp else "") + ".")

    async def _checked_upload(self, scope: dict, receive) -> bytes:
        """One file of an image's size, as multipart form data (Gradio's parser reads it and writes
        it where uploads.py finds it); older uploads are swept first."""
        headers = dict(scope.get("headers", []))
        kind = headers.get(b"content-type", b"").decode("latin-1")
        boundary = kind.partition("boundary=")[2].strip('"')
        if not kind.startswith("multipart/form-data") or not boundary:
            raise Refused(400, "An upload is multipart form data with one image file.")
        body = await read_body(scope, receive, MAX_UPLOAD_BYTES, "An upload is one image file of at most "
                                f"{MAX_BYTES // 2**20} MB.")
        parts = [part for part in body.split(b"--" + boundary.encode("latin-1"))[1:] if not part.startswith(b"--")]
        head, blank, content = parts[0].partition(b"\r\n\r\n") if len(parts) == 1 else (b"", b"", b"")
        if not blank:
            raise Refused(400, "An upload is one image file at a time, as multipart form data.")
        try:  # (decoded by its content, whatever its name says: only images are kept)
            await asyncio.to_thread(decode_image, content.removesuffix(b"\r\n"), "The upload")
        except RequestError as e:
            raise Refused(415, str(e)) from None
        if self.uploads is not None:
            self.uploads.sweep()
        return body

    async def _mcp_message(self, scope: dict, receive) -> bytes:
        """A JSON-RPC 2.0 message as JSON in UTF-8 (the MCP library answers other bytes with a 500,
        and a message whose id is not text or a number with silence)."""
        body = await read_body(scope, receive, self.max_body)
        try:
            message = parse_json(body.decode("utf-8"))
        except UnicodeDecodeError:
            raise Refused(400, "An MCP message is JSON in UTF-8.") from None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise Refused(400, "An MCP message is one JSON-RPC 2.0 object ({\"jsonrpc\": \"2.0\", ...}).")
        if "id" in message and (isinstance(message["id"], bool) or not isinstance(message["id"], (str, int))):
            raise Refused(400, "A JSON-RPC id is text or a whole number.")
        if "method" in message and not isinstance(message["method"], str):
            raise Refused(400, "A JSON-RPC method is text.")
        return body

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
        body = await read_body(scope, receive, self.max_body)
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
        if "data" in checked:
            self._check_files(checked)
        return checked

    def _check_files(self, checked: dict) -> None:
        """An image input is null or the file object of an upload (or of one of the app's images),
        named as the upload answered: Gradio would otherwise answer a path with its own error."""
        for index, label, value in self.endpoints[checked["fn_index"]].files(checked["data"]):
            path = value.get("path") if isinstance(value, dict) else None
            held = isinstance(path, str) and (self.ours(path) or self.uploads is not None and self.uploads.holds(path))
            if not held:
                raise Refused(422, f"{label} (input {index + 1}) must be null or a file uploaded to this page "
                                   "(POST /gradio_api/upload), as the upload named it; uploads are deleted after "
                                   "a while.")
