"""AUTOMATIC1111's X/Y/Z plot axes (its scripts/xyz_grid, 1.10), in plain Python: its axis types in its
order (/sdapi/v1 names them by index), those offered here (each sets one of the form's fields), and an
axis's values read as A1111 reads them (comma-separated with csv quoting; ranges 1-5, 1-10 (+2),
10-1 (-3), 5-20 [4], 1.5-3 (+0.5), 1-2 [5]) and checked as the form's fields are. The plot that
puts three of them together is xyz_plot.py's.

Values come from anyone: an axis has at most MAX_VALUES, and a number or range is at most
MAX_NUMBER_CHARS (it bounds the range patterns' backtracking); every refusal is one line."""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..imaging.hires import UPSCALERS
from ..request.errors import RequestError
from ..request.fields import FIELD, MAX_PROMPT_CHARS, RANDOM_SEED
from ..request.names import RNGS, SAMPLERS
from ..request.request import random_seed
from ..request.styles import STYLES
from ..request.values import json_type, not_a_choice, number_input, parse_size, seed_input, shown, size_input
from .infotext import SCHEDULE_NAMES

MAX_VALUES = 100  # on one axis
MAX_NUMBER_CHARS = 64  # one number or range (longer is neither)

# A1111 1.10's axis types in its order ("[t]": txt2img's only, "[i]": img2img's). /sdapi/v1 names an
# axis type by its index in the list its tab shows: the others' left out.
_A1111 = ("Nothing", "Seed", "Var. seed", "Var. strength", "Steps", "Hires steps [t]", "CFG Scale",
          "Image CFG Scale [i]", "Prompt S/R", "Prompt order", "Sampler [t]", "Hires sampler [t]", "Sampler [i]",
          "Checkpoint name", "Negative Guidance minimum sigma", "Sigma Churn", "Sigma min", "Sigma max",
          "Sigma noise", "Schedule type", "Schedule min sigma", "Schedule max sigma", "Schedule rho",
          "Beta schedule alpha", "Beta schedule beta", "Eta", "Clip skip", "Denoising", "Initial noise multiplier",
          "Extra noise", "Hires upscaler [t]", "Cond. Image Mask Weight [i]", "VAE", "Styles", "UniPC Order",
          "Face restore", "Token merging ratio", "Token merging ratio high-res", "Always discard next-to-last sigma",
          "SGM noise multiplier", "Refiner checkpoint", "Refiner switch at", "RNG source", "FP8 mode", "Size")


def a1111_axis_labels(img2img: bool = False) -> tuple[str, ...]:
    """A1111's axis types as its txt2img (or img2img) tab lists them: script_args' x_type indexes these."""
    other = " [t]" if img2img else " [i]"
    return tuple(label.removesuffix(" [t]").removesuffix(" [i]") for label in _A1111 if not label.endswith(other))


@dataclass(frozen=True)
class AxisType:
    """An axis type offered here: A1111's label, the form's field it sets (None: Nothing; Prompt S/R
    and Prompt order rewrite the prompts), how its values read ("int", "float", "text", or "order":
    every order of the words listed), whether A1111 gives its values from a dropdown (unless
    csv_mode), and whether a label is the value alone (else "Label: value")."""
    label: str
    field: str | None
    kind: str
    dropdown: bool = False
    bare: bool = False


AXIS_TYPES = (AxisType("Nothing", None, "text", bare=True), AxisType("Seed", "seed", "int"),
              AxisType("Steps", "steps", "int"), AxisType("Hires steps", "hires_steps", "int"),
              AxisType("CFG Scale", "guidance", "float"), AxisType("Prompt S/R", "prompt", "text", bare=True),
              AxisType("Prompt order", "prompt", "order", bare=True),
              AxisType("Sampler", "sampler", "text", dropdown=True, bare=True),
              AxisType("Schedule type", "schedule", "text", dropdown=True),
              AxisType("Denoising", "strength", "float"),  # (txt2img: the hires pass's, as A1111's)
              AxisType("Hires upscaler", "hires_upscaler", "text", dropdown=True),
              AxisType("Styles", "style", "text", dropdown=True), AxisType("RNG source", "rng", "text", dropdown=True),
              AxisType("Size", "size", "text"))
BY_LABEL = {t.label: t for t in AXIS_TYPES}


@dataclass(frozen=True)
class Axis:
    """An axis's checked values (each as the form's field takes it) and their labels."""
    type: AxisType
    values: tuple[Any, ...]  # checked, as the form's fields take them (a size as (width, height))
    labels: tuple[str, ...]  # as A1111 writes them on the grid
    text: str = ""  # the values as given (A1111's "X Values" in the grid's parameters)


NOTHING = Axis(AXIS_TYPES[0], (None,), ("",))


# -- values, as A1111's process_axis reads them ----------------------------------------------------

