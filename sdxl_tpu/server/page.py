"""What the playground page shows besides its widgets: size labels, the history of runs kept in
the browser, which preset the form matches. Pure functions of what a client sent (any JSON
value), so app.py stays wiring and every rule here is tested without a browser."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..spec.fields import GUIDANCE_RANGE, MAX_PROMPT_CHARS, MAX_SEED
from ..spec.values import format_size
from ..spec.names import DEFAULT_RNG, DEFAULT_SCHEDULE, RNGS, SCHEDULES
from ..spec.fields import MAX_STEPS

HISTORY_LENGTH = 24  # runs kept in the browser, newest first
HISTORY_PER_PAGE = 12
CUSTOM = "Custom"  # the preset menu's entry when the form matches no preset
HISTORY_FIELDS = ("prompt", "negative", "style", "seed", "guidance", "steps", "sampler", "size", "schedule", "rng")
# How the Schedule type menu names its entries (the others by their own names, A1111's).
SCHEDULE_LABELS = {"Checkpoint": "Checkpoint (as diffusers runs it)", "Automatic": "Automatic (A1111's per sampler)"}
SCHEDULE_INFO = "Checkpoint: the model's own scheduler, as diffusers runs it; the others are A1111's."
RNG_INFO = ("Where the noise comes from: JAX (fast, on the chips), or CPU: PyTorch's CPU noise, as A1111 (RNG CPU) "
            "and ComfyUI draw it.")
_COMMON_RATIOS = {(1, 1), (5, 4), (4, 3), (3, 2), (16, 9), (2, 1), (21, 9)}


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


def schedule_choices(schedules: Sequence[str]) -> list[tuple[str, str]]:
    """(label, value) pairs for the Schedule type menu; the value is what a request sends."""
    return [(SCHEDULE_LABELS.get(name, name), name) for name in schedules]


def matching_preset(presets: dict[str, Sequence[Any]], steps: Any, sampler: Any, guidance: Any) -> str:
    """The preset whose (steps, sampler, guidance) the form holds, else CUSTOM."""
    for name, (p_steps, p_sampler, p_guidance) in presets.items():
        if steps == p_steps and sampler == p_sampler and isinstance(guidance, (int, float)) and \
                abs(guidance - p_guidance) < 1e-6:
            return name
    return CUSTOM


# The same rule in the browser (the preset menu follows the fields without a server event).
# (`offered`: the preset names the menu offers now, from a hidden field the server refreshes)
MATCHING_PRESET_JS = """(steps, sampler, guidance, offered) => {
  for (const name of JSON.parse(offered || "[]")) {
    const p = PRESETS[name];
    if (p && p[0] === steps && p[1] === sampler && Math.abs(p[2] - guidance) < 1e-6) return name;
  }
  return "CUSTOM";
}"""


def preset_fields(recipes: Sequence[Any]) -> dict[str, list[Any]]:
    """{preset name: [steps, sampler, guidance]}: what choosing a preset puts in the form."""
    return {r.name: [r.steps, r.sampler, r.guidance] for r in recipes}


def form_defaults(recipe: Any, default_sampler: str, offered: Sequence[Any]) -> dict[str, Any]:
    """The form's starting steps, sampler and guidance (the launch preset's, else 20, the model's
    sampler and 5) and the preset menu's entry for them."""
    steps, sampler, guidance = (recipe.steps, recipe.sampler, recipe.guidance) if recipe else (20, default_sampler, 5.0)
    return dict(steps=steps, sampler=sampler, guidance=guidance,
                preset=matching_preset(preset_fields(offered), steps, sampler, guidance))


def history_entry(value: Any) -> dict[str, Any] | None:
    """A run as the history keeps it, from a client's value (any JSON), or None if it is not one.
    The page stores it in the browser (localStorage); the server keeps none."""
    if not isinstance(value, dict):
        return None
    entry = {key: value.get(key) for key in HISTORY_FIELDS}
    # Runs kept before the schedule and the noise source were chosen ran on these.
    entry["schedule"] = value.get("schedule", DEFAULT_SCHEDULE)
    entry["rng"] = value.get("rng", DEFAULT_RNG)
    texts = ("prompt", "negative", "style", "sampler", "size")
    if not all(isinstance(entry[k], str) and len(entry[k]) <= MAX_PROMPT_CHARS for k in texts) or not entry["prompt"]:
        return None
    if not (isinstance(entry["schedule"], str) and entry["schedule"] in SCHEDULES and isinstance(entry["rng"], str)
            and entry["rng"] in RNGS):
        return None
    whole = lambda v, low, high: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
    number = lambda v, low, high: isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high
    if not (whole(entry["seed"], 0, MAX_SEED) and whole(entry["steps"], 1, MAX_STEPS)
            and number(entry["guidance"], *GUIDANCE_RANGE)):
        return None
    return entry


