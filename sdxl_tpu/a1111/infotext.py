"""AUTOMATIC1111's parameters text, written and read: what our images carry and what its PNG Info
shows.

    a cat <lora:style:0.8>                      prompt (any number of lines)
    Negative prompt: blurry                     negative prompt (from here to the settings line)
    Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 5, Size: 1024x1024, RNG: CPU

The last line holds the settings when it has at least three "Key: value" pairs, as A1111 decides;
a value may be quoted ("a, b"). `request_fields` turns the settings into this server's request
fields: each value is checked as a request's would be, and what cannot be used is listed, not
fatal. Everything here is untrusted input. Host-side only: no JAX.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from ..version import VERSION
from ..request.errors import RequestError
from ..request.fields import FIELDS, GUIDANCE_RANGE, MAX_PROMPT_CHARS, MAX_STEPS, PASTED, STRENGTH_RANGE
from ..imaging.hires import SCALE_RANGE, UPSCALERS
from ..imaging.mask import INPAINT_AREAS, MASKED_CONTENT, MAX_MASK_BLUR, MAX_MASK_PADDING
from ..request.names import DEFAULT_RNG, RNGS, SCHEDULES, schedule_used
from .prompts import split_network_tags
from ..request.control import ControlRequest
from ..request.request import ImageInfo
from ..request.values import choice_input, format_size, number_input, schedule_input, seed_input, shown

MAX_PARAMETERS_CHARS = 3 * MAX_PROMPT_CHARS  # prompt, negative prompt and the settings line
# "Key: value" or 'Key: "a, b"', as A1111 reads them. A key of at most 64 characters (A1111's are
# a few words), taken whole or not at all, keeps the reading of a long line linear: unbounded, each
# start of a word scanned the rest of the line (60,000 characters without a colon: half a minute).
_SETTING = re.compile(r'(\w[\w \-/]{1,63}+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
# Used: prompt and negative prompt, and these settings. A1111 writes the schedule apart from the
# sampler since 1.9 ("Sampler: DPM++ 2M, Schedule type: Karras"), and "RNG" only when it is not
# its default (GPU) noise.
USED = {f.infotext for f in FIELDS if f.infotext}
TEMPLATES = ("Template", "Negative Template")  # sd-dynamic-prompts': what an image's prompts were drawn from
# Schedule types by A1111's labels in any case, and ComfyUI's names of the same schedules
# ("sgm_uniform"; "normal" is A1111's Uniform: the model's timesteps evenly from the last to the
# first, sigmas interpolated in log sigma, as k-diffusion's get_sigmas makes them).
SCHEDULE_NAMES = {**{name.lower(): name for name in SCHEDULES}, "sgm_uniform": "SGM Uniform", "normal": "Uniform"}
OUR_VERSION = "sdxl-tpu"  # what our texts' "Version" starts with
NOT_REPRODUCIBLE = ("Not reproducible here: A1111's {what}, so RNG {rng} is used; A1111's CPU noise is "
                    "(RNG CPU).")


@dataclass(frozen=True)
class Stamp:
    """What made an image besides its own parameters, as A1111 names it: the model, its short
    hash where it is one file, the LoRAs fused into it (name, scale, short hash), the textual
    inversion embeddings its prompts name (name, short hash), and its refiner."""
    model: str
    model_hash: str | None = None
    loras: tuple[tuple[str, float, str], ...] = ()
    embeddings: tuple[tuple[str, str], ...] = ()
    refiner: str | None = None  # the refiner loaded (named where an image's steps switched to it)


def file_hash(path: str | os.PathLike, digits: int) -> str:
    """A1111's short hash of a weights file: the first `digits` hex digits of its SHA-256
    (10 for a checkpoint's "Model hash", 12 for a LoRA's)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()[:digits]


