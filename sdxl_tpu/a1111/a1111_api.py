"""AUTOMATIC1111's web API (/sdapi/v1) in this project's terms, JAX- and HTTP-free: a txt2img or
img2img body as its clients send it (webuiapi, painting plug-ins, chat front ends: every field
with its default) -> the form's fields by API name and the image count; what ran -> the `info`
A1111 answers with. A field this server cannot honour is refused (RequestError naming it) only
where its value would change the image; what changes nothing here (saving, grids) is taken.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..request.errors import RequestError
from .controlnet_units import HASHED, controlnet_args
from ..request.fields import DEFAULT_SWITCH_AT, MAX_SEED
from .infotext import SCHEDULE_NAMES
from .xyz_plot import SCRIPT_NAME
from ..imaging.mask import INPAINT_AREAS, MASKED_CONTENT
from ..request.names import PROMPT_MODES, RESIZE_MODES, SCHEDULES
from ..request.request import ImageInfo
from ..request.styles import STYLES
from ..request.values import json_type, shown

# A1111's scheduler names as /schedulers lists them ("checkpoint" is ours: the model's own schedule);
# they are read as infotext.SCHEDULE_NAMES reads a Schedule type.
SCHEDULER_NAMES = {name.lower().replace(" ", "_"): name for name in SCHEDULES}
# Its integer codes: img2img's resize_mode (3, "Just resize (latent upscale)", is not offered) and
# inpainting_fill, in A1111's order.
RESIZE_CODES = dict(enumerate(RESIZE_MODES))
FILL_CODES = dict(enumerate(MASKED_CONTENT))
MAX_IMAGES = 64  # batch_size * n_iter of one request

# Fields whose value changes the image and that only their default (or an equivalent) can have
# here: field -> (the values taken, why not others).
ONLY_DEFAULT: dict[str, tuple[tuple, str]] = {
    "restore_faces": ((False, None), "face restoration is not offered"),
    "tiling": ((False, None), "tiling is not offered"),
    "subseed_strength": ((0, None), "variation seeds are not offered"),
    "seed_resize_from_h": ((0, -1, None), "seed resizing is not offered"),
    "seed_resize_from_w": ((0, -1, None), "seed resizing is not offered"),
    "eta": ((None, 1, 0), "the samplers run with A1111's default eta"),
    "s_churn": ((0, None), "sampler churn is not offered"),
    "s_tmin": ((0, None), "sampler churn is not offered"),
    "s_tmax": ((0, None), "sampler churn is not offered"),
    "s_noise": ((1, None), "the samplers add their noise unscaled"),
    "s_min_uncond": ((0, None), "negative guidance minimum sigma is not offered"),
    "hr_checkpoint_name": ((None, "", "Use same checkpoint"), "the hires pass runs the loaded model"),
    "hr_sampler_name": ((None, "", "Use same sampler"), "the hires pass runs the first pass's sampler"),
    "hr_scheduler": ((None, "", "Use same scheduler"), "the hires pass runs the first pass's schedule"),
    "hr_prompt": ((None, ""), "the hires pass takes the first pass's prompt"),
    "hr_negative_prompt": ((None, ""), "the hires pass takes the first pass's negative prompt"),
    "hr_resize_x": ((0, None), "give hr_scale: the upscaled size must be a compiled one"),
    "hr_resize_y": ((0, None), "give hr_scale: the upscaled size must be a compiled one"),
    "firstphase_width": ((0, None), "give width and height"),
    "firstphase_height": ((0, None), "give width and height"),
    "firstpass_image": ((None, ""), "a given first pass is not offered"),
    "inpainting_mask_invert": ((0, False, None), "send the mask inverted (white repaints)"),
    "initial_noise_multiplier": ((1, None), "the initial noise is not scaled"),
    "latent_mask": ((None, ""), "a separate latent mask is not offered"),
}
# override_settings this server honours (checked below), or that change nothing in the image.
SETTINGS_TAKEN = {"sd_model_checkpoint", "randn_source", "samples_format", "CLIP_stop_at_last_layers",
                  "eta_noise_seed_delta", "sd_vae", "save_images", "samples_save", "grid_save", "jpeg_quality",
                  "webp_lossless", "enable_pnginfo", "live_previews_enable", "show_progress_every_n_steps",
                  "outdir_samples", "outdir_txt2img_samples", "outdir_img2img_samples", "save_to_dirs",
                  "do_not_show_images", "export_for_4chan", "img2img_fix_steps"}
FORMATS = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg", "webp": "webp"}


def _json(value: Any) -> str:
    """A value as its JSON, cut short: how a client wrote it."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _default(data: Mapping[str, Any], name: str, taken: tuple, why: str) -> None:
    value = data.get(name)
    if value is not None and not any(value == t and isinstance(value, bool) == isinstance(t, bool)
                                     for t in taken if t is not None):
        raise RequestError(f"{name} {_json(value)} cannot be honoured here: {why}.")


