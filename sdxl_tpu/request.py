"""One request, checked once: the rules every entry point (API, CLI, playground) applies.

Values are taken as a client sends them (Python or JSON values) and either become a `Request`
or raise `RequestError`, whose message names the field and the problem and is shown to the user
as is. Nothing is converted silently: 1.5 steps or a list where text belongs are refused.
"""

from __future__ import annotations

import math
import secrets
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .prompts import PromptError, check_weights, parse_emphasis
from .names import DEFAULT_RNG, DEFAULT_SCHEDULE, MAX_STEPS, RNGS, SAMPLERS, SCHEDULES, resolve_schedule

MAX_SEED = 2**32 - 1
# Three chunks of 75 tokens take about 1,000 characters of plain text, more with A1111's brackets
# and weights; past the last chunk the text is cut (and the page says so), so this only bounds work.
MAX_PROMPT_CHARS = 2000
GUIDANCE_RANGE = (0.0, 20.0)


class RequestError(ValueError):
    """A request the user can fix; its message is what they see."""


class Cancelled(Exception):
    """The work is no longer wanted (the caller's `stop()` said so, or it has gone); the call
    ended between steps."""


class GenerationError(RuntimeError):
    """The pipeline produced something that is not an image (e.g. NaN)."""


# -- describing what a client sent, safely ----------------------------------------------------

def is_file_object(value: Any) -> bool:
    """Gradio's file-data shape (a dict with a path, url or meta)."""
    return isinstance(value, dict) and ("meta" in value or "path" in value or "url" in value)


def json_type(value: Any) -> str:
    """What a JSON value is, in words (for messages; never a Python repr)."""
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return "true/false"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a file object" if is_file_object(value) else "an object"
    return "an unsupported value"


def shown(value: Any, limit: int = 40) -> str:
    """A client's text, safe to echo in a message or a log line: quoted, non-printable characters
    (controls, lone surrogates) escaped, cut to `limit` characters."""
    text = value if isinstance(value, str) else json_type(value)
    out = "".join(ch if ch.isprintable() and unicodedata.category(ch) != "Cs" else f"\\u{ord(ch):04x}"
                  for ch in text[:limit])
    return f"'{out}{'…' if len(text) > limit else ''}'"


def not_a_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    what = (f"{name} {shown(value)} is not available" if isinstance(value, str)
            else f"{name} must be text, got {json_type(value)}")
    return f"{what}; choose one of: {', '.join(choices)}."


# -- one field at a time ----------------------------------------------------------------------

def clean_text(text: str) -> str:
    """Control and format characters become spaces and whitespace is collapsed: what a user
    pastes (tabs, newlines, zero-width spaces) never reaches the tokenizer as noise."""
    text = "".join(" " if unicodedata.category(ch) in ("Cc", "Cf", "Co") else ch for ch in text)
    return " ".join(text.split())


def prompt_input(value: Any, name: str, limit: int = MAX_PROMPT_CHARS) -> str:
    """A prompt field: text as `text_input` checks it, whose emphasis weights are in range."""
    text = text_input(value, name, limit)
    try:
        check_weights(parse_emphasis(text), name)
    except PromptError as e:
        raise RequestError(str(e)) from None
    return text


