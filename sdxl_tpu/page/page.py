"""What the playground page shows besides its widgets: size labels, a style's description, which
preset the form matches, a pasted parameters text, the run panel (the history: history.py). Pure
functions of what a client sent (any JSON value), so the page's events stay wiring and every rule here is
tested without a browser."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..request.errors import RequestError
from ..request.fields import BY_API, FIELD, FIELDS, PASTED, restoring
from ..imaging.clip_image import image_prompt as clip_image_prompt
from ..imaging.control_image import control_image
from ..imaging.image_input import decode_image
from ..request.control import DEFAULT_RESIZE
from ..a1111.images import read_parameters
from ..imaging.hires import scales_to
from ..a1111.infotext import parse, request_fields
from ..a1111.png_info import png_info
from ..request.names import DEFAULT_SCHEDULE
from ..request.recipes import RECIPES
from ..imaging.resize import nearest_size, new_area_mask
from ..request.styles import style_entry
from ..request.values import format_size, number_input, parse_size
from ..server.errors import log_refusal
from ..server.offer import Offer
from .sampler_menu import menu_pair

CUSTOM = "Custom"  # the preset menu's entry when the form matches no preset
SCHEDULE_INFO = "Checkpoint: the model's own scheduler, as diffusers runs it; the others are A1111's."
RNG_INFO = ("Where the noise comes from: JAX (fast, on the chips), or CPU: PyTorch's CPU noise, as A1111 (RNG CPU) "
            "and ComfyUI draw it.")
_COMMON_RATIOS = {(1, 1), (5, 4), (4, 3), (3, 2), (16, 9), (2, 1), (21, 9)}


def style_description(style: Any) -> str:
    """Markdown shown under the style menu: the template and what it adds to the negative prompt."""
    try:
        template, negative = style_entry(style)
    except RequestError as e:
        log_refusal("style description", e)
        return str(e)
    adds = f"  \n**Adds to the negative prompt:** `{negative}`" if negative else ""
    return f"**Prompt template:** `{template}`" + adds


def aspect_ratio(size: tuple[int, int]) -> str:
    """'1:1', '9:7', '12:5', or the nearest common ratio ('≈ 3:2') when the exact one has large terms."""
    w, h = size
    g = math.gcd(w, h)
    a, b = w // g, h // g
    if max(a, b) <= 16:
        return f"{a}:{b}"
    wide = max(w, h) / min(w, h)
    near = min(_COMMON_RATIOS, key=lambda r: abs(r[0] / r[1] - wide))
    return f"≈ {near[0]}:{near[1]}" if w >= h else f"≈ {near[1]}:{near[0]}"


def size_label(size: tuple[int, int]) -> str:
    """How the size menu shows a size: '1:1 square · 1024 × 1024', '12:5 landscape · 1536 × 640'."""
    w, h = size
    shape = "square" if w == h else "landscape" if w > h else "portrait"
    return f"{aspect_ratio(size)} {shape} · {w} × {h}"


def size_choices(sizes: Sequence[tuple[int, int]]) -> list[tuple[str, str]]:
    """(label, value) pairs for the size menu; the value is what a request sends ('1024x1024')."""
    return [(size_label(s), format_size(s)) for s in sizes]


def size_for_image(value: Any, uploads: Any, sizes: Sequence[tuple[int, int]]) -> str | None:
    """The compiled size nearest an uploaded image's aspect ratio (as the page proposes it on
    upload, where A1111 asks for one), or None where the value is no readable upload."""
    if uploads is None or not sizes:
        return None
    try:
        image = decode_image(uploads.read(value))
    except RequestError:
        return None
    return format_size(nearest_size(image.size, sizes))


def new_area(value: Any, size: Any, uploads: Any) -> tuple[Any, str]:
    """Outpainting on the page: the mask of what Resize and fill adds around the dropped image at
    `size` (an "L" image of that size, white on the new area; None where there is none) and a note."""
    from PIL import Image

    try:
        image_size, target = decode_image(uploads.read(value)).size, parse_size(size)
    except (RequestError, ValueError, AttributeError):
        return None, "Outpainting starts from an image: drop one in first."
    mask = new_area_mask(image_size, target)
    if not mask.any():
        return None, (f"The image already has {format_size(target)}'s shape: Resize and fill adds nothing around "
                      "it. Choose a size of another shape to outpaint.")
    return Image.fromarray(mask, "L"), (f"The mask covers what Resize and fill adds around the image at "
                                        f"{format_size(target)}: Generate paints it.")


NOTHING_FOUND = ("No generation parameters found in this image (read: AUTOMATIC1111's, Forge's, ComfyUI's, "
                 "Fooocus', InvokeAI's, NovelAI's and ours).")


def control_preview(value: Any, module: Any, low: Any, high: Any, size: Any, uploads: Any,
                    image_prompt: bool = False) -> Any:
    """What the ControlNet will see of the page's ControlNet image (`value`, an upload) at `size`, as
    an RGB image: fitted as a unit's default (Crop and resize), through the preprocessor; with an
    IP-Adapter (`image_prompt`), the image encoder's centre crop; None where it cannot be made yet
    (no image, a value out of range: the run says what is wrong)."""
    from PIL import Image

    if uploads is None or value is None:
        return None
    try:
        low, high = (int(number_input(v, "Canny threshold", 1, 255, whole=True)) for v in (low, high))
        data = uploads.read(value, "ControlNet image")
        return Image.fromarray(clip_image_prompt(data, "ControlNet image") if image_prompt else control_image(
            data, parse_size(size), module, resize_mode=DEFAULT_RESIZE, low=low, high=high))
    except (RequestError, ValueError, TypeError):
        return None


def painted_mask(value: Any, uploads: Any) -> Any:
    """The mask painted in the page's editor (`value`: its file objects: background and layers),
    white where any layer has paint, as an "L" image of the background's size; None where nothing
    is painted or the files are no uploads."""
    from PIL import Image

    if uploads is None or not isinstance(value, dict) or not isinstance(value.get("layers"), list):
        return None
    painted = None
    try:
        for layer in value["layers"][:8]:  # (the editor has one; a client may send more)
            with Image.open(io.BytesIO(uploads.read(layer, "Mask"))) as image:
                alpha = np.asarray(image.convert("RGBA").getchannel("A")) > 0
            painted = alpha if painted is None or painted.shape != alpha.shape else painted | alpha
    except (RequestError, OSError, ValueError):
        return None
    if painted is None or not painted.any():
        return None
    return Image.fromarray(painted.astype(np.uint8) * 255, "L")


def png_info_note(value: Any, uploads: Any) -> tuple[str | None, str]:
    """PNG Info for an image dropped in (`value`: the upload's file object): the parameters text
    it carries (None: none) and a note for the person."""
    if uploads is None:
        return None, "This server takes no images."
    try:
        found = png_info(uploads.read(value, "PNG Info"), "PNG Info")
    except RequestError as e:
        return None, f"⚠️ {e}"
    if found.text is None:
        return None, NOTHING_FOUND
    return found.text, f"Read {found.source}: **Fill the form** uses them."


def matching_preset(presets: Mapping[str, Sequence[Any]], steps: Any, sampler: Any, guidance: Any) -> str:
    """The preset whose (steps, sampler, guidance) the form holds, else CUSTOM."""
    for name, (p_steps, p_sampler, p_guidance) in presets.items():
        if steps == p_steps and sampler == p_sampler and isinstance(guidance, (int, float)) and \
                abs(guidance - p_guidance) < 1e-6:
            return name
    return CUSTOM


def preset_fields(recipes: Iterable[Any]) -> dict[str, list[Any]]:
    """{preset name: [steps, sampler, guidance]}: what choosing a preset puts in the form."""
    return {r.name: [r.steps, r.sampler, r.guidance] for r in recipes}


def form_defaults(offer: Offer) -> dict[str, Any]:
    """The form's starting values from what the server offers (see Offer.defaults) and the preset
    menu's entry for them."""
    start = offer.defaults()
    presets = preset_fields(RECIPES[name] for name in offer.presets)
    sampler, schedule = menu_pair(start["sampler"], start["schedule"])
    return dict(start, sampler=sampler, schedule=schedule,
                preset=matching_preset(presets, start["steps"], start["sampler"], start["guidance"]))


# What "Fill the form" sets from a pasted parameters text, in the form's order.
PASTED_INTO = tuple(f.name for f in FIELDS if PASTED in f.kept or f.restored is not None)


def pasted_form(text: Any, sizes: Sequence[tuple[int, int]], samplers: Sequence[str],
                upscalers: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """A pasted A1111 parameters text -> the form fields it fills (by name; its seed turns
    Randomize off) and a line of Markdown saying what was filled and what was not used."""
    try:
        fields, notes = request_fields(parse(text), list(sizes), list(samplers), upscalers)
    except RequestError as e:
        return {}, f"⚠️ {e}"
    if not fields["prompt"] and not fields["negative_prompt"] and not set(fields) - {"prompt", "negative_prompt",
                                                                                     "schedule", "rng"}:
        return {}, ("⚠️ Nothing to use: paste a parameters text (the prompt, \"Negative prompt: ...\", then "
                    "\"Steps: ..., Seed: ...\").")
    form = restoring({BY_API[api].name: value for api, value in fields.items() if PASTED in BY_API[api].kept})
    if "size" in form:
        form["size"] = format_size(form["size"])
    if "sampler" in form:  # (as the menus show them)
        given = form.get("schedule", DEFAULT_SCHEDULE)
        form["sampler"], schedule = menu_pair(form["sampler"], given)
        if "schedule" in form or schedule != given:
            form["schedule"] = schedule
    filled = ", ".join(name for name in PASTED_INTO if name in form and FIELD[name].restored is None)
    return form, " ".join([f"Filled: {filled}."] + notes)


def hires_of(path: str, sizes: Sequence[tuple[int, int]], samplers: Sequence[str],
             scale: Any, upscalers: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """A result's ✨ Hires fix (A1111's): the form filled from the parameters of the image at `path`
    (one this server wrote), with the hires fix on at `scale` (or, where that reaches no compiled
    size, the first that does), and a note; or no fields and a note saying why it cannot run here."""
    from PIL import Image

    with Image.open(path) as made:
        form, note = pasted_form(read_parameters(made), sizes, samplers, upscalers)
    if "size" not in form:
        return {}, note if note.startswith("⚠️") else "⚠️ That image's size is not offered here."
    reach = scales_to(parse_size(form["size"]), sizes)
    if not reach:
        return {}, (f"⚠️ No larger size than {form['size']} is offered here, so no hires fix of it (a server "
                    "compiles the sizes it offers: --sizes).")
    chosen = scale if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale in reach else reach[0]
    return {**form, "hires": True, "hires_scale": chosen}, f"✨ Hires fix of seed {form.get('seed')}, {chosen:g}x."


# -- the run panel: one state at a time, in words, with a bar while it runs ---------------------

RUN_STATES = ("idle", "queued", "running", "stopped", "done", "refused")


def run_panel(state: str, text: str = "", step: int = 0, steps: int = 0) -> str:
    """The HTML above the gallery that says where the run is (RUN_STATES): a line of plain text
    and, while it runs, a bar of the steps done. Text is escaped (a message may quote what a client
    sent); the page script reads `data-state` (the queue's position goes into `.run-text`)."""
    import html

    bar = (f'<progress max="{steps}" value="{step}" aria-label="Denoising steps done"></progress>'
           if state == "running" and steps else "")
    return (f'<div class="run-panel" data-state="{state}"><span class="run-text">{html.escape(text)}</span>'
            f"{bar}</div>")


def running_text(step: int, steps: int, seconds: float, call: int = 1, calls: int = 1) -> str:
    """'Generating · step 7 of 20 · 3.1 s · about 4 s left' (the estimate once two steps have run:
    the first also encodes the prompts); in a run of several calls, which ('call 2 of 4 · ')."""
    text = f"Generating · {f'call {call} of {calls} · ' if calls > 1 else ''}step {step} of {steps} · {seconds:.1f} s"
    if step >= 2 and step < steps:
        left = seconds / step * (steps - step)
        text += f" · about {max(1, round(left))} s left"
    return text


def stopped_summary(seeds: Any, steps: Any, step: Any) -> str:
    """The line under the gallery after Stop: what was stopped, and its seeds (not the last run's)."""
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        return "Stopped before it started: nothing was made."
    where = (f"at step {step} of {steps}" if isinstance(step, int) and isinstance(steps, int) and step > 0
             else "before the first step")
    shown = " The images are its last previews." if isinstance(step, int) and step > 0 else ""
    return f"Stopped {where}.{shown} Seeds: {', '.join(str(s) for s in seeds)}."


def seed_note(seed: Any, note: Any = "") -> str:
    """The lines under Generate: the one saying the seed is fixed, when it is (A1111's -1 means a new
    random seed each run), after what else is there (`note`: what the prompt box's parameters
    filled, which the seed they set must not wipe), without a stale seed line."""
    note = note[:2000] if isinstance(note, str) and not any(0xD800 <= ord(c) <= 0xDFFF for c in note) else ""
    stale = lambda line: line.startswith("Seed ") and " is fixed: " in line
    lines = [line for line in note.split("  \n") if line.strip() and not stale(line)]
    if not (isinstance(seed, bool) or not isinstance(seed, (int, float)) or not 0 <= seed <= FIELD["seed"].bounds[1]
            or seed != int(seed)):  # (what the seed field refuses is said when it runs)
        lines.append(f"Seed {int(seed)} is fixed: each run makes the same images. 🎲 for random seeds.")
    return "  \n".join(lines)
