"""The back end: one compiled pipeline served over plain HTTP, stateless per request, for a load
balancer to spread requests over many hosts (`python -m sdxl_tpu serve`).

    POST /v1/generate   JSON {prompt, negative_prompt, seed, guidance_scale, steps, size, sampler, schedule, rng,
                              parameters, count, format, ...}
                        -> {images: [base64 files], parameters: [text], seeds, sampler, schedule, rng, timings,
                            format}
                        (Accept: text/event-stream: progress events, then the result as an event)
    GET  /v1/info       what it serves: model, sizes, samplers, schedules, rngs, presets, images per call,
                        the LoRAs fused (503 until warm)
    GET  /healthz       the process is alive
    GET  /readyz        200 once warm; 503 while loading and while draining
    GET  /metrics       Prometheus text (--metrics)

The model, its warm-up, the queue, the checks and the counting are the playground's (`Server`,
`Batcher`, `Request`, `Metrics`); only the HTTP in front differs. A request is either refused at
once (4xx naming the problem; 503 with Retry-After when warming up, draining or the queue is full,
so a load balancer tries the next host) or accepted and run to its end. SIGTERM drains
(`DrainingServer`): not ready at once, accepted work finishes, new work is refused, exit 0.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..a1111.images import encode_preview
from ..request.values import shown
from ..server.batcher import ShuttingDown
from ..server.core import Server
from ..server.engine import Generated
from ..server.events import Accepted, BackendEvent, Ended, Failed, Keepalive, Preview, Progress, Result
from ..server.errors import configure_logging
from .http_io import RETRY_AFTER, error_response, logged_status, parse_request, read_body
from .internals import DrainingServer
from ..server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, serve_metrics_apart
from ..server.settings import Settings
from .tool_apis import KeyRequired, tool_api_routes

log = logging.getLogger("sdxl_tpu.routes.backend")
KEEPALIVE_SECONDS = 1.0  # a streaming caller hears from us this often (and can tell we are alive)

def result_json(made: Generated, notes: list[str] | None = None) -> dict[str, Any]:
    """The answer; `notes` (what a pasted parameters text said that was not used) when there was one."""
    return {"images": [base64.b64encode(f).decode("ascii") for f in made.files], "parameters": made.parameters,
            "seeds": made.seeds, "sampler": made.sampler, "schedule": made.schedule, "rng": made.rng,
            "format": made.format,
            "timings": {k: round(v, 4) for k, v in made.timings.items()}, **({"notes": notes} if notes else {})}


class Generation:
    """One POST /v1/generate, run as a task that reports to the HTTP side through `events`:
    Accepted once queued, Progress (and Preview, with `previews`), then Result or Failed
    (events.py). `gone` set means nobody waits for it any more."""

    def __init__(self, server: Server, http: HTTPRequest, previews: bool = False):
        self.server, self.http, self.previews = server, http, previews
        self.events: asyncio.Queue[BackendEvent] = asyncio.Queue()
        self.gone = threading.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        put = lambda event: loop.call_soon_threadsafe(self.events.put_nowait, event)
        done = asyncio.Event()

        def report(event: Progress | Preview | Ended) -> None:  # (the engine's threads)
            if isinstance(event, Ended):
                loop.call_soon_threadsafe(done.set)
            else:
                put(event)

        server = self.server
        try:
            with server.metrics.counted(time.monotonic(), "/v1/generate"):
                # (in a thread: a starting image takes a while to decode and fit, and the loop serves others)
                request, notes, image_format = await asyncio.to_thread(parse_request, await read_body(self.http),
                                                                       server)
                if server.warmup.draining:
                    raise ShuttingDown()
                ticket = server.submit(request, report, self.gone.is_set, self.previews, image_format)
                put(Accepted())
                await done.wait()
                made = await asyncio.to_thread(ticket.result)
                server.metrics.count_images(len(made.files), made.timings["encoding"])
                put(Result(await asyncio.to_thread(result_json, made, notes)))
        except Exception as e:
            put(Failed(*logged_status(e, "/v1/generate", log, "a generation")))

    async def next_event(self, watch_disconnect: bool) -> BackendEvent:
        """The next event; with `watch_disconnect`, the caller leaving sets `gone` meanwhile."""
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), 0.25 if watch_disconnect else KEEPALIVE_SECONDS)
            except TimeoutError:
                if watch_disconnect and await self.http.is_disconnected():
                    self.gone.set()
                if not watch_disconnect:
                    return Keepalive()

    async def server_sent_events(self):
        """Server-sent events: progress, then the result or an error; a comment every second."""
        try:
            while True:
                event = await self.next_event(watch_disconnect=False)
                if isinstance(event, Keepalive):
                    yield ": working\n\n"
                elif isinstance(event, Progress):
                    yield f"event: progress\ndata: {json.dumps({'step': event.step, 'steps': event.steps})}\n\n"
                elif isinstance(event, Preview):  # small JPEGs, a few times a run
                    images = [base64.b64encode(encode_preview(image)).decode("ascii") for image in event.images]
                    data = json.dumps({'step': event.step, 'steps': event.steps, 'images': images})
                    yield f"event: preview\ndata: {data}\n\n"
                elif isinstance(event, Result):
                    yield f"event: result\ndata: {json.dumps(event.body)}\n\n"
                    return
                elif isinstance(event, Failed):
                    yield f"event: error\ndata: {json.dumps({'status': event.status, 'error': event.message})}\n\n"
                    return
        finally:  # finished, or the caller left (Starlette cancels the stream): stop the work if any
            self.gone.set()


def build_backend(server: Server) -> tuple[KeyRequired, Callable[[], bool]]:
    """The ASGI app, and whether a generation is still in progress (for the drain)."""
    tasks: set[asyncio.Task] = set()  # running generations (the event loop keeps only weak references)

    async def generate(http: HTTPRequest) -> Response:
        if server.warmup.status in ("loading", "error"):  # not counted: readiness says so; a balancer goes elsewhere
            return error_response(503, server.warmup.message, RETRY_AFTER["loading"])
        streaming = "text/event-stream" in http.headers.get("accept", "")
        generation = Generation(server, http, previews=streaming)  # previews only for a caller who sees them
        task = asyncio.create_task(generation.run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        event = await generation.next_event(watch_disconnect=False)
        while isinstance(event, Keepalive):  # reading and checking the body (a slow sender is bounded by the server)
            event = await generation.next_event(watch_disconnect=False)
        if isinstance(event, Failed):
            return error_response(event.status, event.message, event.retry_after)
        if streaming:
            return StreamingResponse(generation.server_sent_events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        while isinstance(event := await generation.next_event(watch_disconnect=True), Progress | Preview):
            pass
        if isinstance(event, Failed):
            return error_response(event.status, event.message, event.retry_after)
        assert isinstance(event, Result)  # (a generation's last)
        return JSONResponse(event.body)

    async def info(http: HTTPRequest) -> Response:
        if not server.warmup.described:
            return error_response(503, server.warmup.message, RETRY_AFTER["loading"])
        return JSONResponse(server.offer.to_json())

    async def healthz(http: HTTPRequest) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(http: HTTPRequest) -> Response:
        body, status = server.warmup.readiness()
        return JSONResponse(body, status_code=status)

    routes = [Route("/v1/generate", generate, methods=["POST"]), Route("/v1/info", info, methods=["GET"]),
              Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"]),
              *tool_api_routes(server)]  # (AUTOMATIC1111's API, OpenAI's Images API)
    if server.settings.metrics == "public":
        async def metrics(http: HTTPRequest) -> Response:
            return Response(server.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

        routes.append(Route("/metrics", metrics, methods=["GET"]))

    async def not_found(http: HTTPRequest, exc: Exception) -> Response:
        return error_response(404, f"Not found; this server answers: {', '.join(r.path for r in routes)}.")

    async def wrong_method(http: HTTPRequest, exc: Exception) -> Response:
        return error_response(405, f"{shown(http.method)} is not allowed on {shown(http.url.path)}.")

    async def server_error(http: HTTPRequest, exc: Exception) -> Response:
        log.error("error on %s: %s", http.url.path, exc, exc_info=exc)
        return error_response(500, "Something went wrong on the server; it has been logged.")

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: wrong_method, 500: server_error})
    return KeyRequired(app, server.settings.api_key), lambda: bool(tasks)


def main(settings: Settings) -> int:
    """`python -m sdxl_tpu serve`: load and compile in the background (readiness says when), serve
    until SIGTERM, drain, exit 0 (1 when the model could not be loaded)."""
    configure_logging()
    from ..server.local_engine import prepare_process

    prepare_process(settings)
    server = Server(settings, max_waiting=settings.queue_size)
    serve_metrics_apart(settings.metrics, server.metrics.registry)
    app, generating = build_backend(server)
    web = DrainingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                        timeout_graceful_shutdown=10),
                         drain=lambda: server.drain(busy=generating))
    return server.run(web, f"http://{settings.host}:{settings.port}", f"a back end, loading {settings.load.model}")
