"""SDXL playground: a Gradio page that fills a four-image gallery from one compiled JAX pipeline.

    python app.py                      # SDXL base 1.0 (downloaded on first run)
    python app.py --model tiny         # offline, the built-in tiny checkpoint
    python app.py --backend URL        # no model here: back ends (python -m sdxl_tpu serve) make the images

UI and wiring only; everything testable lives in sdxl_tpu/playground.py.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from gradio.utils import get_upload_folder
from starlette.routing import Mount

from sdxl_tpu.compilation import enable_compile_cache
from sdxl_tpu.http_guard import QueueView, RequestGuard, endpoints_of, mark_launched
from sdxl_tpu.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sdxl_tpu.playground import (DEFAULT_STYLE, EXAMPLES, STYLES, Server, gradio_handler, parse_settings,
                                 seed_at, serve_metrics_apart, style_description)
from sdxl_tpu.request import GUIDANCE_RANGE, MAX_PROMPT_CHARS, MAX_SEED, format_size
from sdxl_tpu.scheduler import MAX_STEPS, SAMPLERS
from sdxl_tpu.serving import SHUTTING_DOWN, DrainingServer

CSS = "#gallery {min-height: 420px} #status p {margin: 0}"


def build_demo(server: Server) -> gr.Blocks:
    sizes = [format_size(s) for s in server.sizes]
    with gr.Blocks(title="SDXL on JAX", analytics_enabled=False) as demo:
        gr.Markdown("# Stable Diffusion XL, served from JAX\nFour images per run, one compiled pipeline on every chip.")
        status = gr.Markdown(server.message, elem_id="status")
        with gr.Row(equal_height=True):
            prompt = gr.Textbox(label="Prompt", placeholder="Describe the image", max_lines=3, scale=5,
                                max_length=MAX_PROMPT_CHARS, elem_id="prompt")
            run = gr.Button("Generate", variant="primary", scale=1, elem_id="generate")
        tokens = gr.Markdown(elem_id="token-count")
        negative = gr.Textbox(label="Negative prompt", placeholder="What to leave out", max_lines=2,
                              max_length=MAX_PROMPT_CHARS, elem_id="negative")
        gallery = gr.Gallery(label="Images", columns=2, preview=False, buttons=["download", "fullscreen"],
                             elem_id="gallery")
        # Images are written once (parameters embedded) into Gradio's cache folder, where the gallery
        # serves them without a copy; the store deletes old ones and Gradio forgets them too.
        server.images = server.image_store(Path(get_upload_folder()),
                                           on_delete=lambda paths: gallery.temp_files.difference_update(paths))
        info = gr.Markdown("Click an image to reuse its seed.", elem_id="info")
        last_seeds = gr.State([])
        with gr.Accordion("Advanced", open=False):
            style = gr.Dropdown(list(STYLES), value=DEFAULT_STYLE, label="Style")
            style_info = gr.Markdown(style_description(DEFAULT_STYLE))
            with gr.Row():
                seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, maximum=MAX_SEED)
                randomize = gr.Checkbox(label="Randomize seed", value=True)
            start = server.recipe
            presets = {r.name: [r.steps, r.sampler, r.guidance] for r in server.presets}
            preset = gr.Dropdown(list(presets), value=start.name if start else None, label="Preset",
                                 info="; ".join(f"{r.name}: {r.summary}" for r in server.presets), elem_id="preset")
            guidance = gr.Slider(*GUIDANCE_RANGE, value=start.guidance if start else 5.0, step=0.1,
                                 label="Guidance scale")
            with gr.Row():
                steps = gr.Slider(1, MAX_STEPS, value=start.steps if start else 20, step=1, label="Steps")
                sampler = gr.Dropdown(list(SAMPLERS), value=server.default_sampler, label="Sampler")
            # A preset fills steps, sampler and guidance in the browser: no server event.
            preset.input(None, inputs=[preset], outputs=[steps, sampler, guidance],
                         js=f"(p) => ({json.dumps(presets)})[p]")
            size = gr.Dropdown(sizes, value=sizes[0], label="Size (width x height)")
        # Examples fill the prompt in the browser: no server event, nothing to call.
        examples = gr.Dataset(components=[prompt], samples=[[e] for e in EXAMPLES], label="Examples",
                              type="index", elem_id="examples")
        examples.click(None, inputs=[examples], outputs=[prompt], js=f"(i) => {json.dumps(EXAMPLES)}[i]")

        # Every handler takes its inputs as the client sent them (preprocess=False): Gradio's
        # component preprocessing would silently convert them (a list to its text, 1.5 to 2);
        # sdxl_tpu.playground checks each value and refuses, with a message, what is not right.
        def generate(prompt, negative, style, seed, randomize, guidance, steps, size, sampler=None,
                     progress=gr.Progress()):
            # The request stops (waiting or between denoising steps) once Gradio no longer runs
            # its event: the page closed, the client cancelled or went away.
            queue, event_id = QueueView(demo), QueueView.current_event_id()
            event = queue.running_event(event_id)
            progress(0, desc="Encoding prompts")
            return server.serve((prompt, negative, style, seed, randomize, guidance, steps, size, sampler),
                                progress=lambda i, n: progress((i, n), desc="Denoising"),
                                abandoned=(lambda: queue.running_event(event_id) is None) if event_id else None,
                                queued_at=event.enqueue_time if event is not None else None)

        # As many requests run at once as one pipeline call can serve (more than one on hosts with
        # more chips than a request has images); the rest wait in Gradio's bounded queue.
        gr.on([prompt.submit, negative.submit, run.click], gradio_handler(generate, "/generate"),
              inputs=[prompt, negative, style, seed, randomize, guidance, steps, size, sampler],
              outputs=[gallery, last_seeds, info], api_name="generate", concurrency_limit=server.concurrency,
              preprocess=False)

        def reuse_seed(seeds: list[int], evt: gr.SelectData):
            chosen = seed_at(seeds, evt.index)
            return (chosen, False) if chosen is not None else (gr.skip(), gr.skip())

        light = dict(api_visibility="private", concurrency_limit=None, show_progress="hidden", preprocess=False)
        gallery.select(gradio_handler(reuse_seed, "reuse seed"), inputs=[last_seeds], outputs=[seed, randomize],
                       **light)
        prompt.change(server.token_count, inputs=[prompt], outputs=[tokens], **light)
        style.change(style_description, inputs=[style], outputs=[style_info], **light)

        # While warming up the page says so, and refreshes until the model is ready.
        timer = gr.Timer(2.0, active=not server.done_event.is_set())
        timer.tick(lambda: (server.message, gr.Timer(active=not server.done_event.is_set())),
                   outputs=[status, timer], **light)
        demo.load(lambda: server.message, outputs=[status], **light)
    demo.queue(default_concurrency_limit=1, max_size=server.settings.queue_size, api_open=False)
    return demo


def build_app(server: Server) -> tuple[RequestGuard, QueueView, Callable[[], None]]:
    """The ASGI app: Gradio's page and queue plus /healthz, /readyz and (unless --metrics says
    otherwise) /metrics, behind the request guard; with Gradio's queue and what ends its
    heartbeat streams (for the drain)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    routes = ["/healthz", "/readyz"]

    @app.get("/healthz")
    def healthz():
        return {"status": "alive"}

    @app.get("/readyz")
    def readyz():
        body, status = server.readiness()
        return JSONResponse(body, status_code=status)

    if server.settings.metrics == "public":
        routes.append("/metrics")

        @app.get("/metrics")
        def metrics():
            return Response(server.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    demo = build_demo(server)
    gr.mount_gradio_app(app, demo, path="/", enable_monitoring=False, ssr_mode=False, mcp_server=False,
                        footer_links=["api"], css=CSS)
    mark_launched(demo)
    queue, endpoints = QueueView(demo), endpoints_of(demo.config)
    server.queue_waiting = queue.waiting
    generate_fn = next(e.fn_index for e in endpoints.values() if e.api_name == "generate")

    def count_turned_away(fn_index: int, status: int) -> None:
        if fn_index == generate_fn and status == 503:
            server.metrics.count("draining" if server.draining else "queue_full")

    guard = RequestGuard(app, endpoints, queue, cache_dir=get_upload_folder(), app_routes=routes,
                         closed=lambda: SHUTTING_DOWN if server.draining else None, on_join=count_turned_away)
    gradio_app = next(r.app for r in app.routes if isinstance(r, Mount))
    return guard, queue, gradio_app.stop_event.set


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("sdxl_tpu").setLevel(logging.INFO)
    server = Server(settings)
    if settings.backend is not None:
        # A front end builds its page from what the back ends offer (sizes, samplers, presets):
        # it waits for them first (bounded), then answers at once.
        print(f"waiting for the back end at {settings.backend}", flush=True)
        server.load()
        if server.status == "error":
            print(f"error: {server.error}", file=sys.stderr, flush=True)
            return 1
    else:
        enable_compile_cache(settings.compile_cache)  # once, for the process: a restart reuses compiled programs
    app, queue, end_streams = build_app(server)
    serve_metrics_apart(server)
    # SIGTERM drains: /readyz says 503 at once, new calls are refused, accepted ones finish (at most
    # --drain-seconds), then Gradio's heartbeat streams are ended so open pages do not hold the exit.
    web = DrainingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                        timeout_graceful_shutdown=5),
                         drain=lambda: server.drain(busy=queue.busy), before_exit=end_streams)

    def stop_on_error() -> None:
        server.done_event.wait()
        if server.status == "error":
            print(f"error: {server.error}", file=sys.stderr, flush=True)
            web.should_exit = True
        else:
            print(f"ready: http://{settings.host}:{settings.port} ({server.message})", flush=True)

    if settings.backend is None:
        server.start()
    threading.Thread(target=stop_on_error, daemon=True).start()
    print(f"serving on http://{settings.host}:{settings.port} "
          f"({f'back end {settings.backend}' if settings.backend else f'loading {settings.model}'})", flush=True)
    web.run()
    server.images.close()
    print("stopped", flush=True)
    return 1 if server.status == "error" else 0


if __name__ == "__main__":
    sys.exit(main())
