"""AUTOMATIC1111's Extras tab (single image) on the page: an image dropped in (or a result sent
there with 📐) upscaled by Lanczos or one of the server's upscaler models (`--upscalers`) by the
Resize factor, shown with its size and downloadable as a PNG. The upscale is the
`/sdapi/v1/extra-single-image` route's own (routes/extras.py's `extras_upscale`): the same checks,
the same pixels, the same file. A refusal (no image, a file that is no image, one too large, a factor
out of range, an upscaler not offered) is said under the button; the last result stays."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..imaging.hires import SCALE_RANGE
from ..request.errors import RequestError
from ..routes.extras import extras_upscale, upscaler_names
from ..server.core import Server
from ..server.errors import user_message
from ..server.form import picked_item

EXTRAS_TAB = "extras"  # the tab's id (gr.Tabs(selected=...))
DEFAULT_UPSCALER, DEFAULT_SCALE = "Lanczos", 2.0
# The page's names of the request fields it sets (refusals name them so).
LABELS = {"upscaler_1": "Upscaler", "upscaling_resize": "Resize"}
NO_IMAGE = "Drop an image in first: Extras upscales one image."
READY = "Drop an image in, pick an upscaler and a factor, then Upscale."


@dataclass(frozen=True)
class Extras:
    """The Extras tab's components."""
    tab: gr.Tab
    image: gr.Image
    upscaler: gr.Dropdown
    scale: gr.Slider
    run: gr.Button
    note: gr.Markdown
    output: gr.Image


def lay_out_extras(tabs: gr.Tabs, server: Server) -> Extras:
    """The Extras tab, added to the page's `tabs` (after the tab the page's layout made): the image
    and the settings on the left, the result under its size on the right (stacked on a phone)."""
    with tabs, gr.Tab("Extras", id=EXTRAS_TAB, elem_id="extras-tab") as tab, gr.Row(equal_height=False,
                                                                                    elem_id="extras"):
        with gr.Column(min_width=300, elem_id="extras-form"):
            image = gr.Image(label="Source image", type="filepath", sources=["upload", "clipboard"], height=300,
                             alt_text="The image to upscale", elem_id="extras-image")
            with gr.Row():
                upscaler = gr.Dropdown(list(upscaler_names(server.offer.upscalers)), value=DEFAULT_UPSCALER,
                                       label=LABELS["upscaler_1"], min_width=200, elem_id="extras-upscaler")
                scale = gr.Slider(*SCALE_RANGE, step=0.05, value=DEFAULT_SCALE, label=LABELS["upscaling_resize"],
                                  min_width=200, elem_id="extras-scale")
            run = gr.Button("Upscale", variant="primary", elem_id="extras-run")
            note = gr.Markdown(READY, elem_id="extras-note")
        with gr.Column(min_width=300, elem_id="extras-results"):
            output = gr.Image(label="Upscaled image", type="filepath", format="png", interactive=False, height=420,
                              buttons=["download", "fullscreen"], alt_text="The upscaled image",
                              elem_id="extras-output")
    return Extras(tab=tab, image=image, upscaler=upscaler, scale=scale, run=run, note=note, output=output)


def extras_run(server: Server, value: Any, upscaler: Any, scale: Any) -> tuple[str, str]:
    """The tab's upscale of the image a client sent (`value`: the upload's file object, or one of
    this server's images) by `scale` with `upscaler` (any JSON, checked): the file of the upscaled
    PNG (in the server's image store, which serves it) and a line saying its size. RequestError
    names what is wrong."""
    if value is None:
        raise RequestError(NO_IMAGE)
    if server.uploads is None:
        raise RequestError("This server takes no images.")
    file = server.uploads.read(value, "Image")
    made = extras_upscale(server, file, {"upscaler_1": upscaler, "upscaling_resize": scale}, LABELS)
    path = server.images.write([made.png], [0], "png", name="extras")[0]
    return path, (f"**{made.size[0]} × {made.size[1]}** (from {made.source[0]} × {made.source[1]}) · "
                  f"{made.info}")


def extras_answer(server: Server, value: Any, upscaler: Any, scale: Any) -> tuple[Any, str]:
    """What Upscale shows: the upscaled image and its size (extras_run's), or, where it cannot be
    made, the last result kept and a line saying what is wrong (never a traceback: a bug is logged)."""
    try:
        return extras_run(server, value, upscaler, scale)
    except Exception as e:  # noqa: BLE001 (every failure is said)
        return gr.skip(), f"⚠️ {user_message(e, 'the Extras tab')}"


def extras_menu(server: Server) -> gr.Dropdown:
    """The Upscaler menu as the server offers it now (its models are known once the model is loaded;
    a front end's: its back ends'), as the hires fix's menu lists them."""
    return gr.Dropdown(choices=list(upscaler_names(server.offer.upscalers)))


def wire_extras(page: Any, server: Server, light: Mapping[str, Any], last_images: gr.State,
                picked: gr.State) -> None:
    """The tab's events: Upscale (in Gradio's queue), 📐 on a result (A1111's "Send to extras"), and
    the menu brought up to date when the tab is opened. (`page`: page_layout's Page, which imports
    this module; the gallery's files and the picked image: page_events' states.)"""
    extras: Extras = page.extras

    def upscale(value, upscaler, scale):
        return extras_answer(server, value, upscaler, scale)

    # In Gradio's queue (bounded, its place said), one at a time: a model upscale runs on the device
    # through the engine, which holds the pipeline's lock, so it waits for the generation call it
    # meets and never runs beside one (as the API's route does); Lanczos runs on the CPU.
    extras.run.click(upscale, inputs=[extras.image, extras.upscaler, extras.scale],
                     outputs=[extras.output, extras.note], api_name="extras_upscale", api_visibility="private",
                     concurrency_id="extras", concurrency_limit=1, preprocess=False,
                     show_progress_on=[extras.output])

    def send_to_extras(paths: Any, index: Any):
        path = picked_item(paths, index if isinstance(index, int) else 0)
        if not isinstance(path, str) or not server.images.holds([path]):
            return gr.skip(), gr.skip(), gr.skip()
        return path, gr.Tabs(selected=EXTRAS_TAB), extras_menu(server)

    page.use_extras.click(send_to_extras, inputs=[last_images, picked],
                          outputs=[extras.image, page.tabs, extras.upscaler], **light)
    extras.tab.select(lambda: extras_menu(server), outputs=[extras.upscaler], **light)


__all__ = ["EXTRAS_TAB", "Extras", "extras_answer", "extras_menu", "extras_run", "lay_out_extras", "wire_extras"]