def parameters_text(info: ImageInfo, stamp: Stamp | str) -> str:
    """AUTOMATIC1111's "parameters" text: prompt (with a `<lora:name:scale>` tag per LoRA fused, as
    A1111 users apply them; the tags typed in it are not applied, so not written), negative prompt,
    then the settings line:

        Steps: 20, Sampler: Euler, Schedule type: Karras, CFG scale: 5, Seed: 7, Size: 1024x1024,
        Model: sd_xl_base_1.0, RNG: CPU, Version: sdxl-tpu 0.1.0
    """
    stamp = Stamp(stamp) if isinstance(stamp, str) else stamp
    prompt = split_network_tags(info.prompt)[0]
    lines = [prompt + "".join(f" <lora:{name}:{scale:g}>" for name, scale, _ in stamp.loras)]
    if info.negative_prompt:
        lines.append(f"Negative prompt: {info.negative_prompt}")
    # Where A1111 puts them: the schedule right after the sampler, the noise source after the model.
    # Both always, so the text says what ran ("Checkpoint" and "JAX" are this server's own).
    settings = [f"Steps: {info.steps}", f"Sampler: {info.sampler}",
                f"Schedule type: {schedule_used(info.sampler, info.schedule)}", f"CFG scale: {info.guidance_scale:g}",
                f"Seed: {info.seed}", f"Size: {info.size[0]}x{info.size[1]}"]
    if stamp.model_hash:
        settings.append(f"Model hash: {stamp.model_hash}")
    settings.append(f"Model: {stamp.model}")
    if info.strength is not None or info.hires is not None:  # img2img's, or the hires pass's: where A1111 writes it
        settings.append(f"Denoising strength: {(info.strength if info.hires is None else info.hires.strength):g}")
    if info.mask_blur:  # inpainting's, as A1111 writes them (nothing for no blur, or "original" content)
        settings.append(f"Mask blur: {info.mask_blur}")
    if info.masked_content not in (None, "original"):
        settings.append(f"Masked content: {info.masked_content}")
    if info.mask_padding is not None:  # (A1111 names the area only where it is Only masked)
        settings.append(f"Inpaint area: {info.inpaint_area}, Masked area padding: {info.mask_padding}")
    if info.hires is not None:
        settings.append(f"Hires upscale: {info.hires.scale:g}")
        if info.hires.steps:
            settings.append(f"Hires steps: {info.hires.steps}")
        settings.append(f"Hires upscaler: {info.hires.upscaler}")
    settings.append(f"RNG: {info.rng}")
    if info.refiner_switch_at is not None:  # (A1111's extra parameters, after RNG)
        settings += [f"Refiner: {stamp.refiner}"] * bool(stamp.refiner) + [
            f"Refiner switch at: {info.refiner_switch_at:g}"]
    settings += [f'ControlNet {i}: "{control_text(unit)}"' for i, unit in enumerate(info.controls)]
    if stamp.loras:
        settings.append('Lora hashes: "' + ", ".join(f"{name}: {h}" for name, _, h in stamp.loras) + '"')
    if stamp.embeddings:
        settings.append('TI hashes: "' + ", ".join(f"{name}: {h}" for name, h in stamp.embeddings) + '"')
    settings += [f"{key}: {quoted(text)}" for key, text in zip(TEMPLATES, (info.template, info.negative_template))
                 if text]
    settings.append(f"Version: sdxl-tpu {VERSION}")
    lines.append(", ".join(settings))
    return "\n".join(lines)


def quoted(text: str) -> str:
    """A setting's value as A1111 writes it: as it is, or as a JSON string where a comma, a colon
    or a line break would end it."""
    return json.dumps(text, ensure_ascii=False) if any(c in text for c in ",:\n\"") else text


def embedding_names(ti_hashes: str) -> list[str]:
    """The embeddings an A1111 "TI hashes" value names ("name: hash, name: hash"), each once."""
    value = ti_hashes.strip().removeprefix('"').removesuffix('"')
    return list(dict.fromkeys(name.strip() for name, _, _ in (part.rpartition(":") for part in value.split(","))
                              if name.strip()))


def control_text(unit: ControlRequest) -> str:
    """A ControlNet unit as sd-webui-controlnet writes it into the parameters (its fields' names in
    words; the preprocessor runs at the image's own size, its Pixel Perfect)."""
    fields = {"Module": unit.module, "Model": unit.model, "Weight": f"{unit.weight:g}",
              "Resize Mode": unit.resize_mode.title().replace(" And ", " and "),
              **({} if unit.thresholds is None else dict(zip(("Threshold A", "Threshold B"), unit.thresholds))),
              "Guidance Start": f"{unit.start:g}", "Guidance End": f"{unit.end:g}", "Pixel Perfect": True,
              "Control Mode": "Balanced", **({"Guess Mode": True} if unit.guess_mode else {})}
    return ", ".join(f"{key}: {value}" for key, value in fields.items())


@dataclass(frozen=True)
class Parameters:
    prompt: str
    negative_prompt: str
    settings: dict[str, str] = field(default_factory=dict)  # key -> value, in the text's order


