"""SDXL playground: a Gradio page that fills a four-image gallery from one compiled JAX pipeline.

    python app.py                      # SDXL base 1.0 (downloaded on first run)
    python app.py --model tiny         # offline, the built-in tiny checkpoint
    python app.py --backend URL        # no model here: back ends (python -m sdxl_tpu serve) make the images

UI and wiring only; the form's fields are sdxl_tpu/spec/fields.py's, everything testable lives in
sdxl_tpu/server/ (core.py: the server; page.py: what the page shows of its state).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from gradio.utils import get_upload_folder

from sdxl_tpu.server.batcher import SHUTTING_DOWN
from sdxl_tpu.server.core import Server
from sdxl_tpu.server.envelope import endpoints_of
from sdxl_tpu.server.errors import log_refusal
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.server.form import EXAMPLES, seed_at
from sdxl_tpu.server.guard import RequestGuard
from sdxl_tpu.server.handlers import form_handler, gradio_handler
from sdxl_tpu.server.internals import DrainingServer, QueueView, forget_served, heartbeat_stopper, mark_launched
from sdxl_tpu.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, serve_metrics_apart
from sdxl_tpu.server.page import (CUSTOM, HISTORY_HEADERS, HISTORY_PER_PAGE, MATCHING_PRESET_JS, PASTED_INTO,
                                  RESTORE_HISTORY_JS, RNG_INFO, SCHEDULE_INFO, form_defaults, history_after,
                                  history_rows, pasted_form, preset_fields, schedule_choices, size_choices,
                                  style_description)
from sdxl_tpu.server.settings import parse_settings
from sdxl_tpu.spec.fields import FIELD, FORM
from sdxl_tpu.spec.recipes import RECIPES
from sdxl_tpu.spec.styles import STYLES

GENERATE, WARMING_UP = "Generate", "Warming up…"
STOPPED = "Stopped."
NOT_TAKEN = "⚠️ The server could not take the request (see the notice); please try again in a moment."

# Four images in view: on a desktop the form and the results sit side by side and the 2 x 2 grid is
# sized to the viewport (square cells, each image whole inside its cell, never a scrollbar inside
# the gallery); on a phone they stack and the grid takes the width. The run status line carries
# Gradio's progress bar, and its error pill is hidden: the message is in the line itself.
CSS = """
#layout {display: grid; grid-template-columns: minmax(0, 5fr) minmax(0, 6fr); align-items: start;
         grid-template-areas: "form results" "more results"}
#form {grid-area: form} #results {grid-area: results} #more {grid-area: more}
@media (max-width: 767px) {  /* a phone: the results right under the Generate button */
  #layout {grid-template-columns: minmax(0, 1fr); grid-template-areas: "form" "results" "more"}
}
#status p, #run-status p, #summary p {margin: 0}
#run-status {min-height: 2.6em}
#run-status .error, #run-status .clear-status {display: none}
#gallery .grid-wrap {overflow: visible; min-height: 0; max-height: none; height: auto}
#gallery .grid-container {grid-template-columns: repeat(2, minmax(0, 1fr)); grid-template-rows: none;
                          grid-auto-rows: auto; margin: 0 auto}