def script_named(data: Mapping[str, Any]) -> str | None:
    """The script a body runs (script_name): None, or the X/Y/Z plot (the one script offered here)."""
    name, args = data.get("script_name"), data.get("script_args")
    if name in (None, ""):
        if args not in (None, []):
            raise RequestError("script_args come with a script_name (the one offered: x/y/z plot).")
        return None
    if not isinstance(name, str) or name.strip().lower() != SCRIPT_NAME:
        raise RequestError(f"script_name {_json(name)} is not offered; scripts: {SCRIPT_NAME}.")
    return SCRIPT_NAME


def dynamic_prompts_script(scripts: Any) -> tuple[Any, str | None]:
    """sd-dynamic-prompts' entry of `alwayson_scripts` ("Dynamic Prompts v2.17.1": {"args":
    [enabled, combinatorial, ...]}, its other settings as it defaults them) as the Dynamic prompts
    field's value (None: not given, the default), and the other scripts."""
    if not isinstance(scripts, Mapping):
        return scripts, None
    names = [name for name in scripts if str(name).lower().startswith("dynamic prompts")]
    if not names:
        return scripts, None
    entry = scripts[names[0]]
    args = entry.get("args") if isinstance(entry, Mapping) else None
    if not isinstance(args, list) or not all(isinstance(a, bool) for a in args[:2]):
        raise RequestError(f"alwayson_scripts {shown(names[0])} takes args [enabled, combinatorial, ...] "
                           "(true or false each).")
    enabled, combinatorial = args[0] if args else True, len(args) > 1 and args[1]  # (its defaults where left out)
    mode = PROMPT_MODES[0] if not enabled else PROMPT_MODES[2] if combinatorial else PROMPT_MODES[1]
    return {k: v for k, v in scripts.items() if k not in names}, mode


