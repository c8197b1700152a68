"""AUTOMATIC1111's X/Y/Z plot script (its scripts/xyz_grid, 1.10) in this project's terms, in plain
Python: /sdapi/v1's script_args read into a Plot of three checked axes (xyz_axes.py), the plot's
cells in A1111's order (x fastest, then y, then z), each the form's fields it sets and its labels, and
the cells packed into calls, those that can share a compiled call together. The grid the images make
is imaging/grid.py's.

A plot has at most the cells its caller allows, and a prompt that Prompt S/R makes at most the
prompt's limit; every refusal is one line."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..request.errors import RequestError
from ..request.fields import FIELD, FIELDS, MAX_PROMPT_CHARS, MAX_SEED, RANDOM_SEED
from ..request.request import PER_IMAGE, random_seed
from ..request.styles import apply_style
from ..request.values import json_type, number_input, schedule_input, seed_input, shown
from .infotext import quoted
from .xyz_axes import MAX_VALUES, NOTHING, Axis, axis

MAX_CELLS = 64  # in one plot, unless its caller says (one /sdapi/v1 request's images: a1111_api.MAX_IMAGES)
SCRIPT_NAME = "x/y/z plot"  # its title as /sdapi/v1's script_name gives it (in any case)
# A1111's run()'s parameters after p, in order: what script_args holds.
SCRIPT_ARGS = ("x_type", "x_values", "x_values_dropdown", "y_type", "y_values", "y_values_dropdown", "z_type",
               "z_values", "z_values_dropdown", "draw_legend", "include_lone_images", "include_sub_grids",
               "no_fixed_seeds", "vary_seeds_x", "vary_seeds_y", "vary_seeds_z", "margin_size", "csv_mode")

# What one call's images may differ in (request.PER_IMAGE); a style only rewrites the prompts.
PER_IMAGE_FIELDS = frozenset({f.name for f in FIELDS if f.api in PER_IMAGE} | {"style"})
BY_API = {f.api: f.name for f in FIELDS if f.api}


@dataclass(frozen=True)
class Plot:
    """Three axes and how A1111 makes and shows the plot (script_args' flags)."""
    x: Axis = NOTHING
    y: Axis = NOTHING
    z: Axis = NOTHING
    draw_legend: bool = True
    include_lone_images: bool = False
    include_sub_grids: bool = False
    no_fixed_seeds: bool = False  # A1111's "Keep -1 for seeds": each cell draws its own
    vary_seeds: tuple[bool, bool, bool] = (False, False, False)  # along x, y, z: seed + the cell's offset
    margin_size: int = 0

    @property
    def count(self) -> int:
        return len(self.x.values) * len(self.y.values) * len(self.z.values)


@dataclass(frozen=True)
class Cell:
    """One image of the plot: the form's fields it sets over the request's, and its axes' labels."""
    index: int  # A1111's: ix + iy * len(xs) + iz * len(xs) * len(ys), where its image goes
    position: tuple[int, int, int]  # (ix, iy, iz)
    fields: dict[str, Any]  # the form's fields it sets by name: seed always, prompt and negative where rewritten
    labels: tuple[str, str, str]


@dataclass(frozen=True)
class Call:
    """Cells one call makes: the request's fields with `fields` over them, each cell's own per image."""
    fields: dict[str, Any]  # what its images share (of the fields the cells set)
    cells: tuple[Cell, ...]


def script_plot(args: Any, *, img2img: bool = False, samplers: Sequence[str] | None = None,
                sizes: Sequence[tuple[int, int]] | None = None, max_values: int = MAX_VALUES,
                max_cells: int = MAX_CELLS) -> Plot:
    """/sdapi/v1's script_args for "x/y/z plot" (SCRIPT_ARGS' order, A1111 1.10's: those after the
    nine of the axes may be left out, then A1111's defaults) as a checked Plot."""
    if not isinstance(args, (list, tuple)) or not 9 <= len(args) <= len(SCRIPT_ARGS):
        got = f"{len(args)} values" if isinstance(args, (list, tuple)) else json_type(args)
        raise RequestError(f"script_args for the X/Y/Z plot: 9 to {len(SCRIPT_ARGS)} values in A1111's order "
                           f"({', '.join(SCRIPT_ARGS)}); got {got}.")
    given: dict[str, Any] = dict(zip(SCRIPT_ARGS, args))
    flags: dict[str, Any] = {}
    for key in SCRIPT_ARGS[9:]:
        value = given.get(key)
        if key == "margin_size":
            flags[key] = 0 if value is None else int(number_input(value, f"script_args {key}", 0, 500, whole=True))
        elif value is not None and not isinstance(value, bool):
            raise RequestError(f"script_args {key} must be true or false, got {json_type(value)}.")
        else:
            flags[key] = key == "draw_legend" if value is None else value
    x, y, z = (axis(given[f"{n}_type"], given[f"{n}_values"], given[f"{n}_values_dropdown"], name=n.upper(),
                    img2img=img2img, csv_mode=flags["csv_mode"], samplers=samplers, sizes=sizes,
                    no_fixed_seeds=flags["no_fixed_seeds"], max_values=max_values) for n in "xyz")
    plot = Plot(x, y, z, flags["draw_legend"], flags["include_lone_images"], flags["include_sub_grids"],
                flags["no_fixed_seeds"], (flags["vary_seeds_x"], flags["vary_seeds_y"], flags["vary_seeds_z"]),
                flags["margin_size"])
    _within(plot, max_cells)
    return plot


def _within(plot: Plot, max_cells: int) -> None:
    if plot.count > max_cells:
        sizes = "x".join(str(len(a.values)) for a in (plot.x, plot.y, plot.z))
        raise RequestError(f"The X/Y/Z plot has {plot.count} cells ({sizes}); at most {max_cells} are made here.")


# -- the cells, and the calls that make them ----------------------------------------------------

def cells(plot: Plot, base: Mapping[str, Any], *, max_cells: int = MAX_CELLS,
          max_chars: int = MAX_PROMPT_CHARS) -> list[Cell]:
    """The plot's cells in A1111's order, each applying the x, then y, then z value to the request
    `base` (the form's values by field name: prompt, negative and seed are read; the others, to
    check what a cell sets against them). A seed of -1 is drawn once for all cells, as A1111 fixes
    it, unless no_fixed_seeds (then each image draws its own)."""
    _within(plot, max_cells)
    seed = seed_input(RANDOM_SEED if base.get("seed") is None else base["seed"], FIELD["seed"].label)
    seed = random_seed() if seed == RANDOM_SEED and not plot.no_fixed_seeds else seed
    axes = (plot.x, plot.y, plot.z)
    nx, ny, _ = (len(a.values) for a in axes)
    dims = (1, nx if plot.vary_seeds[0] else 1, (nx if plot.vary_seeds[0] else 1) * (ny if plot.vary_seeds[1] else 1))
    if not all(isinstance(base.get(k) or "", str) for k in ("prompt", "negative")):
        raise RequestError("The X/Y/Z plot takes one prompt and one negative prompt, each text (not a list).")
    made = []
    for (iz, z), (iy, y), (ix, x) in itertools.product(*(enumerate(a.values) for a in reversed(axes))):
        prompt, negative = base.get("prompt") or "", base.get("negative") or ""
        fields: dict[str, Any] = {"seed": seed}
        for a, value in zip(axes, (x, y, z)):
            if a.type.label == "Prompt S/R":
                if (search := a.values[0]) not in prompt and search not in negative:
                    raise RequestError(f"Prompt S/R did not find {shown(search)} in the prompt or the negative prompt.")
                prompt, negative = (_replace(t, search, value, max_chars) for t in (prompt, negative))
            elif a.type.kind == "order":
                prompt = _ordered(prompt, value)
            elif a.type.field is not None:
                fields[a.type.field] = value
        if fields["seed"] != RANDOM_SEED:  # (A1111 adds to -1 too: each cell draws its own here)
            offset = sum(i * d for i, d, vary in zip((ix, iy, iz), dims, plot.vary_seeds) if vary)
            fields["seed"] = (fields["seed"] + offset) % (MAX_SEED + 1)
        if any(a.type.field == "prompt" for a in axes):
            fields.update(prompt=prompt, negative=negative)
        _fits(fields, base)
        made.append(Cell(ix + iy * nx + iz * nx * ny, (ix, iy, iz), fields,
                         (plot.x.labels[ix], plot.y.labels[iy], plot.z.labels[iz])))
    return made


def _replace(text: str, search: str, value: str, limit: int) -> str:
    """Prompt S/R in one prompt, the prompt made at most `limit` characters."""
    grown = len(text) + text.count(search) * (len(value) - len(search))
    if grown > limit:
        raise RequestError(f"Prompt S/R: {shown(value)} for {shown(search)} makes a prompt of {grown:,} characters; "
                           f"at most {limit:,} are accepted.")
    return text.replace(search, value)


def _ordered(prompt: str, order: tuple[str, ...]) -> str:
    """Prompt order: the words, where they stand in the prompt, put in `order` (A1111's apply_order)."""
    if missing := [w for w in order if w not in prompt]:
        raise RequestError(f"Prompt order did not find {shown(missing[0])} in the prompt.")
    parts = []
    for _, word in sorted(((prompt.find(w), w) for w in order), key=lambda t: t[0]):
        at = prompt.find(word)
        parts.append(prompt[:at])
        prompt = prompt[at + len(word):]
    return "".join(part + word for part, word in zip(parts, order)) + prompt


def _fits(fields: dict[str, Any], base: Mapping[str, Any]) -> None:
    """A cell's fields against the request's: what applies with another field has it, and its
    sampler runs on its Schedule type."""
    merged = {**base, **fields}
    for name in fields:
        missing = next((n for n in FIELD[name].needs if merged.get(n) in (None, False)), None)
        if missing is not None:
            raise RequestError(f"The X/Y/Z plot sets {FIELD[name].label}, which applies with {FIELD[missing].label}: "
                               f"give it too.")
    if merged.get("sampler") is not None and merged.get("schedule") is not None:
        schedule_input(merged["sampler"], merged["schedule"])


def calls(plot_cells: Sequence[Cell], per_call: int) -> list[Call]:
    """The cells packed into calls of at most `per_call` images: cells that differ only in what a
    call's images may differ in (PER_IMAGE_FIELDS: seed, prompts, guidance, style) share calls, full
    but the last of each kind; the kinds in the order of their first cell."""
    if per_call < 1:
        raise ValueError(f"per_call must be at least 1, got {per_call}")
    groups: dict[tuple, list[Cell]] = {}
    for cell in plot_cells:
        shared = tuple(sorted((k, v) for k, v in cell.fields.items() if k not in PER_IMAGE_FIELDS))
        groups.setdefault(shared, []).append(cell)
    return [Call(dict(shared), tuple(group[i:i + per_call]))
            for shared, group in groups.items() for i in range(0, len(group), per_call)]


def call_fields(fields: Mapping[str, Any], style: str | None, call: Call) -> dict[str, Any]:
    """One call's request fields by API name (Request.of's): what its cells share over the request's
    `fields` (by API name), and per image (lists) the seed, prompts and guidance, each cell's style
    (else `style`) applied to its prompts; `count` its cells."""
    api = lambda name: FIELD[name].api or name  # noqa: E731 (every field a cell sets has one)
    shared = {api(name): value for name, value in call.fields.items() if name != "style"}
    each: dict[str, list] = {"prompt": [], "negative_prompt": [], "seed": [], "guidance_scale": []}
    for cell in call.cells:
        own = {**fields, **shared, **{api(n): v for n, v in cell.fields.items() if n != "style"}}
        prompt, negative = own["prompt"], own.get("negative_prompt", "")
        if (cell_style := cell.fields.get("style", style)) is not None:
            prompt, negative = apply_style(cell_style, prompt, negative)
        for key, value in (("prompt", prompt), ("negative_prompt", negative), ("seed", own.get("seed", -1)),
                           ("guidance_scale", own.get("guidance_scale"))):
            each[key].append(value)
    if any(v is None for v in each["guidance_scale"]):  # (left out: the default, for every image)
        del each["guidance_scale"]
    return {**fields, **shared, **each, "count": len(call.cells)}


def call_plan(plot: Plot, fields: Mapping[str, Any], style: str | None, per_call: int, *,
              max_cells: int = MAX_CELLS) -> list[tuple[Call, dict[str, Any]]]:
    """The plot over a request's `fields` (by API name, Request.of's; `style` not yet applied): its
    cells packed into calls of at most `per_call` images, each with its request fields (call_fields)."""
    by_name = {BY_API.get(k, k): v for k, v in fields.items()}
    plot_cells = cells(plot, {**by_name, "style": style}, max_cells=max_cells)
    return [(call, call_fields(fields, style, call)) for call in calls(plot_cells, per_call)]


def within_grid(made: Iterable[tuple[tuple[int, int], int]]) -> None:
    """Refuses, before anything runs, a plot whose grid would pass imaging/grid.py's bound (A1111's
    img_max_size_mp): `made`, each call's images' size (a hires fix's: the larger) and count."""
    from ..imaging.grid import MAX_GRID_PIXELS

    if (pixels := sum(w * h * n for (w, h), n in made)) > MAX_GRID_PIXELS:
        raise RequestError(f"The X/Y/Z plot's grid would be {pixels / 1e6:,.0f} megapixels; at most "
                           f"{MAX_GRID_PIXELS // 1_000_000} are made.")


def plot_grids(plot: Plot, images: Sequence[Any]) -> list[Any]:
    """The plot's grids (PIL images) from its cells' images in A1111's order, as its flags say
    (imaging/grid.py's xyz_grids): the grid, then with include_sub_grids each z value's."""
    from ..imaging.grid import xyz_grids

    return xyz_grids(images, plot.x.labels, plot.y.labels, plot.z.labels, draw_legend=plot.draw_legend,
                     margin_size=plot.margin_size, include_sub_grids=plot.include_sub_grids)


def grid_parameters(plot: Plot, first: str) -> str:
    """The grids' parameters text, A1111's: the first cell's (`first`) with the plot's axes."""
    axes = ", ".join(f"{n} Type: {a.type.label}, {n} Values: {quoted(a.text)}"
                     for n, a in zip("XYZ", (plot.x, plot.y, plot.z)) if a.type.label != "Nothing")
    return f"{first}, Script: X/Y/Z plot, {axes}"