def history_after(history: Any, run: Any) -> list[dict[str, Any]]:
    """The history with `run` added first (the same run again moves to the top), at most
    HISTORY_LENGTH entries; malformed entries a client sent are dropped."""
    kept = [e for e in (history_entry(v) for v in (history if isinstance(history, list) else [])[:HISTORY_LENGTH * 2])
            if e is not None]
    new = history_entry(run)
    if new is not None:
        kept = [new] + [e for e in kept if e != new]
    return kept[:HISTORY_LENGTH]


HISTORY_HEADERS = ["Prompt", "Settings", "Sampler"]


def history_rows(history: Any) -> list[list[str]]:
    """The history as the page's table shows it (HISTORY_HEADERS; the page shows 60 characters of
    each): prompt; seed, steps, guidance, size and style; the sampler, with the Schedule type and
    the noise source where they are not the defaults."""
    rows = []
    for e in history_after(history, None):
        settings = (f"seed {e['seed']} · {e['steps']} steps · CFG {e['guidance']:g} · {e['size']}"
                    + (f" · {e['style']}" if e["style"] != "(No style)" else ""))
        sampler = (e["sampler"] + (f", {e['schedule']} schedule" if e["schedule"] != DEFAULT_SCHEDULE else "")
                   + (f" · {e['rng']} noise" if e["rng"] != DEFAULT_RNG else ""))
        rows.append([e["prompt"] + (f"  —  not: {e['negative']}" if e["negative"] else ""), settings, sampler])
    return rows


# Clicking a history row fills the form from the browser's copy of the run (no server event);
# the seed is fixed (randomize off) so the run comes out the same. (A run kept before the
# schedule and the noise source were chosen ran on the defaults.)
RESTORE_HISTORY_JS = """(index, history, ...form) => {
  const e = Array.isArray(history) ? history[index] : undefined;
  if (!e) return form;
  return [e.prompt, e.negative, e.style, e.seed, false, e.guidance, e.steps, e.sampler, e.size,
          e.schedule || DEFAULT_SCHEDULE, e.rng || DEFAULT_RNG];
}""".replace("DEFAULT_SCHEDULE", f'"{DEFAULT_SCHEDULE}"').replace("DEFAULT_RNG", f'"{DEFAULT_RNG}"')


PASTED_FIELDS = ("prompt", "negative", "seed", "randomize", "guidance", "steps", "sampler", "schedule", "size", "rng")


def pasted_form(text: Any, sizes: Sequence[tuple[int, int]], samplers: Sequence[str]) -> tuple[dict[str, Any], str]:
    """A pasted A1111 parameters text -> the form fields it fills (PASTED_FIELDS; the seed turns
    Randomize off) and a line of Markdown saying what was filled and what was not used."""
    from ..spec.infotext import parse, request_fields
    from ..spec.errors import RequestError

    try:
        fields, notes = request_fields(parse(text), list(sizes), list(samplers))
    except RequestError as e:
        return {}, f"⚠️ {e}"
    if not fields["prompt"] and not fields["negative_prompt"] and not set(fields) - {"prompt", "negative_prompt",
                                                                                     "schedule", "rng"}:
        return {}, ("⚠️ Nothing to use: paste a parameters text (the prompt, \"Negative prompt: ...\", then "
                    "\"Steps: ..., Seed: ...\").")
    form = {"prompt": fields["prompt"], "negative": fields["negative_prompt"]}
    names = {"seed": "seed", "guidance_scale": "guidance", "steps": "steps", "sampler": "sampler",
             "schedule": "schedule", "rng": "rng"}
    form.update({names[k]: v for k, v in fields.items() if k in names})
    if "seed" in form:
        form["randomize"] = False
    if "size" in fields:
        form["size"] = format_size(fields["size"])
    filled = ", ".join(f for f in PASTED_FIELDS if f in form and f != "randomize")
    return form, " ".join([f"Filled: {filled}."] + notes)