def generation_fields(data: Any, img2img: bool, model: str, refiner: str | None = None
                      ) -> tuple[dict[str, Any], int, str]:
    """A /sdapi/v1/txt2img or img2img body -> (the form's fields by API name, the images to make,
    their file format). Left out or null: A1111's defaults where they differ from ours (steps 50 is
    the client's business: it sends its own), the server's otherwise. `refiner`: the server's, if any."""
    if not isinstance(data, dict):
        raise RequestError(f"The request body must be a JSON object, got {json_type(data)}.")
    for name, (taken, why) in ONLY_DEFAULT.items():
        _default(data, name, taken, why)
    fields: dict[str, Any] = {"prompt": data.get("prompt", ""), "negative_prompt": data.get("negative_prompt", "")}
    for ours, theirs in (("seed", "seed"), ("steps", "steps"), ("guidance_scale", "cfg_scale")):
        if data.get(theirs) is not None:
            if isinstance(data[theirs], (list, dict)):  # (one number: the lists our own API takes are not A1111's)
                raise RequestError(f"{theirs} must be a number, got {json_type(data[theirs])}.")
            fields[ours] = data[theirs]
    if isinstance(fields.get("seed"), (int, float)) and not isinstance(fields["seed"], bool) and fields["seed"] < -1:
        raise RequestError(f"seed must be -1 (random) or from 0 to {MAX_SEED}, got {_json(fields['seed'])}.")
    width, height = data.get("width", 512), data.get("height", 512)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (width, height)):
        raise RequestError(f"width and height must be whole numbers, got {_json(width)} and {_json(height)}.")
    fields["size"] = f"{width}x{height}"
    # Left out, null or empty: the default (as A1111's clients send it); anything else is checked.
    given = lambda name: data.get(name) not in (None, "")
    sampler = next((data[name] for name in ("sampler_name", "sampler_index") if given(name)), None)
    if sampler is not None:
        fields["sampler"] = sampler
    scheduler = data.get("scheduler")
    if given("scheduler"):  # (read as a parameters text's Schedule type is)
        if not isinstance(scheduler, str) or scheduler.strip().lower() not in SCHEDULE_NAMES:
            raise RequestError(f"scheduler {_json(scheduler)} is not offered; schedulers: "
                               f"{', '.join(SCHEDULER_NAMES)}.")
        fields["schedule"] = SCHEDULE_NAMES[scheduler.strip().lower()]
    styles = data["styles"] if given("styles") else []
    if not isinstance(styles, list) or len(styles) > 1 or any(not isinstance(s, str) or s not in STYLES
                                                               for s in styles):
        raise RequestError(f"styles {_json(styles)}: at most one of this server's styles ({', '.join(STYLES)}).")
    fields["style"] = styles[0] if styles else None
    fields.update(_settings(data.get("override_settings"), model))
    scripts, fields["dynamic_prompts"] = dynamic_prompts_script(data.get("alwayson_scripts"))
    units = controlnet_args(scripts)  # (sd-webui-controlnet's; no other extension)
    if units is not None:
        fields["controlnet"] = units
    image_format = FORMATS.get(str(fields.pop("samples_format", "png")).lower())
    if image_format is None:
        raise RequestError("override_settings samples_format must be png, jpg or webp.")
    if given("infotext"):  # (A1111 1.9's: a parameters text that fills what the body leaves out)
        fields["parameters"] = data["infotext"]
    for name in ("enable_hr", "send_images"):
        if data.get(name) is not None and not isinstance(data[name], bool):
            raise RequestError(f"{name} must be true or false, got {_json(data[name])}.")
    if given("refiner_checkpoint"):  # (A1111's: its name, "name [hash]" or a file's; refiner_switch_at default 0.8)
        asked = HASHED.sub(r"\1", str(data["refiner_checkpoint"])).rsplit(".safetensors", 1)[0]
        if refiner is None or asked.lower() != refiner.lower():
            raise RequestError(f"Refiner {_json(data['refiner_checkpoint'])} is not loaded here; "
                               + ("this server has no refiner." if refiner is None else f"its refiner is {refiner}."))
        fields["refiner_switch_at"] = data.get("refiner_switch_at", DEFAULT_SWITCH_AT)
    count = _count(data)
    if img2img:
        fields.update(_img2img(data))
    elif data.get("enable_hr"):
        fields.update(hires=True, hires_scale=data.get("hr_scale", 2.0), hires_upscaler=data.get("hr_upscaler"),
                      hires_steps=data.get("hr_second_pass_steps", 0),
                      hires_strength=data.get("denoising_strength"))
    return fields, count, image_format


def _count(data: Mapping[str, Any]) -> int:
    batch, n_iter = data.get("batch_size", 1), data.get("n_iter", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (batch, n_iter)) or (
            batch * n_iter > MAX_IMAGES):
        raise RequestError(f"batch_size and n_iter must be whole numbers from 1, at most {MAX_IMAGES} images in all; "
                           f"got {_json(batch)} and {_json(n_iter)}.")
    return batch * n_iter


