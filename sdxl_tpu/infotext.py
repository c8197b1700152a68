"""AUTOMATIC1111's parameters text, read: what its PNG Info shows and what our images carry.

    a cat <lora:style:0.8>                      prompt (any number of lines)
    Negative prompt: blurry                     negative prompt (from here to the settings line)
    Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 1024x1024, Model: sd_xl_base_1.0

The last line holds the settings when it has at least three "Key: value" pairs, as A1111 decides;
a value may be quoted ("a, b"). `request_fields` turns the settings into this server's request
fields: each value is checked as a request's would be, and what cannot be used is listed, not
fatal. Everything here is untrusted input. Host-side only: no JAX.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from .request import GUIDANCE_RANGE, MAX_PROMPT_CHARS, MAX_SEED, RequestError, format_size, number_input, shown
from .scheduler import MAX_STEPS

MAX_PARAMETERS_CHARS = 3 * MAX_PROMPT_CHARS  # prompt, negative prompt and the settings line
_SETTING = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_EXTRA_NETWORK = re.compile(r"<(lora|lyco|hypernet):([^:>]+)(?::[^>]*)?>", re.I)
# Used: prompt and negative prompt, and these settings. A1111 writes the schedule apart from the
# sampler since 1.9 ("Sampler: DPM++ 2M, Schedule type: Karras").
USED = ("Steps", "Sampler", "Schedule type", "CFG scale", "Seed", "Size")


@dataclass(frozen=True)
class Parameters:
    prompt: str
    negative_prompt: str
    settings: dict[str, str] = field(default_factory=dict)  # key -> value, in the text's order


def parse(text: str) -> Parameters:
    """A parameters text -> prompt, negative prompt and settings (A1111's own reading)."""
    if not isinstance(text, str):
        raise RequestError(f"Parameters must be text, got {'a list' if isinstance(text, list) else type(text).__name__}.")
    if len(text) > MAX_PARAMETERS_CHARS:
        raise RequestError(f"Parameters are {len(text):,} characters long; at most {MAX_PARAMETERS_CHARS:,} are read.")
    if any(unicodedata.category(ch) == "Cs" for ch in text):
        raise RequestError("Parameters contain a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode.")
    *lines, last = text.strip().replace("\r\n", "\n").split("\n")
    if len(_SETTING.findall(last)) < 3:
        lines, last = [*lines, last], ""
    prompt: list[str] = []
    negative: list[str] | None = None
    for line in lines:
        line = line.strip()
        if negative is None and line.startswith("Negative prompt:"):
            negative, line = [], line[len("Negative prompt:"):].strip()
        (prompt if negative is None else negative).append(line)
    settings = {}
    for key, value in _SETTING.findall(last):
        if len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        settings[key.strip()] = str(value).strip()
    return Parameters("\n".join(prompt).strip(), "\n".join(negative or []).strip(), settings)


def request_fields(parsed: Parameters, sizes: list[tuple[int, int]], samplers: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The request fields a pasted text gives (prompt, negative_prompt, steps, sampler,
    guidance_scale, seed, size), and a note for everything it says that is not used: unknown
    keys, values out of range, a size or sampler this server does not offer, LoRA tags."""
    fields: dict[str, Any] = {}
    notes: list[str] = []
    prompt, tags = _without_extra_networks(parsed.prompt)
    if tags:
        notes.append(f"Not applied: {', '.join(tags)} (LoRAs are loaded with the model here, not per prompt).")
    fields["prompt"] = prompt
    fields["negative_prompt"] = _without_extra_networks(parsed.negative_prompt)[0]
    s = parsed.settings

    def take(key: str, convert) -> None:
        if key in s:
            try:
                fields.update(convert(s[key]))
            except (RequestError, ValueError) as e:
                notes.append(f"Not used: {key}: {shown(s[key])} ({str(e).rstrip('.')}).")

    take("Steps", lambda v: {"steps": int(number_input(_number(v), "Steps", 1, MAX_STEPS, whole=True))})
    take("CFG scale", lambda v: {"guidance_scale": float(number_input(_number(v), "CFG scale", *GUIDANCE_RANGE))})
    take("Seed", lambda v: {"seed": int(number_input(_number(v), "Seed", 0, MAX_SEED, whole=True))})
    take("Size", lambda v: {"size": _size(v, sizes)})
    if "Sampler" in s:
        name = s["Sampler"] + ("" if s.get("Schedule type", "Automatic") in ("Automatic", "") else f" {s['Schedule type']}")
        if name in samplers:
            fields["sampler"] = name
        else:
            notes.append(f"Not used: Sampler: {shown(name)} (this server offers {', '.join(samplers)}).")
    unused = [key for key in s if key not in USED]
    if unused:
        notes.append(f"Not used here: {', '.join(shown(k, 30)[1:-1] for k in unused)}.")
    return fields, notes


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


def _without_extra_networks(text: str) -> tuple[str, list[str]]:
    tags = [m.group(0) for m in _EXTRA_NETWORK.finditer(text)]
    return " ".join(_EXTRA_NETWORK.sub(" ", text).split()) if tags else text, tags
