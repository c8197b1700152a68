"""The playground's layout: its Gradio components in the order a person reads them (the form, the
results, then examples, pasted parameters and the history), each field's widget with its label,
limits and default from request/fields.py; then the Extras tab (page_extras.py). What they do when
used is page_events.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..request.fields import FIELD, FIELDS, FORM
from ..request.styles import STYLES
from ..server.core import Server
from ..server.form import EXAMPLES
from .in_browser import in_browser, offered_now
from .history import HISTORY_HEADERS, HISTORY_PER_PAGE
from .page import CUSTOM, RNG_INFO, SCHEDULE_INFO, form_defaults, run_panel, size_choices, style_description
from .page_extras import Extras, lay_out_extras
from .page_run import GENERATE
from .page_xyz import AXIS_LABELS, SCRIPTS, SWITCHES
from .sampler_menu import menu_samplers, schedule_menu

WARMING_UP = "Warming up…"


@dataclass(frozen=True)
class Page:
    """The components the page's events read or update, by what they are."""
    status: gr.Markdown
    prompt: gr.Textbox
    tokens: gr.Markdown
    run: gr.Button
    stop: gr.Button
    read_prompt: gr.Button
    form_note: gr.Markdown
    size: gr.Dropdown
    preset: gr.Dropdown
    sampler: gr.Dropdown
    schedule: gr.Dropdown
    steps: gr.Slider
    guidance: gr.Slider
    seed: gr.Number
    reuse: gr.Button
    image_panel: gr.Accordion
    image: gr.Image
    painter: gr.ImageEditor
    mask: gr.Image
    outpaint: gr.Button
    control_panel: gr.Accordion
    refiner_panel: gr.Accordion
    control_preview: gr.Image
    style: gr.Dropdown
    style_info: gr.Markdown
    rng: gr.Dropdown
    offered: gr.Textbox
    script: gr.Dropdown
    plot_panel: gr.Column
    plot: list[Any]  # the Script menu, then the X/Y/Z plot panel's inputs (page_xyz.PANEL's order)
    panel: gr.HTML
    use_seed: gr.Button
    use_image: gr.Button
    use_hires: gr.Button
    use_extras: gr.Button
    gallery: gr.Gallery
    summary: gr.Markdown
    examples: gr.Dataset
    pasted: gr.Textbox
    png_info_image: gr.Image
    use_pasted: gr.Button
    paste_notes: gr.Markdown
    history: gr.BrowserState
    kept_run: gr.BrowserState
    history_table: gr.Dataset
    inputs: dict[str, Any]  # the form's fields' widgets, by field name (their element ids)
    form: list[Any]  # the same in the form's order (request/fields.py's FORM): every run takes them so
    tabs: gr.Tabs  # the page's tabs: the form and its results, then Extras
    extras: Extras  # the Extras tab's components


def field_slider(name: str, step: float, **options: Any) -> gr.Slider:
    """A number field's slider: its range, default (unless `options` give the value), label and
    element id from the fields' list."""
    f = FIELD[name]
    low, high = f.bounds
    return gr.Slider(low, high, step=step, label=f.label, elem_id=name, **{"value": f.default, **options})


def field_radio(name: str, **options: Any) -> gr.Radio:
    """A choice field's radio buttons: its names, default, label and element id from the fields' list."""
    f = FIELD[name]
    return gr.Radio(list(f.names), value=f.default, label=f.label, elem_id=name, **options)


