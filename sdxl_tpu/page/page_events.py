"""What the playground's components do: a run (the page's and the API's /generate, one queue),
Stop, the seed, image and ✨ buttons on a result, presets, the painter and outpainting, PNG Info and
pasted parameters, and the refresh while the model warms up (the Extras tab's events: page_extras.py).
The components are page_layout.py's."""

from __future__ import annotations

import json
from typing import Any, Literal, TypedDict

import gradio as gr
from gradio.utils import get_upload_folder

from ..imaging.hires import UPSCALERS as HIRES_UPSCALERS
from ..request.recipes import RECIPES
from ..server.core import Server
from ..server.errors import log_refusal
from ..server.events import Done, Progress
from ..server.uploads import Uploads
from ..server.form import picked_item
from .handlers import form_handler, gradio_handler
from .in_browser import browser_config, in_browser, offered_now
from .history import history_rows, restored_run
from ..routes.internals import QueueView, forget_served
from .page import (CUSTOM, PASTED_INTO, control_preview, form_defaults, hires_of, new_area, painted_mask,
                   pasted_form, png_info_note, preset_fields, seed_note, size_choices, size_for_image,
                   style_description)
from .page_layout import WARMING_UP, Page, preset_names
from .page_run import GENERATE, page_run, page_values, refused, stopped
from .page_extras import wire_extras
from .page_xyz import PANEL, page_plot, wire_panel
from .sampler_menu import menu_samplers, schedule_menu

class Queued(TypedDict):
    """What a run's events share (Gradio's listeners' keywords, each with its own type)."""
    inputs: list[Any]
    preprocess: bool
    concurrency_id: str
    concurrency_limit: int | None | Literal["default"]


class Light(TypedDict, total=False):
    """What the page's small events share: not in the API, no progress shown, no queue limit."""
    api_visibility: Literal["public", "private", "undocumented"]
    concurrency_limit: int | None | Literal["default"]
    concurrency_id: str
    show_progress: Literal["full", "minimal", "hidden"]
    preprocess: bool