def text_input(value: Any, name: str, limit: int = MAX_PROMPT_CHARS) -> str:
    """A text field: text (None means empty), valid Unicode, at most `limit` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RequestError(f"{name} must be text, got {json_type(value)}.")
    if len(value) > limit:  # first: the character scan below is then bounded
        raise RequestError(f"{name} is {len(value):,} characters long; at most {limit:,} are accepted.")
    if any(unicodedata.category(ch) == "Cs" for ch in value):
        raise RequestError(f"{name} contains a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode.")
    return clean_text(value)


def number_input(value: Any, name: str, low: float, high: float, *, whole: bool = False) -> float:
    """A number: not true/false, not text, finite, in [low, high], and a whole number where
    `whole` (3.0 counts as 3, 3.5 is refused, not rounded)."""
    kind = "a whole number" if whole else "a number"
    bounds = f"between {int(low)} and {int(high)}" if whole else f"between {low:g} and {high:g}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RequestError(f"{name} must be {kind} {bounds}, got {json_type(value)}.")
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):  # (an int may be too large for a float)
        raise RequestError(f"{name} must be a finite number {bounds}.")
    if not low <= value <= high or whole and value != int(value):
        raise RequestError(f"{name} must be {kind} {bounds}.")
    return value


def parse_size(value: Any) -> tuple[int, int]:
    """'1024x1024' or (1024, 1024) -> (width, height)."""
    if isinstance(value, str):
        parts = value.strip().lower().replace(" ", "").split("x")
        if len(parts) == 2 and all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
            return int(parts[0]), int(parts[1])
        raise RequestError(f"Size must look like WIDTHxHEIGHT (e.g. 1024x1024), got {shown(value)}.")
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        return int(value[0]), int(value[1])
    raise RequestError(f"Size must be WIDTHxHEIGHT text or a (width, height) pair, got {json_type(value)}.")


def format_size(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def choice_input(value: Any, name: str, choices: Sequence[str]) -> str:
    """One of `choices`, by name."""
    if not isinstance(value, str) or value not in choices:
        raise RequestError(not_a_choice(name, value, choices))
    return value


def size_input(value: Any, sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """One of the compiled `sizes`, named as text or as a pair."""
    choices = [format_size(s) for s in sizes]
    try:
        size = parse_size(value)
    except RequestError:
        size = None
    if size not in sizes:
        if isinstance(value, str) or size is None:
            raise RequestError(not_a_choice("Size", value, choices))
        raise RequestError(f"Size {format_size(size)} is not available; choose one of: {', '.join(choices)}.")
    return size


def schedule_input(sampler: str, schedule: str) -> str:
    """The schedule `sampler` runs on under Schedule type `schedule` (RequestError if none)."""
    try:
        return resolve_schedule(sampler, schedule)
    except ValueError as e:
        raise RequestError(str(e)) from None


# -- the request ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageInfo:
    """The parameters of one image."""
    seed: int
    prompt: str
    negative_prompt: str
    guidance_scale: float
    steps: int
    size: tuple[int, int]  # (width, height)
    sampler: str | None = None  # None: the pipeline's default (it fills it in)
    schedule: str = DEFAULT_SCHEDULE  # one of scheduler.SCHEDULES
    rng: str = DEFAULT_RNG  # one of scheduler.RNGS: where the noise comes from

    def parameters_text(self, model: Any) -> str:
        """AUTOMATIC1111's "parameters" text (see images.py)."""
        from .images import parameters_text

        return parameters_text(self, model)


@dataclass
class GenerationResult:
    images: list  # PIL.Image.Image
    infos: list[ImageInfo]
    timings: dict[str, float] = field(default_factory=dict)  # seconds: text_encoding, denoising, decoding, total

    @property
    def seeds(self) -> list[int]:
        return [i.seed for i in self.infos]


def guided(infos: Sequence[ImageInfo]) -> bool:
    """Whether a call needs classifier-free guidance (any image's guidance above 1); without it
    the UNet runs the conditional pass alone."""
    return any(i.guidance_scale > 1 for i in infos)


PREVIEWS_PER_RUN = 4  # the default cadence: about this many previews in a run of any length