_INT, _FLOAT = r"([+-]?\s*\d+)", r"([+-]?\s*\d+(?:.\d*)?)"  # (A1111's: its . is any character)
RANGE = re.compile(rf"\s*{_INT}\s*-\s*{_INT}(?:\s*\(([+-]\d+)\s*\))?\s*")
RANGE_FLOAT = re.compile(rf"\s*{_FLOAT}\s*-\s*{_FLOAT}(?:\s*\(([+-]\d+(?:.\d*)?)\s*\))?\s*")
COUNT = re.compile(rf"\s*{_INT}\s*-\s*{_INT}(?:\s*\[(\d+)\s*])?\s*")
COUNT_FLOAT = re.compile(rf"\s*{_FLOAT}\s*-\s*{_FLOAT}(?:\s*\[(\d+(?:.\d*)?)\s*])?\s*")
FORMS = {"int": "a whole number or a range: 1-5, 1-10 (+2), 10-1 (-3), 5-20 [4]",
         "float": "a number or a range: 1.5-3 (+0.5), 1-2 [5]"}


def split_values(text: str) -> list[str]:
    """Comma-separated values, "quoted, with commas", over any number of lines, each stripped."""
    try:
        return [v.strip() for row in csv.reader(io.StringIO(text), skipinitialspace=True) for v in row]
    except csv.Error as e:
        raise RequestError(f"the values do not read as comma-separated text ({e}).") from None


def parse_values(values: str | Sequence[str], kind: str, max_values: int = MAX_VALUES) -> list:
    """An axis's values as A1111 reads them: numbers and their ranges expanded ("int", "float"; empty
    values skipped), text as given ("text"), or every order of the words ("order"); RequestError
    where A1111 would fail, where a range makes nothing, or past `max_values`."""
    given = split_values(values) if isinstance(values, str) else [v.strip() for v in values]
    if kind in ("text", "order"):
        count = math.factorial(len(given)) if kind == "order" else len(given)
        if count > max_values:
            raise RequestError(f"{count:,} values; at most {max_values} an axis.")
        return list(itertools.permutations(given)) if kind == "order" and given else given
    made: list = []
    for value in (v for v in given if v):
        made += _numbers(value, kind == "int", max_values - len(made))
    return made


def _numbers(value: str, whole: bool, room: int) -> list:
    """One value: a number, `a-b` or `a-b (+step)` (b included: range(a, b + 1, step) or arange(a, b +
    step, step), as A1111's), or `a-b [count]` (evenly spaced; whole numbers cut, not rounded); at
    most `room` of them."""
    try:
        if len(value) > MAX_NUMBER_CHARS:
            raise ValueError
        count, make = _whole(value) if whole else _decimal(value)
    except RequestError:
        raise
    except (ValueError, OverflowError):
        raise RequestError(f"{shown(value)} is not {FORMS['int' if whole else 'float']}.") from None
    if count > room:
        raise RequestError(f"{shown(value)} makes {count:,} values; the axis has room for {room} more.")
    if not (made := make()):
        hint = "" if "[" in value else " (a range down takes a negative step: 10-1 (-3))"
        raise RequestError(f"{shown(value)} makes no values{hint}.")
    return made


def _int(text: str) -> int:
    return int("".join(text.split()))  # (A1111's int() refuses "- 5": taken here)


def _float(text: str) -> float:
    return float("".join(text.split()))


def _whole(value: str) -> tuple[int, Callable[[], list]]:
    """How many whole numbers `value` makes, and how to make them."""
    if m := RANGE.fullmatch(value):
        made = range(_int(m[1]), _int(m[2]) + 1, 1 if m[3] is None else _nonzero(_int(m[3]), value))
        return len(made), lambda: list(made)
    if m := COUNT.fullmatch(value):
        count, low, high = 1 if m[3] is None else int(m[3]), _int(m[1]), _int(m[2])
        return count, lambda: [int(v) for v in np.linspace(low, high, count).tolist()]
    one = _int(value)
    return 1, lambda: [one]


def _decimal(value: str) -> tuple[int, Callable[[], list]]:
    """How many numbers `value` makes, and how to make them (np.arange's count, computed as it does)."""
    if m := RANGE_FLOAT.fullmatch(value):
        start, end, step = _float(m[1]), _float(m[2]), 1.0 if m[3] is None else _nonzero(_float(m[3]), value)
        return math.ceil((end + step - start) / step), lambda: np.arange(start, end + step, step).tolist()
    if m := COUNT_FLOAT.fullmatch(value):
        count, low, high = 1 if m[3] is None else int(m[3]), _float(m[1]), _float(m[2])
        return count, lambda: np.linspace(low, high, count).tolist()
    one = _float(value)
    return 1, lambda: [one]


def _nonzero(step: Any, value: str) -> Any:
    if step == 0:
        raise RequestError(f"{shown(value)}: a range's step must not be 0.")
    return step


# -- axes, checked as the form's fields are ----------------------------------------------------

