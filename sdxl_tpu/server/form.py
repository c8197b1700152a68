"""The playground's form: its fields as a client sends them, checked into one Request with the
style applied; the example prompts; the seed of a picked gallery image; a prompt's token count."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..spec.names import SAMPLERS
from ..spec.prompts import CHUNK_TOKENS, chunk_prompt
from ..spec.fields import MAX_SEED
from ..spec.request import Request
from ..spec.values import json_type, number_input, text_input
from ..spec.errors import RequestError
from .errors import log_refusal
from ..spec.styles import apply_style, style_entry


EXAMPLES = [
    "A majestic lion jumping from a big stone at night",
    "An astronaut riding a green horse",
    "A red panda reading a book in a cozy library, warm light",
    "A lighthouse on a cliff during a storm, dramatic waves",
]


def seed_at(seeds: Any, index: Any) -> int | None:
    """The seed of the gallery image at `index` (from a select event), or None if there is none."""
    if isinstance(index, bool) or not isinstance(index, int) or not isinstance(seeds, list):
        return None
    return seeds[index] if 0 <= index < len(seeds) else None


# The form's fields, in the order the page and the API send them (the last two may be left out).
FORM_FIELDS = ("prompt", "negative", "style", "seed", "randomize", "guidance", "steps", "size", "sampler", "schedule",
               "rng")


def validate(prompt: Any, negative: Any, style: Any, seed: Any, randomize: Any, guidance: Any, steps: Any,
             size: Any, sampler: Any, sizes: Sequence[tuple[int, int]], samplers: Sequence[str] = SAMPLERS, *,
             schedule: Any = None, rng: Any = None) -> Request:
    """The playground's fields, as a client sent them (JSON values), as one checked Request with
    the style applied. A form has one value per field: lists are refused, not taken per image.
    A sampler of None (an API caller that leaves it out) is the model's default; a schedule or
    rng of None, DEFAULT_SCHEDULE and DEFAULT_RNG."""
    style_entry(style)  # an unknown style is refused before the rest is checked
    if not isinstance(randomize, bool):
        raise RequestError(f"Randomize seed must be true or false, got {json_type(randomize)}.")
    if not (randomize and seed is None):  # a cleared seed field does not matter when the seed is drawn
        number_input(seed, "Seed", 0, MAX_SEED, whole=True)
    request = Request.of(prompt, negative, seed=None if randomize else seed, guidance_scale=guidance, steps=steps,
                         size=size, sizes=sizes, sampler=sampler, samplers=samplers, schedule=schedule, rng=rng,
                         per_image=False)
    # The style wraps what the user typed (their text is what the length limit applies to).
    prompt, negative = apply_style(style, request.prompt, request.negative_prompt)
    return dataclasses.replace(request, prompt=prompt, negative_prompt=negative)


def token_count(tokenizer: Any, chunks: int, prompt: Any, style: Any, unavailable: str) -> str:
    """Markdown: how many of the encoder's tokens the prompt takes with the style's template
    applied (as it will be encoded; start and end tokens not counted, as A1111 counts), and a
    warning when it will be cut or is too long to be accepted; `unavailable` without a tokenizer."""
    try:
        text = text_input(prompt, "Prompt")
        template = style_entry(style)[0]
    except RequestError as e:
        log_refusal("token count", e)
        return f"⚠️ {e}"
    limit = CHUNK_TOKENS * chunks
    if not text:
        return f"0 / {limit} tokens"
    if tokenizer is None:
        return unavailable
    try:
        encoded = chunk_prompt(tokenizer, template.replace("{prompt}", text), chunks)
    except Exception as e:  # (a tokenizer's surprise must not break typing)
        log_refusal("token count", e)
        return "No token count for this text."
    used = f"{encoded.count} chunk{'s' if encoded.count > 1 else ''}"
    if encoded.cut:
        return (f"⚠️ **{encoded.tokens + encoded.cut} / {limit} tokens**, {used}: the prompt will be cut after "
                f"token {limit}; the last {encoded.cut} are ignored.")
    return f"{encoded.tokens} / {limit} tokens" + (f", {used}" if encoded.count > 1 else "")
