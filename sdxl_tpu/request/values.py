"""A client's values, checked one field at a time: the rules every entry point (API, CLI,
playground) applies. Values are taken as a client sends them (Python or JSON values) and either
come back checked or raise RequestError, whose message names the field and the problem and is
shown to the user as is. Nothing is converted silently: 1.5 steps or a list where text belongs
are refused."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .errors import RequestError
from .fields import MAX_PROMPT_CHARS, MAX_SEED, RANDOM_SEED
from .names import resolve_schedule
from ..a1111.prompts import PromptError, check_weights, parse_emphasis


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


def number_input(value: Any, name: str, low: float, high: float, *, whole: bool = False,
                 low_means: str | None = None) -> float:
    """A number: not true/false, not text, finite, in [low, high], and a whole number where
    `whole` (3.0 counts as 3, 3.5 is refused, not rounded); `low_means`: what the lowest value
    stands for, said in messages ("-1 (random)")."""
    kind = "a whole number" if whole else "a number"
    lowest = (f"{int(low)}" if whole else f"{low:g}") + (f" ({low_means})" if low_means else "")
    bounds = f"between {lowest} and {int(high)}" if whole else f"between {lowest} and {high:g}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RequestError(f"{name} must be {kind} {bounds}, got {json_type(value)}.")
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):  # (an int may be too large for a float)
        raise RequestError(f"{name} must be a finite number {bounds}.")
    if not low <= value <= high or whole and value != int(value):
        raise RequestError(f"{name} must be {kind} {bounds}.")
    return value.item() if isinstance(value, (np.integer, np.floating)) else value


def seed_input(value: Any, name: str = "Seed") -> int:
    """A seed: a whole number from 0 to MAX_SEED, or RANDOM_SEED (-1), which asks for a random one
    (drawn where the request is made: Request.of)."""
    return int(number_input(value, name, RANDOM_SEED, MAX_SEED, whole=True, low_means="random"))


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
    if size is None or size not in sizes:
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


def per_image(value: Any, n: int, name: str) -> list:
    """A value for each of `n` images: a tuple of them (checked to be `n`), or one for all."""
    if isinstance(value, tuple):
        if len(value) != n:
            raise RequestError(f"{name}: got {len(value)} values for {n} images.")
        return list(value)
    return [value] * n