def lay_out(demo: gr.Blocks, server: Server) -> Page:
    """The page's components, made inside `demo`. The page is built before the model is loaded (or
    a front end's back ends answer): its menus and defaults are refreshed from what the model offers
    once it does (page_events.py's `model_menus`)."""
    offer, ready = server.offer, server.ready
    start = form_defaults(offer)
    label = lambda name: FIELD[name].label
    with gr.Row(elem_id="top"):
        gr.Markdown("# Stable Diffusion XL, served from JAX", elem_id="title")
        status = gr.Markdown(server.warmup.status_line, elem_id="status")
    # A1111's tabs: the form with its results (txt2img and img2img in one), then Extras.
    with gr.Tabs(elem_id="tabs") as tabs, gr.Tab("Generate", id="generate", elem_id="generate-tab"), \
            gr.Row(equal_height=False, elem_id="layout"):
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
                steps = field_slider("steps", 1, value=start["steps"])
                guidance = field_slider("guidance", 0.1, value=start["guidance"])
            with gr.Row(elem_id="seed-row"):
                seed = gr.Number(label=f"{label('seed')} (-1: random)", value=-1, precision=0,
                                 minimum=FIELD["seed"].bounds[0], maximum=FIELD["seed"].bounds[1], scale=4,
                                 elem_id="seed")
                gr.Button("🎲", scale=0, min_width=44, elem_id="random-seed").click(
                    None, outputs=[seed], js=in_browser("randomSeed", {}))
                reuse = gr.Button("♻️", scale=0, min_width=44, elem_id="reuse-seed")
                # (A1111's Batch count: calls in one run; beside the seed, the form's height as it was)
                gr.Number(FIELD["batch_count"].default, label=label("batch_count"), precision=0, minimum=1,
                          maximum=FIELD["batch_count"].bounds[1], scale=2, min_width=100, elem_id="batch_count")
            # img2img, as A1111's tab has it: the image (dropped, pasted or from the webcam), how far
            # from it, how it fits the size. Uploads are read only for a run (server/uploads.py).
            with gr.Accordion("Start from an image", open=False, elem_id="image-panel") as image_panel:
                image = gr.Image(label=label("image"), type="filepath", sources=["upload", "clipboard", "webcam"],
                                 height=220, elem_id="image")
                with gr.Row():
                    field_slider("strength", 0.01, min_width=220)
                    field_radio("resize_mode", min_width=220)
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
                        field_slider("mask_blur", 1)
                        field_radio("masked_content")
                outpaint = gr.Button("⬚ Mask the new area (outpaint with Resize and fill)", size="sm",
                                     elem_id="outpaint")
                with gr.Row():  # A1111's "Only masked": the mask's region redrawn at the size, pasted back
                    field_radio("inpaint_area", min_width=220)
                    field_slider("mask_padding", 4, min_width=220)
            # A1111's Hires. fix: the images made at the size, upscaled, and denoised again at a larger
            # compiled size (the upscale must reach one: the status says which).
            with gr.Accordion("Hires. fix", open=False, elem_id="hires-panel"):
                gr.Checkbox(FIELD["hires"].default, label=label("hires"), elem_id="hires")
                with gr.Row():
                    field_slider("hires_scale", 0.05, min_width=160)
                    field_slider("hires_steps", 1, min_width=160)
                    field_slider("hires_strength", 0.01, min_width=160)
                field_radio("hires_upscaler")
            # A1111's Refiner: the last steps on the server's refiner. Shown where one is loaded.
            with gr.Accordion("Refiner", open=False, visible=bool(offer.refiner), elem_id="refiner-panel"
                              ) as refiner_panel, gr.Row():
                gr.Checkbox(FIELD["refiner"].default, label=label("refiner"), min_width=120, elem_id="refiner")
                field_slider("refiner_switch_at", 0.01, min_width=220)
            # sd-webui-controlnet's unit: an image, its preprocessor (and what it makes of the image at
            # the size), the ControlNet, how strongly and over which steps. Shown where one is loaded.
            with gr.Accordion("ControlNet", open=False, visible=bool(offer.controlnets),
                              elem_id="control-panel") as control_panel:
                with gr.Row():
                    gr.Image(label=label("control_image"), type="filepath", sources=["upload", "clipboard"],
                             height=200, min_width=160, elem_id="control_image")
                    control_preview = gr.Image(label="Preprocessor preview", interactive=False, height=200,
                                               min_width=160, elem_id="control-preview")
                with gr.Row():
                    gr.Dropdown(list(offer.controlnets), value=next(iter(offer.controlnets), None),
                                label=label("control_model"), min_width=220, elem_id="control_model")
                    field_radio("control_module", min_width=220)
                with gr.Row():
                    field_slider("control_weight", 0.05, min_width=140)
                    field_slider("control_start", 0.01, min_width=140)
                    field_slider("control_end", 0.01, min_width=140)
                with gr.Row():
                    field_slider("control_low", 1, min_width=160)
                    field_slider("control_high", 1, min_width=160)
            # A1111's Script menu; its X/Y/Z plot's panel (page_xyz.py): three axes, each a type and its
            # values as A1111 writes them (side by side on a desktop, one under the other on a phone),
            # and how the grid is shown.
            script = gr.Dropdown(list(SCRIPTS), value=SCRIPTS[0], label="Script", elem_id="script")
            with gr.Column(visible=False, elem_id="xyz-panel") as plot_panel:
                plot: list[Any] = [script]
                for n in "xyz":
                    with gr.Row(equal_height=True):
                        plot.append(gr.Dropdown(list(AXIS_LABELS), value=AXIS_LABELS[0], label=f"{n.upper()} type",
                                                scale=2, min_width=170, elem_id=f"xyz-{n}-type"))
                        plot.append(gr.Textbox(label=f"{n.upper()} values", max_lines=3, scale=3, min_width=200,
                                               elem_id=f"xyz-{n}-values"))
                with gr.Row():
                    for name, (text, default) in SWITCHES.items():
                        plot.append(gr.Checkbox(default, label=text, min_width=160,
                                                elem_id="xyz-" + name.replace("_", "-")))
            # A1111's seed: -1 draws new seeds each run; the API's Randomize switch stays off here.
            gr.Checkbox(FIELD["randomize"].default, label=label("randomize"), visible=False, elem_id="randomize")
            with gr.Accordion("More options", open=False, elem_id="more-options"):
                style = gr.Dropdown(list(STYLES), value=FIELD["style"].default, label=label("style"),
                                    elem_id="style")
                style_info = gr.Markdown(style_description(FIELD["style"].default), elem_id="style-info")
                rng = gr.Dropdown(list(offer.rngs), value=start["rng"], label=label("rng"), elem_id="rng",
                                  info=RNG_INFO)
                field_radio("dynamic_prompts", info="{red|blue}, {2$$a|b|c}, {0.5::a|b} and wildcards in the "
                            "prompt: Random draws each image's own from its seed, Combinatorial makes the "
                            "combinations in order.")
                gr.Markdown(wildcards_note(server), elem_id="wildcards-note")
                gr.Markdown(f"{SCHEDULE_INFO} Presets: {preset_info(server)}", elem_id="menu-notes")
                offered = gr.Textbox(offered_now(preset_names(server), offer.samplers, offer.schedules),
                                     visible="hidden")
        with gr.Column(min_width=0, elem_id="results"):
            panel = gr.HTML(run_panel("idle"), elem_id="progress")
            use_seed = gr.Button("♻️ Use this seed", size="sm", elem_id="use-seed")
            use_image = gr.Button("🖼️ Use as image", size="sm", elem_id="use-image")  # (A1111's Send to img2img)
            use_hires = gr.Button("✨ Hires fix", size="sm", elem_id="use-hires")  # (A1111's ✨ on a result)
            use_extras = gr.Button("📐 Send to Extras", size="sm", elem_id="use-extras")  # (A1111's 📐)
            gallery = gr.Gallery(label="Images", columns=2, height="auto", object_fit="contain", preview=False,
                                 buttons=["download", "fullscreen", use_seed, use_image, use_hires, use_extras],
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
    extras = lay_out_extras(tabs, server)
    # The form's inputs, found by their element ids, which are the fields' names (request/fields.py):
    # every event takes them in the form's order.
    inputs: dict[str, Any] = {}
    for block in demo.blocks.values():
        if isinstance(elem_id := getattr(block, "elem_id", None), str) and elem_id in FORM:
            inputs[elem_id] = block
    form = [inputs[name] for name in FORM]
    for f in FIELDS:  # (the API page's example call: realistic values, not Gradio's "Hello!!")
        if (example := f.default if f.example is None else f.example) is not None:
            inputs[f.name].example_inputs = lambda value=example: value
    return Page(status=status, prompt=prompt, tokens=tokens, run=run, stop=stop, read_prompt=read_prompt,
                form_note=form_note, size=size, preset=preset, sampler=sampler, schedule=schedule, steps=steps,
                guidance=guidance, seed=seed, reuse=reuse, image_panel=image_panel, image=image, painter=painter,
                mask=mask, outpaint=outpaint, control_panel=control_panel, refiner_panel=refiner_panel,
                control_preview=control_preview, style=style, style_info=style_info, rng=rng, offered=offered,
                script=script, plot_panel=plot_panel, plot=plot, panel=panel, use_seed=use_seed, use_image=use_image,
                use_hires=use_hires, use_extras=use_extras, tabs=tabs, extras=extras,
                gallery=gallery, summary=summary, examples=examples, pasted=pasted, png_info_image=png_info_image,
                use_pasted=use_pasted, paste_notes=paste_notes, history=history, kept_run=kept_run,
                history_table=history_table, inputs=inputs, form=form)


def preset_names(server: Server) -> list[str]:
    """The presets the preset menu offers (the model's; a front end: its back ends')."""
    return list(server.offer.presets)


def wildcards_note(server: Server, shown: int = 12) -> str:
    """The wildcards a prompt can name here (markdown)."""
    if server.wildcards is None:
        return "Wildcards: the back end's."
    names = server.wildcards.names()
    listed = ", ".join(f"\\_\\_{name}\\_\\_" for name in names[:shown])  # (escaped: not bold)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"Wildcards: {listed}{more}." if names else "No wildcards here (the server's --wildcards folder)."


def preset_info(server: Server) -> str:
    return "; ".join(f"{r.name}: {r.summary}" for r in server.presets)
