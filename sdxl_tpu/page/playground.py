"""The playground's process: the page (page_layout.py's components, page_events.py's events) in
Gradio's queue, mounted with /healthz, /readyz, /metrics and the other tools' APIs behind the
request guard and the API key, served by uvicorn until SIGTERM has drained it. app.py runs `main`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from gradio.utils import get_upload_folder

from ..request.fields import FEWEST_INPUTS
from ..imaging.image_input import MAX_BYTES
from ..server.batcher import SHUTTING_DOWN
from ..server.core import Server
from ..routes.envelope import endpoints_of
from ..server.errors import configure_logging
from ..server.files import ImageStore
from ..routes.guard import RequestGuard
from ..routes.internals import DrainingServer, QueueView, heartbeat_stopper, mark_launched, serve_gallery_as_images
from ..server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, serve_metrics_apart
from .page_events import wire
from .page_layout import lay_out
from ..server.settings import parse_settings
from ..routes.tool_apis import PREFIXES as TOOL_API_PREFIXES, KeyRequired, tool_api_routes
from ..server.uploads import Uploads

WEB = Path(__file__).resolve().parent / "web"  # the page's own CSS and script
QUEUE_POLL_SECONDS = (0.01, 0.05)  # how often Gradio's queue looks for work, and for progress to send
# The browser sessions whose state (the page's gr.State values) Gradio keeps, the least recently
# used dropped first. Gradio keeps 10,000, and each holds its own copy of the page's configuration,
# some 260 kB here: 2.6 GB, which one client naming new sessions fills in minutes.
SESSIONS_KEPT = 1000


def build_demo(server: Server) -> gr.Blocks:
    """The page: its components and their events, in Gradio's bounded queue."""
    with gr.Blocks(title="SDXL on JAX", analytics_enabled=False) as demo:
        wire(demo, lay_out(demo, server), server)
    demo.queue(default_concurrency_limit=1, max_size=server.settings.queue_size, api_open=False)
    # Gradio's queue looks for work every 1 ms and for progress every 10 ms, idle or not: 4.4 % of a
    # core for nothing, 1.4 % at 10 and 50 ms (2026-12-07). A call takes seconds here; 10 ms more
    # before one starts, and progress sent 20 times a second, are not seen.
    queue = demo._queue
    queue.sleep_when_free, queue.progress_update_sleep_when_free = QUEUE_POLL_SECONDS
    # Gradio records every event for its monitoring dashboard (off here) and, after each one, sums
    # the last 10,000 up in a pandas DataFrame: 4-9 ms of a core an event, never read. Keep one
    # record and never sum.
    queue.ANALYTICS_MAX_EVENTS, queue.ANAYLTICS_CACHE_FREQUENCY = 1, sys.maxsize
    demo.state_session_capacity = SESSIONS_KEPT
    return demo


def build_app(server: Server) -> tuple[KeyRequired, QueueView, Callable[[], None]]:
    """The ASGI app: Gradio's page and queue (and, with --mcp on, its MCP server) plus /healthz,
    /readyz, (unless --metrics says otherwise) /metrics and the APIs of A1111 and OpenAI, behind the
    request guard and the API key; with Gradio's queue and what ends its heartbeat streams (for
    the drain)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.router.routes.extend(tool_api_routes(server))  # (before Gradio's, mounted at the root)
    routes = ["/healthz", "/readyz"]

    @app.get("/healthz")
    def healthz():
        return {"status": "alive"}

    @app.get("/readyz")
    def readyz():
        body, status = server.warmup.readiness()
        return JSONResponse(body, status_code=status)

    if server.settings.metrics == "public":
        routes.append("/metrics")

        @app.get("/metrics")
        def metrics():
            return Response(server.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    demo = build_demo(server)
    ours = lambda path: server.images.holds([path])
    server.uploads = Uploads(demo.upload_file_set, ours, keep_seconds=server.settings.keep_images_seconds,
                             max_bytes=server.settings.max_image_bytes)
    gr.mount_gradio_app(app, demo, path="/", enable_monitoring=False, ssr_mode=False, mcp_server=server.settings.mcp,
                        max_file_size=MAX_BYTES,
                        footer_links=["api"], css=(WEB / "playground.css").read_text(),
                        js=(WEB / "playground.js").read_text())
    mark_launched(demo)
    if server.settings.mcp:
        serve_gallery_as_images(demo, lambda path: Path(path).read_bytes() if ours(path) else None)
    queue, endpoints = QueueView(demo), endpoints_of(demo.config, shortest={"generate": FEWEST_INPUTS})
    server.count_waiting(queue.waiting)
    generations = {e.fn_index: "page" if e.api_name == "generate_in_page" else "/generate" for e in endpoints.values()
                   if e.api_name in ("generate", "generate_in_page")}

    def count_turned_away(fn_index: int, status: int) -> None:
        if fn_index in generations and status == 503:
            server.metrics.count("draining" if server.warmup.draining else "queue_full", generations[fn_index])

    guard = RequestGuard(app, endpoints, queue, cache_dir=get_upload_folder(), app_routes=routes,
                         closed=lambda: SHUTTING_DOWN if server.warmup.draining else None, on_join=count_turned_away,
                         ours=ours, uploads=server.uploads, api_prefixes=TOOL_API_PREFIXES, mcp=server.settings.mcp)
    return KeyRequired(guard, server.settings.api_key), queue, heartbeat_stopper(app)


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging()
    if settings.backend is None:  # (a front end runs no model: no JAX is imported)
        from ..server.local_engine import prepare_process

        prepare_process(settings)
    # Images are written into Gradio's cache folder, where the gallery serves them from.
    images = ImageStore.under(get_upload_folder(), settings.keep_images_seconds, settings.max_image_bytes)
    # (The page's calls wait in Gradio's queue; the other tools' APIs in the engine's, as bounded.)
    server = Server(settings, images=images, max_waiting=settings.queue_size)
    app, queue, end_streams = build_app(server)
    serve_metrics_apart(settings.metrics, server.metrics.registry)
    # SIGTERM drains: /readyz says 503 at once, new calls are refused, accepted ones finish (at most
    # --drain-seconds), then Gradio's heartbeat streams are ended so open pages do not hold the exit.
    web = DrainingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                        timeout_graceful_shutdown=5),
                         drain=lambda: server.drain(busy=queue.busy), before_exit=end_streams)
    # Listening at once: the page, /healthz, and /readyz (503) until the model is warm, or for a
    # front end until a back end describes itself (it waits as long as that takes).
    what = f"back end {settings.backend}" if settings.backend else f"loading {settings.load.model}"
    return server.run(web, f"http://{settings.host}:{settings.port}", what)