#gallery .thumbnail-item {aspect-ratio: 1 / 1; height: auto}
#gallery .thumbnail-item img {object-fit: contain}
@media (min-width: 768px) {
  #gallery .grid-container {width: min(100%, calc(100vh - 230px))}
}
"""


def build_demo(server: Server) -> gr.Blocks:
    offer, ready = server.offer, server.ready
    # The page is built before the model is loaded (or a front end's back ends answer): its menus
    # and defaults are refreshed from what the model offers once it does (see `model_menus`).
    presets = preset_fields(RECIPES.values())  # (the menu offers some; choosing one fills the form in the browser)
    start = form_defaults(offer)
    label = lambda name: FIELD[name].label
    with gr.Blocks(title="SDXL on JAX", analytics_enabled=False) as demo:
        gr.Markdown("## Stable Diffusion XL, served from JAX")
        status = gr.Markdown(server.warmup.status_line, elem_id="status")
        with gr.Row(equal_height=False, elem_id="layout"):
            with gr.Column(min_width=0, elem_id="form"):
                prompt = gr.Textbox(label=label("prompt"), placeholder="Describe the image", lines=2, max_lines=6,
                                    elem_id="prompt")
                tokens = gr.Markdown(server.token_count(""), elem_id="token-count")
                negative = gr.Textbox(label=label("negative"), placeholder="What to leave out", max_lines=3,
                                      elem_id="negative")
                with gr.Row():
                    run = gr.Button(GENERATE if ready else WARMING_UP, variant="primary", interactive=ready, scale=3,
                                    min_width=120, elem_id="generate")
                    stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="stop")
                sizes = size_choices(server.warmup.ready_sizes)
                size = gr.Dropdown(sizes, value=sizes[0][1] if sizes else None,
                                   label=f"{label('size')} (aspect ratio · pixels)", elem_id="size")
            with gr.Column(min_width=0, elem_id="results"):
                run_status = gr.Markdown("", elem_id="run-status")
                gallery = gr.Gallery(label="Images", columns=2, height="auto", object_fit="contain", preview=False,
                                     buttons=["download", "fullscreen"], elem_id="gallery")
                summary = gr.Markdown("Four images per run, from one compiled pipeline on every chip. Click an "
                                      "image to reuse its seed.", elem_id="summary")
            with gr.Column(min_width=0, elem_id="more"):
                with gr.Accordion("Advanced", open=False):
                    style = gr.Dropdown(list(STYLES), value=FIELD["style"].default, label=label("style"),
                                        elem_id="style")
                    style_info = gr.Markdown(style_description(FIELD["style"].default))
                    with gr.Row():
                        seed = gr.Number(label=label("seed"), value=FIELD["seed"].default, precision=0,
                                         minimum=FIELD["seed"].limits[0], maximum=FIELD["seed"].limits[1],
                                         elem_id="seed",
                                         info="With Randomize on, each run draws new seeds; this shows the last run's.")
                        randomize = gr.Checkbox(label=label("randomize"), value=FIELD["randomize"].default,
                                                elem_id="randomize")
                    preset = gr.Dropdown([*preset_names(server), CUSTOM], label="Preset", elem_id="preset",
                                         value=start["preset"], info=preset_info(server))
                    offered = gr.Textbox(json.dumps(preset_names(server)), visible="hidden")
                    guidance = gr.Slider(*FIELD["guidance"].limits, value=start["guidance"], step=0.1,
                                         label=label("guidance"), elem_id="guidance")
                    steps = gr.Slider(*FIELD["steps"].limits, value=start["steps"], step=1, label=label("steps"),
                                      elem_id="steps")
                    with gr.Row():
                        sampler = gr.Dropdown(list(offer.samplers), value=start["sampler"], label=label("sampler"),
                                              elem_id="sampler")
                        schedule = gr.Dropdown(schedule_choices(offer.schedules), value=start["schedule"],
                                               label=label("schedule"), elem_id="schedule", info=SCHEDULE_INFO)
                    rng = gr.Dropdown(list(offer.rngs), value=start["rng"], label=label("rng"), elem_id="rng",
                                      info=RNG_INFO)
                # Examples fill the prompt in the browser: no server event, nothing to call.
                examples = gr.Dataset(components=[prompt], samples=[[e] for e in EXAMPLES], label="Examples",
                                      type="index", elem_id="examples")
                with gr.Accordion("Paste parameters", open=False, elem_id="paste-box"):
                    pasted = gr.Textbox(label="Parameters from AUTOMATIC1111's PNG Info or an image's metadata",
                                        lines=3, max_lines=8, placeholder="a cat\nNegative prompt: blurry\n"
                                        "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 1024x1024",
                                        elem_id="paste")
                    use_pasted = gr.Button("Fill the form", size="sm", elem_id="use-paste")
                    paste_notes = gr.Markdown("", elem_id="paste-notes")
                history = gr.BrowserState([], storage_key="sdxl-tpu-history")
                history_table = gr.Dataset(components=[gr.Textbox(visible=False) for _ in HISTORY_HEADERS],
                                           headers=HISTORY_HEADERS, samples=[], type="index", layout="table",
                                           samples_per_page=HISTORY_PER_PAGE, elem_id="history",
                                           label="History (kept in this browser; click a run to restore its settings)")
        # The form's inputs, found by their element ids, which are the fields' names (spec/fields.py):
        # every event takes them in the form's order.
        inputs = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None) in FORM}
        form = [inputs[name] for name in FORM]
        # Images are written once (parameters embedded) into Gradio's cache folder, where the gallery
        # serves them without a copy; the store deletes old ones and Gradio forgets them too.
        server.images.on_delete(lambda paths: forget_served(gallery, paths))
        last_seeds = gr.State([])

        # Every handler takes its inputs as the client sent them (preprocess=False): Gradio's
        # component preprocessing would silently convert them (a list to its text, 1.5 to 2);
        # sdxl_tpu.server checks each value and refuses, with a message, what is not right.
        def run_updates(values, progress, previews: bool):
            # The request stops (waiting or between denoising steps) once Gradio no longer runs
            # its event: Stop, the page closed, the client cancelled or went away.
            queue, event_id = QueueView(demo), QueueView.current_event_id()
            event = queue.running_event(event_id)
            progress(0, desc="Encoding the prompts")
            for update in server.stream(values, queued_at=event.enqueue_time if event is not None else None,
                                        abandoned=(lambda: queue.running_event(event_id) is None) if event_id else None,
                                        previews=previews):
                if update[0] == "progress":
                    progress(update[1:], desc="Denoising", unit="steps")
                else:
                    yield update

        def generate_in_page(values, history, progress):
            for update in run_updates(values, progress, previews=True):
                if update[0] == "preview":
                    yield update[1], *[gr.skip()] * 6
                else:
                    images, seeds, text, ran = update[1:]
                    # The run joins the history, which the browser keeps (in and out with the call; the
                    # server stores no prompt): what ran, the server's defaults where none was sent.
                    kept = history_after(history, {**values, **ran, "negative": values["negative"] or "",
                                                   "seed": seeds[0]})
                    yield images, seeds, text, "", seeds[0], kept, gr.Dataset(samples=history_rows(kept))

        def generate(values, progress):
            """The API: the four images and the summary line (progress per step, no previews; a plain
            function: a generator would cost every call a few more messages and thread hops). The last
            three may be left out: the model's sampler, the server's Schedule type and RNG."""
            *_, (_, images, _, text, _) = run_updates(values, progress, previews=False)  # (run to its end: counted)
            return images, text

        def refused(message: str):  # shown in the run status line; the images and the summary stay
            return gr.skip(), gr.skip(), gr.skip(), f"⚠️ {message}", gr.skip(), gr.skip(), gr.skip()

        # As many requests run at once as one pipeline call can serve (more than one on hosts with
        # more chips than a request has images); the rest wait in Gradio's bounded queue. The page
        # and the API are two events of one queue; the page's also updates the form and the history.
        queued = dict(inputs=form, preprocess=False, concurrency_id="generate", concurrency_limit=server.concurrency,
                      show_progress_on=[run_status])
        generating = gr.on([prompt.submit, negative.submit, run.click],
                           gradio_handler(form_handler(generate_in_page, "history"), "the page's /generate", refused),
                           **{**queued, "inputs": [*form, history]},
                           outputs=[gallery, last_seeds, summary, run_status, seed, history, history_table],
                           api_name="generate_in_page", api_visibility="private")
        # A request the server did not take (its queue full, shutting down) never reaches the handler
        # and fails: the status line says so (Gradio's notice has the reason).
        # (Stop cancels the event, which fails it too: then the line keeps saying it stopped.)
        generating.failure(None, inputs=[run_status], outputs=[run_status],
                           js=f"(line) => line === {json.dumps(STOPPED)} ? line : {json.dumps(NOT_TAKEN)}")
        api_trigger = gr.Button(visible=False)  # the API's event has no button in the page
        api_trigger.click(gradio_handler(form_handler(generate), "/generate"), outputs=[gallery, summary],
                          api_name="generate", **queued)
        light = dict(api_visibility="private", concurrency_limit=None, show_progress="hidden", preprocess=False)
        # Stop: Gradio cancels the event; the request ends within two denoising steps and the page
        # keeps what it showed.
        stop.click(None, outputs=[run_status], js=f"() => {json.dumps(STOPPED)}", cancels=[generating])

        # In the browser, no server event: presets fill the fields, the preset menu follows the
        # fields, examples fill the prompt, a history row fills the form.
        preset.input(None, inputs=[preset, steps, sampler, guidance], outputs=[steps, sampler, guidance],
                     js=f"(p, s, sa, g) => ({json.dumps(presets)})[p] || [s, sa, g]")
        for field in (steps, sampler, guidance):
            field.change(None, inputs=[steps, sampler, guidance, offered], outputs=[preset],
                         js=MATCHING_PRESET_JS.replace("PRESETS", json.dumps(presets)).replace('"CUSTOM"',
                                                                                                json.dumps(CUSTOM)))
        examples.click(None, inputs=[examples], outputs=[prompt], js=f"(i) => {json.dumps(EXAMPLES)}[i]")
        history_table.click(None, inputs=[history_table, history, *form], outputs=form, js=RESTORE_HISTORY_JS)

        def reuse_seed(seeds: list[int], evt: gr.SelectData):
            chosen = seed_at(seeds, evt.index)
            return (chosen, False) if chosen is not None else (gr.skip(), gr.skip())

        gallery.select(gradio_handler(reuse_seed, "reuse seed"), inputs=[last_seeds], outputs=[seed, randomize],
                       **light)
        prompt.change(server.token_count, inputs=[prompt, style], outputs=[tokens], **light)
        pasted_into = [inputs[name] for name in PASTED_INTO]

        def fill_from_pasted(text):
            filled, notes = pasted_form(text, server.offer.sizes, server.offer.samplers)
            if not filled:
                log_refusal("paste parameters", notes)
            return *[filled.get(name, gr.skip()) for name in PASTED_INTO], notes

        gr.on([use_pasted.click, pasted.submit], gradio_handler(fill_from_pasted, "paste parameters"), inputs=[pasted],
              outputs=[*pasted_into, paste_notes], api_name="paste_parameters", **light)
        style.change(lambda prompt, style: (style_description(style), server.token_count(prompt, style)),
                     inputs=[prompt, style], outputs=[style_info, tokens], api_name="style_description", **light)

        # While warming up (and while sizes compile) the page says so and refreshes; a front end's
        # page always does (its back ends come and go).
        refreshing = lambda: not server.warmup.compiled_event.is_set() or server.engine.watch_seconds is not None

        def model_menus(seen: str, prompt_text: Any, style_name: Any):
            """The sampler, schedule, RNG and preset menus as the model (a front end: its back ends)
            offers them, and the token count, when that differs from what the page has (`seen`: what
            it was built from, the tokenizer's presence included); the first time the page sees the
            model described, its defaults too."""
            offer = server.offer
            names = preset_names(server)
            now_offered = json.dumps([offer.samplers, offer.schedules, offer.rngs, names,
                                      server.engine.tokenizer is not None]) if server.warmup.described else ""
            if now_offered == seen or not now_offered:
                return *[gr.skip()] * 9,
            now = {} if seen else form_defaults(offer)
            value = lambda key: {"value": now[key]} if now else {}
            return (json.dumps(names), gr.Dropdown(choices=list(offer.samplers), **value("sampler")),
                    gr.Dropdown(choices=schedule_choices(offer.schedules), **value("schedule")),
                    gr.Dropdown(choices=list(offer.rngs), **value("rng")),
                    gr.Dropdown(choices=[*names, CUSTOM], info=preset_info(server), **value("preset")),
                    now.get("steps", gr.skip()), now.get("guidance", gr.skip()),
                    server.token_count(prompt_text, style_name), now_offered)

        def refresh(seen: str, prompt_text: Any, style_name: Any):
            sizes = size_choices(server.warmup.ready_sizes)
            first = not seen and server.warmup.described and sizes  # (the model's first size, as at a reload)
            return (server.warmup.status_line, gr.Timer(active=refreshing()),
                    gr.Button(GENERATE if server.ready else WARMING_UP, interactive=server.ready),
                    gr.Dropdown(sizes, **({"value": sizes[0][1]} if first else {})),
                    *model_menus(seen, prompt_text, style_name))

        seen_offer = gr.State("")  # the offer this page's menus show ("": not described yet)
        # (`offered` first: the preset menu's match, run when steps or guidance change, reads it)
        refreshed = [status, timer := gr.Timer(2.0, active=refreshing()), run, size, offered, sampler, schedule, rng,
                     preset, steps, guidance, tokens, seen_offer]
        timer.tick(refresh, inputs=[seen_offer, prompt, style], outputs=refreshed, **light)
        demo.load(lambda seen, p, s, h: (*refresh(seen, p, s), gr.Dataset(samples=history_rows(h))),
                  inputs=[seen_offer, prompt, style, history], outputs=[*refreshed, history_table], **light)
    demo.queue(default_concurrency_limit=1, max_size=server.settings.queue_size, api_open=False)
    return demo


def preset_names(server: Server) -> list[str]:
    """The presets the preset menu offers (the model's; a front end: its back ends')."""
    return list(server.offer.presets)


def preset_info(server: Server) -> str:
    return "; ".join(f"{r.name}: {r.summary}" for r in server.presets)


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
        body, status = server.warmup.readiness()
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
    server.count_waiting(queue.waiting)
    generations = {e.fn_index for e in endpoints.values() if e.api_name in ("generate", "generate_in_page")}

    def count_turned_away(fn_index: int, status: int) -> None:
        if fn_index in generations and status == 503:
            server.metrics.count("draining" if server.warmup.draining else "queue_full")

    guard = RequestGuard(app, endpoints, queue, cache_dir=get_upload_folder(), app_routes=routes,
                         closed=lambda: SHUTTING_DOWN if server.warmup.draining else None, on_join=count_turned_away)
    return guard, queue, heartbeat_stopper(app)


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("sdxl_tpu").setLevel(logging.INFO)
    if settings.backend is None:  # (a front end runs no model: no JAX is imported)
        from sdxl_tpu.server.local_engine import prepare_process

        prepare_process(settings)
    # Images are written into Gradio's cache folder, where the gallery serves them from.
    images = ImageStore.under(get_upload_folder(), settings.keep_images_seconds, settings.max_image_bytes)
    server = Server(settings, images=images)
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


if __name__ == "__main__":
    sys.exit(main())