def _settings(settings: Any, model: str) -> dict[str, Any]:
    """override_settings -> fields: the noise source, the file format; another checkpoint refused by name."""
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise RequestError(f"override_settings must be an object, got {json_type(settings)}.")
    unknown = sorted(set(settings) - SETTINGS_TAKEN)
    if unknown:
        raise RequestError(f"override_settings {', '.join(map(shown, unknown[:5]))} cannot be honoured here; "
                           f"taken: {', '.join(sorted(SETTINGS_TAKEN))}.")
    fields: dict[str, Any] = {}
    checkpoint = settings.get("sd_model_checkpoint")
    if checkpoint and not (checkpoint == model or str(checkpoint).startswith(model + " [")):
        raise RequestError(f"Checkpoint {_json(checkpoint)} is not loaded here; this server runs {model}.")
    source = settings.get("randn_source")
    if source is not None:
        if source != "CPU":
            raise RequestError(f"randn_source {_json(source)} cannot be reproduced here: CPU (A1111's CPU noise) is, "
                               "or leave it out for this server's own.")
        fields["rng"] = "CPU"
    for name, taken in (("eta_noise_seed_delta", (0, None)), ("sd_vae", ("Automatic", "None", None)),
                        ("img2img_fix_steps", (False, None))):
        _default(settings, name, taken, "not offered")
    if "samples_format" in settings:
        fields["samples_format"] = settings["samples_format"]
    return fields


def _img2img(data: Mapping[str, Any]) -> dict[str, Any]:
    images = data.get("init_images")
    if not isinstance(images, list) or len(images) != 1:
        raise RequestError("init_images must be a list of one image (base64 PNG, JPEG or WebP).")
    fields = {"image": images[0], "strength": data.get("denoising_strength", 0.75)}
    mode = data.get("resize_mode", 0)
    if type(mode) is not int or mode not in RESIZE_CODES:  # (an integer code: not true, not a list)
        raise RequestError(f"resize_mode must be 0, 1 or 2 ({', '.join(RESIZE_MODES)}), got {_json(mode)}.")
    fields["resize_mode"] = RESIZE_CODES[mode]
    if data.get("mask"):  # (A1111's API defaults: fill, Only masked with no padding)
        fill, full_res = data.get("inpainting_fill", 0), data.get("inpaint_full_res", True)
        if type(fill) is not int or fill not in FILL_CODES:
            raise RequestError(f"inpainting_fill must be 0 to 3 ({', '.join(MASKED_CONTENT)}), got {_json(fill)}.")
        if type(full_res) not in (bool, int) or full_res not in (0, 1):
            raise RequestError(f"inpaint_full_res must be true or false, got {_json(full_res)}.")
        blur = data.get("mask_blur", data.get("mask_blur_x", 4))
        fields.update(mask=data["mask"], mask_blur=blur, masked_content=FILL_CODES[fill],
                      inpaint_area=INPAINT_AREAS[bool(full_res)],
                      mask_padding=data.get("inpaint_full_res_padding", 0))
    return fields


def info_json(infos: Sequence[ImageInfo], texts: Sequence[str], model: str, model_hash: str | None,
              styles: Sequence[str], version: str) -> str:
    """A1111's `info` (Processed.js()): what ran, per image and for the whole, as a JSON string."""
    first = infos[0]
    return json.dumps({
        "prompt": first.prompt, "all_prompts": [i.prompt for i in infos], "negative_prompt": first.negative_prompt,
        "all_negative_prompts": [i.negative_prompt for i in infos], "seed": first.seed,
        "all_seeds": [i.seed for i in infos], "subseed": -1, "all_subseeds": [-1] * len(infos),
        "subseed_strength": 0, "width": first.size[0], "height": first.size[1], "sampler_name": first.sampler,
        "scheduler": first.schedule, "cfg_scale": first.guidance_scale, "steps": first.steps,
        "batch_size": len(infos), "restore_faces": False, "face_restoration_model": None, "sd_model_name": model,
        "sd_model_hash": model_hash, "sd_vae_name": None, "sd_vae_hash": None, "seed_resize_from_w": -1,
        "seed_resize_from_h": -1, "denoising_strength": first.strength, "extra_generation_params": {},
        "index_of_first_image": 0, "infotexts": list(texts), "styles": list(styles),
        "job_timestamp": time.strftime("%Y%m%d%H%M%S"), "clip_skip": 1,
        "is_using_inpainting_conditioning": False, "version": version})


__all__ = ["FORMATS", "MAX_IMAGES", "ONLY_DEFAULT", "SCHEDULER_NAMES", "generation_fields", "info_json",
           "script_named"]
