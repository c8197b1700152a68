"""PNG Info: the generation parameters an image file carries, as an A1111 parameters text the paste
path reads (infotext.request_fields). Ours and AUTOMATIC1111's (a PNG "parameters" chunk, a JPEG
or WebP EXIF UserComment) are read as they are; ComfyUI's workflow, Fooocus', InvokeAI's and
NovelAI's through sd-parsers, their first sampler's settings written in A1111's terms (ComfyUI's
sampler and scheduler names translated; their noise is PyTorch's CPU noise, A1111's RNG CPU).

The file is checked as any upload is (image_input.decode_image: by its content, its size from the
header) before its metadata is read; a reader that fails on a hostile file says nothing was found.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

from PIL import Image

from ..imaging.image_input import FORMATS, decode_image
from .images import read_parameters

log = logging.getLogger("sdxl_tpu.a1111.png_info")

# ComfyUI's (and Fooocus') names -> A1111's; ComfyUI's "normal" schedule is A1111's Uniform (both
# evenly spaced timesteps from the last to the first), its others as named.
COMFY_SAMPLERS = {"euler": "Euler", "euler_ancestral": "Euler a", "dpmpp_2m": "DPM++ 2M",
                  "dpmpp_2m_sde": "DPM++ 2M SDE", "dpmpp_2m_sde_gpu": "DPM++ 2M SDE", "dpmpp_sde": "DPM++ SDE",
                  "dpmpp_sde_gpu": "DPM++ SDE", "ddim": "DDIM", "lcm": "LCM"}
COMFY_SCHEDULES = {"normal": "Uniform", "karras": "Karras", "exponential": "Exponential", "sgm_uniform": "SGM Uniform"}


@dataclass(frozen=True)
class Found:
    text: str | None  # an A1111 parameters text, or None: none found
    source: str  # what it was read as, for the person ("AUTOMATIC1111's parameters", "ComfyUI's workflow", ...)


def png_info(data: bytes, what: str = "Image") -> Found:
    """The parameters in an image file's bytes (RequestError: not an image this server reads)."""
    decode_image(data, what)  # (by content; size checked before decoding)
    with Image.open(io.BytesIO(data), formats=FORMATS) as image:
        text = read_parameters(image)
        if text is not None and text.strip() and not text.lstrip().startswith("{"):  # (Fooocus writes JSON there)
            return Found(text, "AUTOMATIC1111's parameters")
        try:
            from sd_parsers import ParserManager

            info = ParserManager().parse(image)
        except Exception as e:  # noqa: BLE001 (a third-party reader on a hostile file: nothing found)
            log.info("sd-parsers could not read an image: %s", e)
            info = None
        if info is None or not info.samplers:
            return Found(None, "nothing")
        return Found(_as_parameters(info, image.size), f"{info.generator.value}'s metadata (its first sampler)")


def carried_parameters(data: bytes) -> str | None:
    """The A1111 parameters an uploaded image file carries (read_parameters: its PNG text chunk or
    EXIF UserComment), read from its header and text chunks without decoding its pixels; None where
    it has none or they cannot be read (a damaged file, text that is not Unicode): an Extras upscale
    passes them on, never needs them."""
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            text = read_parameters(image)
        if isinstance(text, str):
            text.encode("utf-8")  # (lone surrogates from a forged UserComment: not text to write back)
            return text.replace("\0", "")
    except Exception:  # noqa: BLE001 (any damage: the image has no parameters to keep)
        pass
    return None


def _as_parameters(info, size: tuple[int, int]) -> str:
    """sd-parsers' PromptInfo -> an A1111 parameters text."""
    sampler = info.samplers[0]
    p = sampler.parameters
    lines = [str(info.full_prompt)]
    if info.full_negative_prompt:
        lines.append(f"Negative prompt: {info.full_negative_prompt}")
    settings = []
    if "steps" in p:
        settings.append(f"Steps: {p['steps']}")
    settings.append(f"Sampler: {COMFY_SAMPLERS.get(str(sampler.name), sampler.name)}")
    if "scheduler" in p:
        settings.append(f"Schedule type: {COMFY_SCHEDULES.get(str(p['scheduler']), p['scheduler'])}")
    if "cfg_scale" in p:
        settings.append(f"CFG scale: {p['cfg_scale']}")
    if "seed" in p:
        settings.append(f"Seed: {p['seed']}")
    settings.append(f"Size: {size[0]}x{size[1]}")
    if sampler.model is not None and sampler.model.name:
        settings.append(f"Model: {sampler.model.name}")
    settings.append("RNG: CPU")
    # (a value holding the text's own separators would be misread: such values are left out)
    lines.append(", ".join(s for s in settings if "\n" not in s and s.count(":") == 1 and "," not in s))
    return "\n".join(lines)


__all__ = ["COMFY_SAMPLERS", "COMFY_SCHEDULES", "Found", "carried_parameters", "png_info"]