def wire(demo: gr.Blocks, page: Page, server: Server) -> None:
    """The page's events, added inside `demo`."""
    # (the menu offers some presets; choosing one fills the form in the browser, web/in_browser.js)
    browser = browser_config(preset_fields(RECIPES.values()))
    # Images are written once (parameters embedded) into Gradio's cache folder, where the gallery
    # serves them without a copy; the store deletes old ones and Gradio forgets them too.
    server.images.on_delete(lambda paths: forget_served(page.gallery, paths))
    # Per page: the seeds the gallery shows, the image picked in it, the run's state (page.py's RUN_STATES)
    # and where it is ({seeds, step, steps}); the files it shows (kept on the server, never sent).
    last_seeds, picked, run_state, run_at = gr.State([]), gr.State(None), gr.State("idle"), gr.State({})
    last_images = gr.State([])

    def uploads() -> Uploads:  # (the playground gives the server its uploads once the page is built)
        if server.uploads is None:
            raise RuntimeError("the page's server has no uploads")
        return server.uploads

    def run_updates(values, progress, previews: bool, route: str, plan=None):
        # The request stops (waiting or between denoising steps) once Gradio no longer runs
        # its event: Stop, the page closed, the client cancelled or went away.
        queue, event_id = QueueView(demo), QueueView.current_event_id()
        event = queue.running_event(event_id)
        for update in server.stream(values, queued_at=event.enqueue_time if event is not None else None,
                                    abandoned=(lambda: queue.running_event(event_id) is None) if event_id else None,
                                    previews=previews, route=route, plan=plan):
            if isinstance(update, Progress) and progress is not None:
                progress((update.step, update.steps), desc="Denoising", unit="steps")
            yield update

    # What the page's run updates, by name (page/page_run.py names what changes; the rest is
    # skipped). (Which buttons can be pressed follows the panel's state: the page script sets them.)
    shown = dict(gallery=page.gallery, last_seeds=last_seeds, picked=picked, summary=page.summary, panel=page.panel,
                 run=page.run, run_state=run_state, run_at=run_at, history=page.history,
                 history_table=page.history_table, kept_run=page.kept_run, last_images=last_images)

    def show(changed: dict[str, Any]) -> tuple:
        if "history_rows" in changed:
            changed = {**changed, "history_table": gr.Dataset(samples=changed["history_rows"])}
        return tuple(changed.get(name, gr.skip()) for name in shown)

    def generate_in_page(values, history, *panel_and_progress):  # (the Script menu's X/Y/Z plot: page_xyz.py)
        values, plot = page_values(values), page_plot(server, panel_and_progress[:-1])
        updates = run_updates(values, None, previews=True, route="page", plan=plot and plot.requests)
        for changed in page_run(plot.updates(updates) if plot else updates, values, history, keep_run=not plot):
            yield show(changed)

    def generate(values, progress):
        """Four images from one prompt, made together in one call of the compiled pipeline; the
        step count advances in the job's status as they denoise. Seed -1 draws a random seed (the
        four images take it and the next three); sampler, schedule and rng may be left out (the
        server's own). A value the server cannot use is refused with a message naming the field."""
        # (run to its end: counted)
        *_, done = run_updates(values, progress, previews=False, route="/generate")
        if not isinstance(done, Done):  # (a run that fails raises; one that ends ends with its images)
            raise RuntimeError(f"the run ended with {type(done).__name__}, not its images")
        return done.gallery, done.summary

    # As many requests run at once as one pipeline call can serve (more than one on hosts with
    # more chips than a request has images); the rest wait in Gradio's bounded queue. The page
    # and the API are two events of one queue; the page's also updates the form and the history.
    queued = Queued(inputs=page.form, preprocess=False, concurrency_id="generate",
                    concurrency_limit=server.concurrency)
    light = Light(api_visibility="private", concurrency_limit=None, show_progress="hidden", preprocess=False)
    outputs = list(shown.values())
    # One way to start a run, the button (the page script presses it for Enter and Ctrl+Enter, and
    # shows the run waiting at once).
    in_page = gradio_handler(form_handler(generate_in_page, "history", *PANEL), "the page's /generate",
                             lambda message: show(refused(message)))
    generating = page.run.click(in_page, **Queued(queued, inputs=[*page.form, page.history, *page.plot]),
                                outputs=outputs, api_name="generate_in_page", api_visibility="private",
                                show_progress_on=[page.panel])
    # A request the server did not take (its queue full, shutting down) never reaches the handler
    # and fails, as does a stopped one (the page script marks the page when Stop is pressed,
    # before Gradio cancels the event): in the browser, as the queue may have no room for more.
    generating.failure(None, inputs=[page.panel], outputs=[page.panel], js=in_browser("failedRun", browser))
    api_trigger = gr.Button(visible=False)  # the API's event has no button in the page
    returns = ("Returns:\n    The four images (captions 'seed N'; each file carries its parameters as A1111 "
               "writes them) and a line that sums up the run: what ran, how long each stage took, the seeds.")
    api_trigger.click(gradio_handler(form_handler(generate, returns=returns), "/generate"),
                      outputs=[page.gallery, page.summary], api_name="generate", show_progress_on=[page.panel],
                      **queued)

    # Stop: Gradio cancels the event; the request ends within two denoising steps; the page says
    # what was stopped, keeps its previews, and forgets nothing else.
    page.stop.click(None, inputs=[page.panel], outputs=[page.panel], js=in_browser("stoppedRun", browser),
                    cancels=[generating]).then(lambda state, at: show(stopped(state, at)), inputs=[run_state, run_at],
                                               outputs=outputs, **light)

    # Seeds as A1111 has them: 🎲 is -1 (random), ♻️ takes the picked image's seed (else the first).
    def reuse_seed(seeds: list[int], index: Any):
        chosen = picked_item(seeds, index if isinstance(index, int) else 0)
        return chosen if chosen is not None else gr.skip()

    for button in (page.reuse, page.use_seed):
        button.click(reuse_seed, inputs=[last_seeds, picked], outputs=[page.seed], **light)

    # 🖼️ (A1111's "Send to img2img"): the picked image (else the first) starts the next run.
    def use_as_image(paths: list[str], index: Any):
        path = picked_item(paths, index if isinstance(index, int) else 0)
        if not isinstance(path, str) or not server.images.holds([path]):
            return gr.skip(), gr.skip(), gr.skip()
        size_now = size_for_image({"path": path}, server.uploads, server.warmup.ready_sizes)
        return path, gr.Accordion(open=True), size_now or gr.skip()

    page.use_image.click(use_as_image, inputs=[last_images, picked], outputs=[page.image, page.image_panel, page.size],
                         **light)

    # ✨ (A1111's upscale of a result): that image's own settings and seed, hires fix on, run at once.
    hires_into = [*(page.inputs[name] for name in PASTED_INTO), page.inputs["hires"], page.inputs["hires_scale"]]

    def hires_from_result(paths: list[str], index: Any, scale: Any):
        path = picked_item(paths, index if isinstance(index, int) else 0)
        if not isinstance(path, str) or not server.images.holds([path]):
            return *(gr.skip() for _ in hires_into), gr.skip(), False
        form, note = hires_of(path, server.warmup.ready_sizes, server.offer.samplers, scale, server.offer.upscalers)
        return *(form.get(c.elem_id, gr.skip()) for c in hires_into), note, bool(form)

    hires_ready = gr.Checkbox(False, visible="hidden")  # (in the browser: the click below reads it)
    page.use_hires.click(hires_from_result, inputs=[last_images, picked, page.inputs["hires_scale"]],
                         outputs=[*hires_into, page.form_note, hires_ready], **light).then(
        None, inputs=[hires_ready], js=in_browser("generateIf", browser))

    def pick(evt: gr.SelectData):
        return evt.index

    page.gallery.select(pick, outputs=[picked], **light)  # (a click only enlarges the image)
    page.seed.change(seed_note, inputs=[page.seed, page.form_note], outputs=[page.form_note], **light)
    wire_panel(page, server, light)
    wire_extras(page, server, light, last_images, picked)  # (the Extras tab; 📐 on a result sends it there)

    # In the browser, no server event: presets fill the fields, the preset menu follows the
    # fields, examples fill the prompt, a history row fills the form.
    page.preset.input(None, inputs=[page.preset, page.steps, page.sampler, page.schedule, page.guidance],
                      outputs=[page.steps, page.sampler, page.schedule, page.guidance],
                      js=in_browser("presetFill", browser))
    for field in (page.steps, page.sampler, page.schedule, page.guidance):
        field.change(None, inputs=[page.steps, page.sampler, page.schedule, page.guidance, page.offered],
                     outputs=[page.preset],
                     js=in_browser("matchingPreset", browser))

    # The Schedule type menu follows the sampler in the browser (fitted_schedule's twin): a server
    # event's answer could land after a later change (a history row restoring sampler and schedule)
    # and undo it.
    page.sampler.change(None, inputs=[page.sampler, page.schedule, page.offered], outputs=[page.schedule],
                        js=in_browser("fitSchedule", browser))

    # An image dropped in proposes the compiled size nearest its aspect ratio (the resize mode
    # fits it there); the person may choose another.
    def propose_size(value):
        return size_for_image(value, server.uploads, server.warmup.ready_sizes) or gr.skip()

    page.image.upload(propose_size, inputs=[page.image], outputs=[page.size], **light)

    # The image (dropped in, or a result's 🖼️) is what the painter paints over; what is painted
    # becomes the mask (a PNG the server writes and keeps as one of the page's uploads).
    def paint_over(value):
        path = value.get("path") if isinstance(value, dict) else None
        return {"background": path, "layers": [], "composite": None} if uploads().holds(path) or (
            isinstance(path, str) and server.images.holds([path])) else None

    def mask_painted(value):
        painted = painted_mask(value, server.uploads)
        return None if painted is None else uploads().add(painted, get_upload_folder())

    page.image.change(paint_over, inputs=[page.image], outputs=[page.painter], **light)
    page.painter.change(mask_painted, inputs=[page.painter], outputs=[page.mask], **light)

    # Outpainting: the image fitted inside the size (Resize and fill), the bands around it masked.
    def mask_new_area(value, size_now):
        made, note = new_area(value, size_now, server.uploads)
        if made is None:
            return gr.skip(), gr.skip(), note
        return uploads().add(made, get_upload_folder()), "Resize and fill", note

    page.outpaint.click(mask_new_area, inputs=[page.image, page.size],
                        outputs=[page.mask, page.inputs["resize_mode"], page.form_note], **light)

    # The ControlNet image as the ControlNet will see it: at the size, through the preprocessor.
    # (An IP-Adapter's image: what its image encoder sees.)
    controls = [page.inputs[name] for name in ("control_image", "control_module", "control_low", "control_high",
                                               "control_model")]

    def show_control(value, module, low, high, model, size_now):  # (kept as one of the page's uploads, as a mask is)
        made = control_preview(value, module, low, high, size_now, server.uploads, model in server.offer.ip_adapters)
        return None if made is None else uploads().add(made, get_upload_folder())

    for source, event in ((controls[0], "change"), (controls[1], "change"), (controls[2], "release"),
                          (controls[3], "release"), (controls[4], "change"), (page.size, "change")):
        getattr(source, event)(show_control, inputs=[*controls, page.size], outputs=[page.control_preview], **light)

    def read_png_info(value):
        text, note = png_info_note(value, server.uploads)
        return (gr.skip() if text is None else text), note

    page.png_info_image.upload(read_png_info, inputs=[page.png_info_image], outputs=[page.pasted, page.paste_notes],
                               **light)
    page.examples.click(None, inputs=[page.examples], outputs=[page.prompt], js=in_browser("example", browser))
    page.history_table.click(None, inputs=[page.history_table, page.history, *page.form], outputs=page.form,
                             js=in_browser("restoreHistory", browser))
    page.prompt.change(server.token_count, inputs=[page.prompt, page.style], outputs=[page.tokens], **light)
    pasted_into = [page.inputs[name] for name in PASTED_INTO]

    def fill_from_pasted(text):
        filled, notes = pasted_form(text, server.offer.sizes, server.offer.samplers, server.offer.upscalers)
        if not filled:
            log_refusal("paste parameters", notes)
        return *[filled.get(name, gr.skip()) for name in PASTED_INTO], notes

    gr.on([page.use_pasted.click, page.pasted.submit], gradio_handler(fill_from_pasted, "paste parameters"),
          inputs=[page.pasted], outputs=[*pasted_into, page.paste_notes], api_name="paste_parameters", **light)
    # A1111's "read generation parameters from the prompt" button: a parameters text pasted
    # into the prompt box fills the form, prompt included.
    page.read_prompt.click(gradio_handler(fill_from_pasted, "paste parameters"), inputs=[page.prompt],
                      outputs=[*pasted_into, page.form_note], **light)
    page.style.change(lambda prompt, style: (style_description(style), server.token_count(prompt, style)),
                      inputs=[page.prompt, page.style], outputs=[page.style_info, page.tokens],
                      api_name="style_description", **light)

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
        now_offered = json.dumps([offer.samplers, offer.schedules, offer.rngs, names, offer.controlnets,
                                  offer.embeddings, offer.upscalers, offer.refiner, server.engine.tokenizer is not None]
                                 ) if server.warmup.described else ""
        if now_offered == seen or not now_offered:
            return *[gr.skip()] * 13,
        now = {} if seen else form_defaults(offer)
        value = lambda key: {"value": now[key]} if now else {}
        menu = schedule_menu(now.get("sampler", sampler_name), offer.samplers, offer.schedules)
        return (offered_now(names, offer.samplers, offer.schedules),
                gr.Dropdown(choices=menu_samplers(offer.samplers), **value("sampler")),
                gr.Dropdown(choices=menu, **value("schedule")),
                gr.Dropdown(choices=list(offer.rngs), **value("rng")),
                gr.Dropdown(choices=[*names, CUSTOM], **value("preset")),
                now.get("steps", gr.skip()), now.get("guidance", gr.skip()),
                server.token_count(prompt_text, style_name), gr.Accordion(visible=bool(offer.controlnets)),
                gr.Dropdown(choices=list(offer.controlnets), value=next(iter(offer.controlnets), None)),
                gr.Radio(choices=[*HIRES_UPSCALERS, *offer.upscalers]), gr.Accordion(visible=bool(offer.refiner)),
                now_offered)

    def refresh(seen: str, prompt_text: Any, style_name: Any, state: Any, sampler_name: Any = None):
        sizes = size_choices(server.warmup.ready_sizes)
        first = not seen and server.warmup.described and sizes  # (the model's first size, as at a reload)
        button = (gr.skip() if state == "running"  # (a run's button is the run's)
                  else gr.Button(GENERATE if server.ready else WARMING_UP, interactive=server.ready))
        return (server.warmup.status_line, gr.Timer(active=refreshing()), button,
                gr.Dropdown(sizes, value=sizes[0][1]) if first else gr.Dropdown(sizes),
                *model_menus(seen, prompt_text, style_name, sampler_name))

    seen_offer = gr.State("")  # the offer this page's menus show ("": not described yet)
    # (`offered` first: the preset menu's match, run when steps or guidance change, reads it)
    refreshed = [page.status, timer := gr.Timer(2.0, active=refreshing()), page.run, page.size, page.offered,
                 page.sampler, page.schedule, page.rng, page.preset, page.steps, page.guidance, page.tokens,
                 page.control_panel, page.inputs["control_model"], page.inputs["hires_upscaler"], page.refiner_panel,
                 seen_offer]
    timer.tick(refresh, inputs=[seen_offer, page.prompt, page.style, run_state, page.sampler], outputs=refreshed,
               **light)
    # After a reload, the last run's images while the server still keeps their files (it checks
    # the paths the browser sends against the files it wrote).
    def restore_last_run(kept: Any):
        restored = restored_run(kept, server.images.holds)
        if restored is None:
            return (gr.skip(),) * 4
        return *restored, [path for path, _ in restored[0]]

    demo.load(restore_last_run, inputs=[page.kept_run], outputs=[page.gallery, last_seeds, page.summary, last_images],
              **light)
    demo.load(lambda seen, p, s, sa, h: (*refresh(seen, p, s, "idle", sa), gr.Dataset(samples=history_rows(h))),
              inputs=[seen_offer, page.prompt, page.style, page.sampler, page.history],
              outputs=[*refreshed, page.history_table], **light)