def preview_cadence(setting: int | None, steps: int) -> int:
    """Steps between live previews: `setting` (0: none), or by default about PREVIEWS_PER_RUN a run."""
    if setting is not None:
        return setting
    return max(1, steps // (PREVIEWS_PER_RUN + 1)) if steps > 1 else 0


def _one_or_each(value: Any, name: str, check: Callable[[Any], Any], per_image: bool) -> Any:
    """A value for every image or, where `per_image`, a list of one value per image (its length
    is checked against the image count when the request is spelled out)."""
    if per_image and isinstance(value, (list, tuple)):
        if not value:
            raise RequestError(f"{name}: a list of per-image values must not be empty.")
        return tuple(check(v) for v in value)
    return check(value)


def per_image(value: Any, n: int, name: str) -> list:
    if isinstance(value, tuple):
        if len(value) != n:
            raise RequestError(f"{name}: got {len(value)} values for {n} images.")
        return list(value)
    return [value] * n


@dataclass(frozen=True)
class Request:
    """What one call makes. Each of prompt, negative_prompt, seed and guidance_scale is one value
    for every image or a tuple of one per image; a single seed is a base: image i gets seed + i."""
    prompt: str | tuple[str, ...]
    negative_prompt: str | tuple[str, ...]
    seed: int | tuple[int, ...]
    guidance_scale: float | tuple[float, ...]
    steps: int
    size: tuple[int, int]
    sampler: str | None = None  # by name; None: the pipeline's default
    schedule: str = DEFAULT_SCHEDULE
    rng: str = DEFAULT_RNG

    @staticmethod
    def of(prompt: Any, negative_prompt: Any = "", *, seed: Any = None, guidance_scale: Any = 5.0,
           steps: Any = 20, size: Any = (1024, 1024), sizes: Sequence[tuple[int, int]] | None = None,
           sampler: Any = None, samplers: Sequence[str] | None = None, schedule: Any = None, rng: Any = None,
           per_image: bool = True, max_chars: int = MAX_PROMPT_CHARS) -> "Request":
        """Check everything; `seed=None` draws a random seed; `sizes` and `samplers` are those
        available (default: all of scheduler.SAMPLERS); without `per_image`, lists are refused (a
        form has one value per field); prompts are at most `max_chars` characters."""
        def prompt_text(v: Any) -> str:
            text = prompt_input(v, "Prompt", max_chars)
            if not text:
                raise RequestError("Please enter a prompt.")
            return text

        def field(value: Any, name: str, check: Callable[[Any], Any]) -> Any:
            return _one_or_each(value, name, check, per_image)

        sampler = None if sampler is None else choice_input(sampler, "Sampler",
                                                            SAMPLERS if samplers is None else samplers)
        schedule = DEFAULT_SCHEDULE if schedule is None else choice_input(schedule, "Schedule type", SCHEDULES)
        if sampler is not None:  # the default sampler's combination is checked once it is known
            schedule_input(sampler, schedule)
        return Request(
            prompt=field(prompt, "Prompt", prompt_text),
            negative_prompt=field(negative_prompt, "Negative prompt",
                                  lambda v: prompt_input(v, "Negative prompt", max_chars)),
            seed=secrets.randbelow(MAX_SEED + 1) if seed is None else field(
                seed, "Seed", lambda v: int(number_input(v, "Seed", 0, MAX_SEED, whole=True))),
            guidance_scale=field(guidance_scale, "Guidance scale",
                                 lambda v: float(number_input(v, "Guidance scale", *GUIDANCE_RANGE))),
            steps=int(number_input(steps, "Steps", 1, MAX_STEPS, whole=True)),
            size=size_input(size, sizes) if sizes is not None else parse_size(size),
            sampler=sampler, schedule=schedule, rng=DEFAULT_RNG if rng is None else choice_input(rng, "RNG", RNGS))

    def images(self, n: int) -> list[ImageInfo]:
        """The request spelled out for `n` images."""
        seeds = ([(self.seed + i) % (MAX_SEED + 1) for i in range(n)] if isinstance(self.seed, int)
                 else per_image(self.seed, n, "Seed"))
        columns = zip(seeds, per_image(self.prompt, n, "Prompt"),
                      per_image(self.negative_prompt, n, "Negative prompt"),
                      per_image(self.guidance_scale, n, "Guidance scale"))
        return [ImageInfo(seed=s, prompt=p, negative_prompt=q, guidance_scale=g, steps=self.steps, size=self.size,
                          sampler=self.sampler, schedule=self.schedule, rng=self.rng) for s, p, q, g in columns]
