"""Images with their generation parameters, as AUTOMATIC1111 writes them (so "what made this?"
travels with the file): one place for the CLI and the app."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

    from .request import ImageInfo


def parameters_text(info: "ImageInfo", model: str) -> str:
    """AUTOMATIC1111's "parameters" text: prompt, negative prompt, then the settings line."""
    lines = [info.prompt]
    if info.negative_prompt:
        lines.append(f"Negative prompt: {info.negative_prompt}")
    lines.append(f"Steps: {info.steps}, Sampler: {info.sampler}, CFG scale: {info.guidance_scale:g}, "
                 f"Seed: {info.seed}, Size: {info.size[0]}x{info.size[1]}, Model: {model}")
    return "\n".join(lines)


def save_png(image: "Image.Image", info: "ImageInfo", path: str | os.PathLike, *, model: str) -> None:
    """Write a PNG with the parameters in its "parameters" text chunk."""
    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    meta.add_text("parameters", parameters_text(info, model))
    image.save(path, pnginfo=meta)
