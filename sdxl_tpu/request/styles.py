"""Styles: prompt templates and negative prompts, as the original SDXL playground offered them
(the default, DEFAULT_STYLE, is fields.py's)."""

from __future__ import annotations

from typing import Any

from .fields import MAX_PROMPT_CHARS
from .values import choice_input


# name -> (prompt template, negative prompt), as the original SDXL playground offered them.
STYLES: dict[str, tuple[str, str]] = {
    "(No style)": ("{prompt}", ""),
    "Cinematic": ("cinematic still {prompt} . emotional, harmonious, vignette, highly detailed, high budget, bokeh, "
                  "cinemascope, moody, epic, gorgeous, film grain, grainy",
                  "anime, cartoon, graphic, text, painting, crayon, graphite, abstract, glitch, deformed, mutated, "
                  "ugly, disfigured"),
    "Photographic": ("cinematic photo {prompt} . 35mm photograph, film, bokeh, professional, 4k, highly detailed",
                     "drawing, painting, crayon, sketch, graphite, impressionist, noisy, blurry, soft, deformed, ugly"),
    "Anime": ("anime artwork {prompt} . anime style, key visual, vibrant, studio anime, highly detailed",
              "photo, deformed, black and white, realism, disfigured, low contrast"),
    "Manga": ("manga style {prompt} . vibrant, high-energy, detailed, iconic, Japanese comic style",
              "ugly, deformed, noisy, blurry, low contrast, realism, photorealistic, Western comic style"),
    "Digital Art": ("concept art {prompt} . digital artwork, illustrative, painterly, matte painting, highly detailed",
                    "photo, photorealistic, realism, ugly"),
    "Pixel art": ("pixel-art {prompt} . low-res, blocky, pixel art style, 8-bit graphics",
                  "sloppy, messy, blurry, noisy, highly detailed, ultra textured, photo, realistic"),
    "Fantasy art": ("ethereal fantasy concept art of {prompt} . magnificent, celestial, ethereal, painterly, epic, "
                    "majestic, magical, fantasy art, cover art, dreamy",
                    "photographic, realistic, realism, 35mm film, dslr, cropped, frame, text, deformed, glitch, noise, "
                    "noisy, off-center, cross-eyed, closed eyes, bad anatomy, ugly, disfigured, sloppy, duplicate, "
                    "mutated, black and white"),
    "Neonpunk": ("neonpunk style {prompt} . cyberpunk, vaporwave, neon, vibes, vibrant, stunningly beautiful, crisp, "
                 "detailed, sleek, ultramodern, magenta highlights, dark purple shadows, high contrast, cinematic, "
                 "ultra detailed, intricate, professional",
                 "painting, drawing, illustration, glitch, deformed, mutated, cross-eyed, ugly, disfigured"),
    "3D Model": ("professional 3d model {prompt} . octane render, highly detailed, volumetric, dramatic lighting",
                 "ugly, deformed, noisy, low poly, blurry, painting"),
}


def style_entry(style: Any) -> tuple[str, str]:
    """(prompt template, negative prompt) of a style name as a client sent it."""
    return STYLES[choice_input(style, "Style", list(STYLES))]


def apply_style(style: Any, prompt: str, negative: str) -> tuple[str, str]:
    template, style_negative = style_entry(style)
    return template.replace("{prompt}", prompt), ", ".join(p for p in (style_negative, negative) if p)


# The longest prompt a server takes from another program (a front end sends the text with its
# style applied): what a user may type plus the longest style's additions.
MAX_STYLED_PROMPT_CHARS = MAX_PROMPT_CHARS + max(max(len(t), len(n) + 2) for t, n in STYLES.values())
