"""SDXL playground: a Gradio page that fills a four-image gallery from one compiled JAX pipeline.

    python app.py                      # SDXL base 1.0 (downloaded on first run)
    python app.py --model tiny         # offline, the built-in tiny checkpoint
    python app.py --backend URL        # no model here: back ends (python -m sdxl_tpu serve) make the images

UI and wiring only; the form's fields are sdxl_tpu/spec/fields.py's, everything testable lives in
sdxl_tpu/server/ (core.py: the server; page.py: what the page shows of its state).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from gradio.utils import get_upload_folder

from sdxl_tpu.server.batcher import SHUTTING_DOWN
from sdxl_tpu.server.core import Server
from sdxl_tpu.server.envelope import endpoints_of
from sdxl_tpu.server.events import Progress
from sdxl_tpu.server.errors import configure_logging, log_refusal
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.server.form import EXAMPLES, picked_item
from sdxl_tpu.server.guard import RequestGuard
from sdxl_tpu.server.handlers import form_handler, gradio_handler
from sdxl_tpu.server.internals import (DrainingServer, QueueView, forget_served, heartbeat_stopper, mark_launched,
                                      serve_gallery_as_images)
from sdxl_tpu.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, serve_metrics_apart
from sdxl_tpu.server.history import HISTORY_HEADERS, HISTORY_PER_PAGE, RESTORE_HISTORY_JS, history_rows, restored_run
from sdxl_tpu.server.page import (CUSTOM, MATCHING_PRESET_JS, PASTED_INTO, PRESET_FILL_JS, RNG_INFO, SCHEDULE_INFO,
                                  form_defaults, pasted_form, preset_fields, run_panel, seed_note, size_choices,
                                  size_for_image, style_description, painted_mask, png_info_note, hires_of,
                                  new_area)
from sdxl_tpu.server.page_run import GENERATE, page_run, page_values, refused, stopped
from sdxl_tpu.server.sampler_menu import fitted_schedule, menu_samplers, schedule_menu
from sdxl_tpu.server.settings import parse_settings
from sdxl_tpu.server.tool_apis import PREFIXES as TOOL_API_PREFIXES, KeyRequired, tool_api_routes
from sdxl_tpu.server.uploads import Uploads
from sdxl_tpu.spec.fields import FEWEST_INPUTS, FIELD, FIELDS, FORM
from sdxl_tpu.spec.image_input import MAX_BYTES
from sdxl_tpu.spec.recipes import RECIPES
from sdxl_tpu.spec.styles import STYLES

WARMING_UP = "Warming up…"
NOT_TAKEN = "The server could not take the request (its queue is full, or it is stopping); please try again."
WEB = Path(__file__).resolve().parent / "sdxl_tpu" / "server" / "web"  # the page's own CSS and script


def build_demo(server: Server) -> gr.Blocks:
    offer, ready = server.offer, server.ready
    # The page is built before the model is loaded (or a front end's back ends answer): its menus
    # and defaults are refreshed from what the model offers once it does (see `model_menus`).
    presets = preset_fields(RECIPES.values())  # (the menu offers some; choosing one fills the form in the browser)
    start = form_defaults(offer)
    label = lambda name: FIELD[name].label
    with gr.Blocks(title="SDXL on JAX", analytics_enabled=False) as demo:
        with gr.Row(elem_id="top"):
            gr.Markdown("# Stable Diffusion XL, served from JAX", elem_id="title")
            status = gr.Markdown(server.warmup.status_line, elem_id="status")
        with gr.Row(equal_height=False, elem_id="layout"):
            # The main controls, in view without opening anything (as A1111's txt2img tab has them).
            with gr.Column(min_width=0, elem_id="form"):
                prompt = gr.Textbox(label=label("prompt"), placeholder="Describe the image (Ctrl+Enter generates)",
                                    lines=3, max_lines=8, elem_id="prompt")
                tokens = gr.Markdown(server.token_count(""), elem_id="token-count")
                gr.Textbox(label=label("negative"), placeholder="What to leave out", max_lines=3,
                                      elem_id="negative")
                with gr.Row():
                    run = gr.Button(GENERATE if ready else WARMING_UP, variant="primary", interactive=ready, scale=3,
                                    min_width=120, elem_id="generate")
                    stop = gr.Button("Stop", variant="stop", interactive=False, scale=1, min_width=70, elem_id="stop")
                    read_prompt = gr.Button("↙️", scale=0, min_width=44, elem_id="read-parameters")
                form_note = gr.Markdown("", elem_id="form-note")
                with gr.Row():
                    sizes = size_choices(server.warmup.ready_sizes)
                    # (min_width: two to a row on a desktop, one on a phone, where the labels are long)
                    size = gr.Dropdown(sizes, value=sizes[0][1] if sizes else None, label=label("size"),
                                       min_width=220, elem_id="size")
                    preset = gr.Dropdown([*preset_names(server), CUSTOM], label="Preset", elem_id="preset",
                                         value=start["preset"], min_width=220)
                with gr.Row():
                    sampler = gr.Dropdown(menu_samplers(offer.samplers), value=start["sampler"],
                                          label=label("sampler"), min_width=220, elem_id="sampler")
                    schedule = gr.Dropdown(schedule_menu(start["sampler"], offer.samplers, offer.schedules),
                                           value=start["schedule"], label=label("schedule"), min_width=220,
                                           elem_id="schedule")
                with gr.Row():
                    steps = gr.Slider(*FIELD["steps"].limits, value=start["steps"], step=1, label=label("steps"),
                                      elem_id="steps")
                    guidance = gr.Slider(*FIELD["guidance"].limits, value=start["guidance"], step=0.1,
                                         label=label("guidance"), elem_id="guidance")
                with gr.Row(elem_id="seed-row"):
                    seed = gr.Number(label=f"{label('seed')} (-1: random)", value=-1, precision=0,
                                     minimum=FIELD["seed"].limits[0], maximum=FIELD["seed"].limits[1], scale=4,
                                     elem_id="seed")
                    gr.Button("🎲", scale=0, min_width=44, elem_id="random-seed").click(
                        None, outputs=[seed], js="() => -1")
                    reuse = gr.Button("♻️", scale=0, min_width=44, elem_id="reuse-seed")
                # img2img, as A1111's tab has it: the image (dropped, pasted or from the webcam), how far
                # from it, how it fits the size. Uploads are read only for a run (server/uploads.py).
                with gr.Accordion("Start from an image", open=False, elem_id="image-panel") as image_panel:
                    image = gr.Image(label=label("image"), type="filepath", sources=["upload", "clipboard", "webcam"],
                                     height=220, elem_id="image")
                    with gr.Row():
                        gr.Slider(*FIELD["strength"].limits, value=FIELD["strength"].default, step=0.01,
                                  label=label("strength"), min_width=220, elem_id="strength")
                        gr.Radio(list(FIELD["resize_mode"].choices), value=FIELD["resize_mode"].default,
                                 label=label("resize_mode"), min_width=220, elem_id="resize_mode")
                    # Inpainting, as A1111's inpaint tabs: paint over the image where it is redrawn (the
                    # painting becomes the mask), or upload a mask of its size (white repaints).
                    painter = gr.ImageEditor(label="Inpaint: paint where to redraw", type="filepath", sources=[],
                                             transforms=(), layers=gr.LayerOptions(allow_additional_layers=False),
                                             brush=gr.Brush(colors=["#ffffff"], color_mode="fixed"), height=300,
                                             elem_id="mask-painter")
                    with gr.Row():
                        mask = gr.Image(label=label("mask"), type="filepath", sources=["upload", "clipboard"],
                                        height=160, image_mode="L", min_width=160, elem_id="mask")
                        with gr.Column(min_width=220):
                            gr.Slider(*FIELD["mask_blur"].limits, value=FIELD["mask_blur"].default, step=1,
                                      label=label("mask_blur"), elem_id="mask_blur")
                            gr.Radio(list(FIELD["masked_content"].choices), value=FIELD["masked_content"].default,
                                     label=label("masked_content"), elem_id="masked_content")
                    outpaint = gr.Button("⬚ Mask the new area (outpaint with Resize and fill)", size="sm",
                                         elem_id="outpaint")
                    with gr.Row():  # A1111's "Only masked": the mask's region redrawn at the size, pasted back
                        gr.Radio(list(FIELD["inpaint_area"].choices), value=FIELD["inpaint_area"].default,
                                 label=label("inpaint_area"), min_width=220, elem_id="inpaint_area")
                        gr.Slider(*FIELD["mask_padding"].limits, value=FIELD["mask_padding"].default, step=4,
                                  label=label("mask_padding"), min_width=220, elem_id="mask_padding")
                # A1111's Hires. fix: the images made at the size, upscaled, and denoised again at a larger
                # compiled size (the upscale must reach one: the status says which).
                with gr.Accordion("Hires. fix", open=False, elem_id="hires-panel"):
                    gr.Checkbox(FIELD["hires"].default, label=label("hires"), elem_id="hires")
                    with gr.Row():
                        gr.Slider(*FIELD["hires_scale"].limits, value=FIELD["hires_scale"].default, step=0.05,
                                  label=label("hires_scale"), min_width=160, elem_id="hires_scale")
                        gr.Slider(*FIELD["hires_steps"].limits, value=FIELD["hires_steps"].default, step=1,
                                  label=label("hires_steps"), min_width=160, elem_id="hires_steps")
                        gr.Slider(*FIELD["hires_strength"].limits, value=FIELD["hires_strength"].default, step=0.01,
                                  label=label("hires_strength"), min_width=160, elem_id="hires_strength")
                    gr.Radio(list(FIELD["hires_upscaler"].choices), value=FIELD["hires_upscaler"].default,
                             label=label("hires_upscaler"), elem_id="hires_upscaler")
                # A1111's seed: -1 draws new seeds each run; the API's Randomize switch stays off here.
                gr.Checkbox(FIELD["randomize"].default, label=label("randomize"), visible=False, elem_id="randomize")
                with gr.Accordion("More options", open=False, elem_id="more-options"):
                    style = gr.Dropdown(list(STYLES), value=FIELD["style"].default, label=label("style"),
                                        elem_id="style")
                    style_info = gr.Markdown(style_description(FIELD["style"].default), elem_id="style-info")
                    rng = gr.Dropdown(list(offer.rngs), value=start["rng"], label=label("rng"), elem_id="rng",
                                      info=RNG_INFO)
                    gr.Markdown(f"{SCHEDULE_INFO} Presets: {preset_info(server)}", elem_id="menu-notes")
                    offered = gr.Textbox(json.dumps(preset_names(server)), visible="hidden")
            with gr.Column(min_width=0, elem_id="results"):
                panel = gr.HTML(run_panel("idle"), elem_id="progress")
                use_seed = gr.Button("♻️ Use this seed", size="sm", elem_id="use-seed")
                use_image = gr.Button("🖼️ Use as image", size="sm", elem_id="use-image")  # (A1111's Send to img2img)
                use_hires = gr.Button("✨ Hires fix", size="sm", elem_id="use-hires")  # (A1111's ✨ on a result)
                gallery = gr.Gallery(label="Images", columns=2, height="auto", object_fit="contain", preview=False,
                                     buttons=["download", "fullscreen", use_seed, use_image, use_hires],
                                     elem_id="gallery")
                summary = gr.Markdown("Four images per run. Click an image to see it large; ♻️ takes its seed.",
                                      elem_id="summary")
            with gr.Column(min_width=0, elem_id="more"):
                # Examples fill the prompt in the browser: no server event, nothing to call.
                examples = gr.Dataset(components=[prompt], samples=[[e] for e in EXAMPLES], label="Examples",
                                      type="index", elem_id="examples")
                with gr.Accordion("Paste parameters", open=False, elem_id="paste-box"):
                    pasted = gr.Textbox(label="Parameters from AUTOMATIC1111's PNG Info or an image's metadata",
                                        lines=3, max_lines=8, placeholder="a cat\nNegative prompt: blurry\n"
                                        "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 1024x1024",
                                        elem_id="paste")
                    # A1111's PNG Info: an image's own parameters (ours, A1111's, ComfyUI's, Fooocus', ...).
                    png_info_image = gr.Image(label="PNG Info: drop an image to read its parameters", type="filepath",
                                              sources=["upload", "clipboard"], height=140, elem_id="png-info")
                    use_pasted = gr.Button("Fill the form", size="sm", elem_id="use-paste")
                    paste_notes = gr.Markdown("", elem_id="paste-notes")
                history = gr.BrowserState([], storage_key="sdxl-tpu-history")
                kept_run = gr.BrowserState({}, storage_key="sdxl-tpu-last-run")  # (shown again after a reload)
                history_table = gr.Dataset(components=[gr.HTML(visible=False)] +
                                           [gr.Textbox(visible=False) for _ in HISTORY_HEADERS[1:]],
                                           headers=HISTORY_HEADERS, samples=[], type="index", layout="table",
                                           samples_per_page=HISTORY_PER_PAGE, elem_id="history",
                                           label="History (kept in this browser; click a run to restore it, seed "
                                                 "included)")
        # The form's inputs, found by their element ids, which are the fields' names (spec/fields.py):
        # every event takes them in the form's order.
        inputs = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None) in FORM}
        form = [inputs[name] for name in FORM]
        for f in FIELDS:  # (the API page's example call: realistic values, not Gradio's "Hello!!")
            if (example := f.default if f.example is None else f.example) is not None:
                inputs[f.name].example_inputs = lambda value=example: value
        # Images are written once (parameters embedded) into Gradio's cache folder, where the gallery
        # serves them without a copy; the store deletes old ones and Gradio forgets them too.
        server.images.on_delete(lambda paths: forget_served(gallery, paths))
        # Per page: the seeds the gallery shows, the image picked in it, the run's state (page.RUN_STATES)
        # and where it is ({seeds, step, steps}); the files it shows (kept on the server, never sent).
        last_seeds, picked, run_state, run_at = gr.State([]), gr.State(None), gr.State("idle"), gr.State({})
        last_images = gr.State([])

        def run_updates(values, progress, previews: bool, route: str):
            # The request stops (waiting or between denoising steps) once Gradio no longer runs
            # its event: Stop, the page closed, the client cancelled or went away.
            queue, event_id = QueueView(demo), QueueView.current_event_id()
            event = queue.running_event(event_id)
            for update in server.stream(values, queued_at=event.enqueue_time if event is not None else None,
                                        abandoned=(lambda: queue.running_event(event_id) is None) if event_id else None,
                                        previews=previews, route=route):
                if isinstance(update, Progress) and progress is not None:
                    progress((update.step, update.steps), desc="Denoising", unit="steps")
                yield update

        # What the page's run updates, by name (server/page_run.py names what changes; the rest is
        # skipped). (Which buttons can be pressed follows the panel's state: the page script sets them.)
        shown = dict(gallery=gallery, last_seeds=last_seeds, picked=picked, summary=summary, panel=panel, run=run,
                     run_state=run_state, run_at=run_at, history=history, history_table=history_table,
                     kept_run=kept_run, last_images=last_images)

        def show(changed: dict[str, Any]) -> tuple:
            if "history_rows" in changed:
                changed = {**changed, "history_table": gr.Dataset(samples=changed["history_rows"])}
            return tuple(changed.get(name, gr.skip()) for name in shown)

        def generate_in_page(values, history, progress):
            values = page_values(values)
            for changed in page_run(run_updates(values, None, previews=True, route="page"), values, history):
                yield show(changed)

        def generate(values, progress):
            """Four images from one prompt, made together in one call of the compiled pipeline; the
            step count advances in the job's status as they denoise. Seed -1 draws a random seed (the
            four images take it and the next three); sampler, schedule and rng may be left out (the
            server's own). A value the server cannot use is refused with a message naming the field."""
            # (run to its end: counted)
            *_, done = run_updates(values, progress, previews=False, route="/generate")
            return done.gallery, done.summary

        # As many requests run at once as one pipeline call can serve (more than one on hosts with
        # more chips than a request has images); the rest wait in Gradio's bounded queue. The page
        # and the API are two events of one queue; the page's also updates the form and the history.
        queued = dict(inputs=form, preprocess=False, concurrency_id="generate", concurrency_limit=server.concurrency)
        light = dict(api_visibility="private", concurrency_limit=None, show_progress="hidden", preprocess=False)
        outputs = list(shown.values())
        # One way to start a run, the button (the page script presses it for Enter and Ctrl+Enter, and
        # shows the run waiting at once).
        in_page = gradio_handler(form_handler(generate_in_page, "history"), "the page's /generate",
                                 lambda message: show(refused(message)))
        generating = run.click(in_page, **{**queued, "inputs": [*form, history]}, outputs=outputs,
                               api_name="generate_in_page", api_visibility="private", show_progress_on=[panel])
        # A request the server did not take (its queue full, shutting down) never reaches the handler
        # and fails, as does a stopped one (the page script marks the page when Stop is pressed,
        # before Gradio cancels the event): in the browser, as the queue may have no room for more.
        generating.failure(None, inputs=[panel], outputs=[panel],
                           js=f"(now) => document.body.dataset.runStopped === 'yes' ? now : "
                              f"{json.dumps(run_panel('refused', '⚠️ ' + NOT_TAKEN))}")
        api_trigger = gr.Button(visible=False)  # the API's event has no button in the page
        returns = ("Returns:\n    The four images (captions 'seed N'; each file carries its parameters as A1111 "
                   "writes them) and a line that sums up the run: what ran, how long each stage took, the seeds.")
        api_trigger.click(gradio_handler(form_handler(generate, returns=returns), "/generate"),
                          outputs=[gallery, summary], api_name="generate", show_progress_on=[panel], **queued)

        # Stop: Gradio cancels the event; the request ends within two denoising steps; the page says
        # what was stopped, keeps its previews, and forgets nothing else.
        stop.click(None, outputs=[panel], js=f"() => {json.dumps(run_panel('stopped', 'Stopped.'))}",
                   cancels=[generating]).then(lambda state, at: show(stopped(state, at)), inputs=[run_state, run_at],
                                              outputs=outputs, **light)

        # Seeds as A1111 has them: 🎲 is -1 (random), ♻️ takes the picked image's seed (else the first).
        def reuse_seed(seeds: list[int], index: Any):
            chosen = picked_item(seeds, index if isinstance(index, int) else 0)
            return chosen if chosen is not None else gr.skip()

        for button in (reuse, use_seed):
            button.click(reuse_seed, inputs=[last_seeds, picked], outputs=[seed], **light)

        # 🖼️ (A1111's "Send to img2img"): the picked image (else the first) starts the next run.
        def use_as_image(paths: list[str], index: Any):
            path = picked_item(paths, index if isinstance(index, int) else 0)
            if not isinstance(path, str) or not server.images.holds([path]):
                return gr.skip(), gr.skip(), gr.skip()
            size_now = size_for_image({"path": path}, server.uploads, server.warmup.ready_sizes)
            return path, gr.Accordion(open=True), size_now or gr.skip()

        use_image.click(use_as_image, inputs=[last_images, picked], outputs=[image, image_panel, size], **light)

        # ✨ (A1111's upscale of a result): that image's own settings and seed, hires fix on, run at once.
        hires_into = [*(inputs[name] for name in PASTED_INTO), inputs["hires"], inputs["hires_scale"]]

        def hires_from_result(paths: list[str], index: Any, scale: Any):
            path = picked_item(paths, index if isinstance(index, int) else 0)
            if not isinstance(path, str) or not server.images.holds([path]):
                return *(gr.skip() for _ in hires_into), gr.skip(), False
            form, note = hires_of(path, server.warmup.ready_sizes, server.offer.samplers, scale)
            return *(form.get(c.elem_id, gr.skip()) for c in hires_into), note, bool(form)

        hires_ready = gr.Checkbox(False, visible="hidden")  # (in the browser: the click below reads it)
        use_hires.click(hires_from_result, inputs=[last_images, picked, inputs["hires_scale"]],
                        outputs=[*hires_into, form_note, hires_ready], **light).then(
            None, inputs=[hires_ready], js="(ready) => { if (ready) document.querySelector('#generate').click(); }")
        def pick(evt: gr.SelectData):
            return evt.index

        gallery.select(pick, outputs=[picked], **light)  # (a click only enlarges the image)
        seed.change(seed_note, inputs=[seed, form_note], outputs=[form_note], **light)

        # In the browser, no server event: presets fill the fields, the preset menu follows the
        # fields, examples fill the prompt, a history row fills the form.
        preset.input(None, inputs=[preset, steps, sampler, schedule, guidance],
                     outputs=[steps, sampler, schedule, guidance],
                     js=PRESET_FILL_JS.replace("PRESETS", json.dumps(presets)))
        for field in (steps, sampler, schedule, guidance):
            field.change(None, inputs=[steps, sampler, schedule, guidance, offered], outputs=[preset],
                         js=MATCHING_PRESET_JS.replace("PRESETS", json.dumps(presets)).replace('"CUSTOM"',
                                                                                                json.dumps(CUSTOM)))

        def fit_schedule(sampler_name, schedule_name):  # (only the schedule types the sampler runs on)
            menu, kept = fitted_schedule(sampler_name, schedule_name, server.offer.samplers, server.offer.schedules)
            return gr.Dropdown(choices=menu, value=kept)

        sampler.change(fit_schedule, inputs=[sampler, schedule], outputs=[schedule], **light)
        # An image dropped in proposes the compiled size nearest its aspect ratio (the resize mode
        # fits it there); the person may choose another.
        def propose_size(value):
            return size_for_image(value, server.uploads, server.warmup.ready_sizes) or gr.skip()

        image.upload(propose_size, inputs=[image], outputs=[size], **light)

        # The image (dropped in, or a result's 🖼️) is what the painter paints over; what is painted
        # becomes the mask (a PNG the server writes and keeps as one of the page's uploads).
        def paint_over(value):
            path = value.get("path") if isinstance(value, dict) else None
            return {"background": path, "layers": [], "composite": None} if server.uploads.holds(path) or (
                isinstance(path, str) and server.images.holds([path])) else None

        def mask_painted(value):
            painted = painted_mask(value, server.uploads)
            return None if painted is None else server.uploads.add(painted, get_upload_folder())

        image.change(paint_over, inputs=[image], outputs=[painter], **light)
        painter.change(mask_painted, inputs=[painter], outputs=[mask], **light)

        # Outpainting: the image fitted inside the size (Resize and fill), the bands around it masked.
        def mask_new_area(value, size_now):
            made, note = new_area(value, size_now, server.uploads)
            if made is None:
                return gr.skip(), gr.skip(), note
            return server.uploads.add(made, get_upload_folder()), "Resize and fill", note

        outpaint.click(mask_new_area, inputs=[image, size], outputs=[mask, inputs["resize_mode"], form_note], **light)

        def read_png_info(value):
            text, note = png_info_note(value, server.uploads)
            return (gr.skip() if text is None else text), note

        png_info_image.upload(read_png_info, inputs=[png_info_image], outputs=[pasted, paste_notes], **light)
        examples.click(None, inputs=[examples], outputs=[prompt], js=f"(i) => {json.dumps(EXAMPLES)}[i]")
        history_table.click(None, inputs=[history_table, history, *form], outputs=form, js=RESTORE_HISTORY_JS)
        prompt.change(server.token_count, inputs=[prompt, style], outputs=[tokens], **light)
        pasted_into = [inputs[name] for name in PASTED_INTO]

        def fill_from_pasted(text):
            filled, notes = pasted_form(text, server.offer.sizes, server.offer.samplers)
            if not filled:
                log_refusal("paste parameters", notes)
            return *[filled.get(name, gr.skip()) for name in PASTED_INTO], notes

        gr.on([use_pasted.click, pasted.submit], gradio_handler(fill_from_pasted, "paste parameters"), inputs=[pasted],
              outputs=[*pasted_into, paste_notes], api_name="paste_parameters", **light)
        # A1111's "read generation parameters from the prompt" button: a parameters text pasted
        # into the prompt box fills the form, prompt included.
        read_prompt.click(gradio_handler(fill_from_pasted, "paste parameters"), inputs=[prompt],
                          outputs=[*pasted_into, form_note], **light)
        style.change(lambda prompt, style: (style_description(style), server.token_count(prompt, style)),
                     inputs=[prompt, style], outputs=[style_info, tokens], api_name="style_description", **light)

        # While warming up (and while sizes compile) the page says so and refreshes; a front end's
        # page always does (its back ends come and go).
        refreshing = lambda: not server.warmup.compiled_event.is_set() or server.engine.watch_seconds is not None

        def model_menus(seen: str, prompt_text: Any, style_name: Any, sampler_name: Any):
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
            menu = schedule_menu(now.get("sampler", sampler_name), offer.samplers, offer.schedules)
            return (json.dumps(names), gr.Dropdown(choices=menu_samplers(offer.samplers), **value("sampler")),
                    gr.Dropdown(choices=menu, **value("schedule")),
                    gr.Dropdown(choices=list(offer.rngs), **value("rng")),
                    gr.Dropdown(choices=[*names, CUSTOM], **value("preset")),
                    now.get("steps", gr.skip()), now.get("guidance", gr.skip()),
                    server.token_count(prompt_text, style_name), now_offered)

        def refresh(seen: str, prompt_text: Any, style_name: Any, state: Any, sampler_name: Any = None):
            sizes = size_choices(server.warmup.ready_sizes)
            first = not seen and server.warmup.described and sizes  # (the model's first size, as at a reload)
            button = (gr.skip() if state == "running"  # (a run's button is the run's)
                      else gr.Button(GENERATE if server.ready else WARMING_UP, interactive=server.ready))
            return (server.warmup.status_line, gr.Timer(active=refreshing()), button,
                    gr.Dropdown(sizes, **({"value": sizes[0][1]} if first else {})),
                    *model_menus(seen, prompt_text, style_name, sampler_name))

        seen_offer = gr.State("")  # the offer this page's menus show ("": not described yet)
        # (`offered` first: the preset menu's match, run when steps or guidance change, reads it)
        refreshed = [status, timer := gr.Timer(2.0, active=refreshing()), run, size, offered, sampler, schedule, rng,
                     preset, steps, guidance, tokens, seen_offer]
        timer.tick(refresh, inputs=[seen_offer, prompt, style, run_state, sampler], outputs=refreshed, **light)
        # After a reload, the last run's images while the server still keeps their files (it checks
        # the paths the browser sends against the files it wrote).
        def restore_last_run(kept: Any):
            restored = restored_run(kept, server.images.holds)
            if restored is None:
                return (gr.skip(),) * 4
            return *restored, [path for path, _ in restored[0]]

        demo.load(restore_last_run, inputs=[kept_run], outputs=[gallery, last_seeds, summary, last_images], **light)
        demo.load(lambda seen, p, s, sa, h: (*refresh(seen, p, s, "idle", sa), gr.Dataset(samples=history_rows(h))),
                  inputs=[seen_offer, prompt, style, sampler, history], outputs=[*refreshed, history_table], **light)
    demo.queue(default_concurrency_limit=1, max_size=server.settings.queue_size, api_open=False)
    return demo


def preset_names(server: Server) -> list[str]:
    """The presets the preset menu offers (the model's; a front end: its back ends')."""
    return list(server.offer.presets)


def preset_info(server: Server) -> str:
    return "; ".join(f"{r.name}: {r.summary}" for r in server.presets)


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
        from sdxl_tpu.server.local_engine import prepare_process

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


if __name__ == "__main__":
    sys.exit(main())