def parse(text: str) -> Parameters:
    """A parameters text -> prompt, negative prompt and settings (A1111's own reading)."""
    if not isinstance(text, str):
        raise RequestError("Parameters must be text, got "
                           f"{'a list' if isinstance(text, list) else type(text).__name__}.")
    if len(text) > MAX_PARAMETERS_CHARS:
        raise RequestError(f"Parameters are {len(text):,} characters long; at most {MAX_PARAMETERS_CHARS:,} are read.")
    if any(unicodedata.category(ch) == "Cs" for ch in text):
        raise RequestError("Parameters contain a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode.")
    *lines, last = text.strip().replace("\r\n", "\n").split("\n")
    found = _SETTING.findall(last)
    if len(found) < 3:
        lines, found = [*lines, last], []
    prompt: list[str] = []
    negative: list[str] | None = None
    for line in lines:
        line = line.strip()
        if negative is None and line.startswith("Negative prompt:"):
            negative, line = [], line[len("Negative prompt:"):].strip()
        (prompt if negative is None else negative).append(line)
    settings = {}
    for key, value in found:
        if len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        settings[key.strip()] = str(value).strip()
    return Parameters("\n".join(prompt).strip(), "\n".join(negative or []).strip(), settings)


def request_fields(parsed: Parameters, sizes: list[tuple[int, int]], samplers: list[str],
                   upscalers: Sequence[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """The request fields a pasted text gives (prompt, negative_prompt, steps, sampler, schedule,
    guidance_scale, seed, size, rng), and a note for everything it says that is not used: unknown
    keys, values out of range, a size, sampler, schedule or hires upscaler model (`upscalers`: the
    server's) this server does not offer (or a
    sampler does not run on), noise it cannot reproduce, LoRA tags.

    Given a settings line, the schedule and the noise source are always filled, as the text's
    author ran them: without a "Schedule type", A1111's Automatic (it writes none for that), or for
    our own older texts (their Version says sdxl-tpu) the checkpoint's schedule; without an "RNG",
    JAX (A1111's default GPU noise cannot be reproduced: said in a note)."""
    fields: dict[str, Any] = {}
    notes: list[str] = []
    prompt, tags = split_network_tags(parsed.prompt)
    if tags:
        notes.append(f"Not applied: {', '.join(t.text for t in tags)} (LoRAs are loaded with the model here, "
                     "not per prompt).")
    fields["prompt"] = prompt
    fields["negative_prompt"] = split_network_tags(parsed.negative_prompt)[0]
    s = parsed.settings

    def take(key: str, convert) -> None:
        if key in s:
            try:
                fields.update(convert(s[key]))
            except (RequestError, ValueError) as e:
                notes.append(f"Not used: {key}: {shown(s[key])} ({str(e).rstrip('.')}).")

    take("Steps", lambda v: {"steps": int(number_input(_number(v), "Steps", 1, MAX_STEPS, whole=True))})
    take("CFG scale", lambda v: {"guidance_scale": float(number_input(_number(v), "CFG scale", *GUIDANCE_RANGE))})
    take("Seed", lambda v: {"seed": seed_input(_number(v))})  # (-1: a random seed, as in A1111)
    take("Size", lambda v: {"size": _size(v, sizes)})
    _image_settings(s, take, (*UPSCALERS, *upscalers))
    if s:
        ours = s.get("Version", "").startswith(OUR_VERSION)
        _sampler_and_schedule(s, samplers, "Checkpoint" if ours else "Automatic", fields, notes)
        _rng(s.get("RNG"), ours, fields, notes)
    notes += [f"{key}: {shown(s[key], 60)} (the image's own prompt is filled in; the template draws others)."
              for key in TEMPLATES if key in s]
    if names := embedding_names(s.get("TI hashes", "")):
        notes.append(f"Embeddings: {', '.join(shown(n, 40)[1:-1] for n in names[:10])} (named in the prompt; used "
                     "where this server has them, else read as words).")
    unused = [key for key in s if key not in USED and key not in TEMPLATES and key not in ("TI hashes", "Refiner")]
    if unused:
        notes.append(f"Not used here: {', '.join(shown(k, 30)[1:-1] for k in unused)}.")
    return fields, notes


# What a pasted text's image settings need from the request itself (its own image and mask; no
# starting image for a hires fix): without it they are dropped, not refused.
PASTED_NEEDS = {f.api: f.needs[-1] for f in FIELDS if PASTED in f.kept and f.needs and "hires" not in f.needs}


def usable(pasted: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The pasted fields a request with the fields `given` (by API name, non-null) can use: img2img's
    and inpainting's settings only with an image (and a mask), a hires fix only without an image."""
    kept = {k: v for k, v in pasted.items() if PASTED_NEEDS.get(k) is None or given.get(PASTED_NEEDS[k]) is not None}
    if given.get("image") is not None:
        kept = {k: v for k, v in kept.items() if not k.startswith("hires")}
    return kept


def _image_settings(s: dict[str, str], take, upscalers: Sequence[str]) -> None:
    """img2img's, inpainting's and the hires fix's settings, as A1111 writes them (with a hires fix
    "Denoising strength" is the hires pass's)."""
    hires = "Hires upscale" in s
    number = lambda key, low, high, whole=False: lambda v: number_input(_number(v), key, low, high, whole=whole)
    take("Denoising strength", lambda v: {"hires_strength" if hires else "strength":
                                          float(number("Denoising strength", *STRENGTH_RANGE)(v))})
    take("Mask blur", lambda v: {"mask_blur": int(number("Mask blur", 0, MAX_MASK_BLUR, True)(v))})
    take("Masked content", lambda v: {"masked_content": choice_input(v, "Masked content", MASKED_CONTENT)})
    take("Inpaint area", lambda v: {"inpaint_area": choice_input(v, "Inpaint area", INPAINT_AREAS)})
    take("Masked area padding", lambda v: {"mask_padding": int(number("Masked area padding", 0, MAX_MASK_PADDING,
                                                                      True)(v))})
    take("Refiner switch at", lambda v: {"refiner_switch_at": float(number("Refiner switch at", 0.0, 1.0)(v))})
    if hires:
        take("Hires upscale", lambda v: {"hires": True, "hires_scale": float(number("Hires upscale", *SCALE_RANGE)(v))})
        take("Hires steps", lambda v: {"hires_steps": int(number("Hires steps", 0, MAX_STEPS, True)(v))})
        take("Hires upscaler", lambda v: {"hires_upscaler": choice_input(v, "Hires upscaler", upscalers)})


def _sampler_and_schedule(s: dict[str, str], samplers: list[str], unnamed: str, fields: dict[str, Any],
                          notes: list[str]) -> None:
    """Sampler and Schedule type (`unnamed` where the text names none). An old A1111 name that
    ends in a schedule ("DPM++ 2M SDE Exponential", before 1.9) is the sampler with that schedule,
    as A1111 reads it, unless it is a sampler of its own here ("DPM++ 2M Karras")."""
    sampler = s.get("Sampler")
    schedule = SCHEDULE_NAMES.get(s["Schedule type"].strip().lower()) if "Schedule type" in s else unnamed
    if "Schedule type" in s and schedule is None:
        notes.append(f"Not used: Schedule type: {shown(s['Schedule type'])} (this server offers "
                     f"{', '.join(SCHEDULES)}).")
    if sampler is not None and sampler not in samplers:
        base, _, suffix = sampler.rpartition(" ")
        if base in samplers and suffix.lower() in SCHEDULE_NAMES:
            sampler, schedule = base, SCHEDULE_NAMES[suffix.lower()]
        else:
            notes.append(f"Not used: Sampler: {shown(sampler)} (this server offers {', '.join(samplers)}).")
            sampler = None
    if sampler is not None:
        fields["sampler"] = sampler
    if schedule is not None:
        try:
            if sampler is not None:
                schedule_input(sampler, schedule)
            fields["schedule"] = schedule
        except RequestError as e:
            notes.append(f"Not used: Schedule type: {shown(schedule)} ({str(e).rstrip('.')}).")


def _rng(value: str | None, ours: bool, fields: dict[str, Any], notes: list[str]) -> None:
    """The noise source: "CPU" (A1111's CPU source, ComfyUI's) or ours ("JAX"); anything else is
    noise that cannot be made here (A1111's GPU default, NVIDIA's "NV"): JAX, with a note."""
    name = value.strip().upper() if value is not None else None
    if name in RNGS:
        fields["rng"] = name
        return
    fields["rng"] = DEFAULT_RNG
    if (value is None and not ours) or name == "GPU":
        notes.append(NOT_REPRODUCIBLE.format(what="default noise source (GPU)", rng=DEFAULT_RNG))
    elif name == "NV":
        notes.append(NOT_REPRODUCIBLE.format(what="RNG NV (NVIDIA's GPU noise)", rng=DEFAULT_RNG))
    elif value is not None:
        notes.append(f"Not used: RNG: {shown(value)} (this server offers {', '.join(RNGS)}; {DEFAULT_RNG} is used).")


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def _size(text: str, sizes: list[tuple[int, int]]) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d{1,6})\s*x\s*(\d{1,6})\s*", text)
    if not match:
        raise ValueError("not WIDTHxHEIGHT")
    size = (int(match.group(1)), int(match.group(2)))
    if size not in sizes:
        raise ValueError(f"this server offers {', '.join(format_size(s) for s in sizes)}")
    return size