def axis_type(which: Any, img2img: bool = False, name: str = "X") -> AxisType:
    """An axis type by A1111's index (script_args') or label (the parameters text's "X Type")."""
    labels = a1111_axis_labels(img2img)
    tab = "img2img" if img2img else "txt2img"
    if which is None:
        which = 0  # (A1111's: `x_type or 0`)
    if isinstance(which, bool) or not isinstance(which, (int, str)):
        raise RequestError(f"{name} type must be the index of one of A1111's axis types or its label, got "
                           f"{json_type(which)}.")
    if isinstance(which, int) and not 0 <= which < len(labels):
        raise RequestError(f"{name} type {which} is not one of A1111's {tab} axis types (0 to {len(labels) - 1}).")
    label = labels[which] if isinstance(which, int) else next(
        (label for label in labels if label.lower() == which.strip().lower()), None)
    if label not in BY_LABEL:
        offered = ", ".join(f"{t} ({labels.index(t)})" for t in BY_LABEL if t in labels)
        what = shown(which) if label is None else f"{which} ({label})" if isinstance(which, int) else shown(label)
        raise RequestError(f"{name} type {what} is not offered here; the {tab} axis types offered: {offered}.")
    chosen = BY_LABEL[label]
    return dataclasses.replace(chosen, field="hires_strength") if chosen.field == "strength" and not img2img else chosen


def axis(which: Any, values: Any = "", dropdown: Any = None, *, name: str = "X", img2img: bool = False,
         csv_mode: bool = False, samplers: Sequence[str] | None = None, sizes: Sequence[tuple[int, int]] | None = None,
         no_fixed_seeds: bool = False, max_values: int = MAX_VALUES) -> Axis:
    """A checked axis: `which` as axis_type takes it, its `values` text (or, for A1111's dropdown
    types unless `csv_mode`, the `dropdown` list: the text where that is empty); `samplers` and
    `sizes`: those offered (default: every sampler, any size). A Seed of -1 is drawn now (as A1111
    fixes axis seeds) unless `no_fixed_seeds`."""
    t = axis_type(which, img2img, name)
    if t.field is None:
        return NOTHING
    use_list = t.dropdown and not csv_mode and dropdown not in (None, [])
    given = dropdown if use_list else values
    if use_list and (not isinstance(given, list) or not all(isinstance(v, str) for v in given)):
        raise RequestError(f"{name} values (dropdown) must be a list of text, got {json_type(given)}.")
    if not use_list and not isinstance(given, (str, type(None))):
        raise RequestError(f"{name} values must be text, got {json_type(given)}.")
    given = given or ""
    if (len(given) if isinstance(given, str) else sum(map(len, given))) > MAX_PROMPT_CHARS:
        raise RequestError(f"{name} values are longer than {MAX_PROMPT_CHARS:,} characters.")
    try:
        raw = parse_values(given, t.kind, max_values)
        if not raw:
            raise RequestError(f"give at least one value for {t.label}.")
        if t.label == "Prompt S/R" and not raw[0]:
            raise RequestError("the first value is the text to replace: it must not be empty.")
        checked: list[Any] = [_checked(t.field, v, samplers, sizes) for v in raw]
    except RequestError as e:
        raise RequestError(f"{name} values ({t.label}): {e}") from None
    if t.field == "seed" and not no_fixed_seeds:
        checked = [random_seed() if v == RANDOM_SEED else v for v in checked]
    shown_values = raw if t.kind == "text" else [", ".join(map(str, v)) if t.kind == "order" else v for v in checked]
    labels = [f"{round(v, 8) if isinstance(v, float) else v}" for v in shown_values]
    text = given if isinstance(given, str) else _csv(given)
    return Axis(t, tuple(checked), tuple(v if t.bare else f"{t.label}: {v}" for v in labels), text)


def _csv(values: list[str]) -> str:
    with io.StringIO() as out:
        csv.writer(out).writerow(values)
        return out.getvalue().strip()


def _checked(name: str, value: Any, samplers: Sequence[str] | None, sizes: Sequence[tuple[int, int]] | None) -> Any:
    """One value as the form's field `name` takes it, with the field's own checks."""
    f = FIELD[name]
    if name == "seed":
        return seed_input(value, f.label)
    if f.limits is not None:
        number = number_input(value, f.label, *f.bounds, whole=f.kind == "whole")
        return int(number) if f.kind == "whole" else float(number)
    if name == "size":
        return parse_size(value) if sizes is None else size_input(value, sizes)
    if name == "schedule":
        if value.lower() not in SCHEDULE_NAMES:
            raise RequestError(not_a_choice(f.label, value, f.names))
        return SCHEDULE_NAMES[value.lower()]
    if name == "rng" and value.upper() in ("GPU", "NV"):
        raise RequestError(f"RNG source {value.upper()} (A1111's GPU noise) is not made here: choose CPU (A1111's CPU "
                           f"noise, as it draws it) or JAX.")
    choices = {"sampler": samplers or SAMPLERS, "hires_upscaler": UPSCALERS, "style": list(STYLES), "rng": RNGS}
    if name in choices:  # (in any case, as A1111 finds a sampler)
        found = {c.lower(): c for c in choices[name]}.get(value.lower())
        if found is None:
            raise RequestError(not_a_choice(f.label, value, choices[name]))
        return found
    return value  # (Prompt S/R's text; the prompts it makes are checked when made)
