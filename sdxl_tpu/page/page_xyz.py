"""AUTOMATIC1111's X/Y/Z plot on the page (its Script menu's "X/Y/Z plot"): the panel's values
checked, the plot over the form's fields made into the checked requests of its calls (the cells
packed into full calls by a1111/xyz_plot.py, as the HTTP route and the command line pack them), and
the run's updates as the page shows them: progress over the whole plot (server/core.py's stream),
each call's cells kept in the history as they come (so Stop keeps them), then the grid, its
parameters A1111's, first in the gallery, followed (Include lone images) by every cell's image."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from ..a1111.images import FORMATS, encode_all, read_parameters
from ..a1111.xyz_axes import AXIS_TYPES, axis
from ..a1111.xyz_plot import (MAX_CELLS, PER_IMAGE_FIELDS, Call, Plot, call_plan, grid_parameters, plot_grids,
                              within_grid)
from ..imaging.hires import UPSCALERS as HIRES_UPSCALERS
from ..request.errors import RequestError
from ..request.fields import DEFAULT_STYLE, FIELDS
from ..request.request import Request
from ..request.styles import STYLES
from ..request.values import choice_input, format_size, json_type, text_input
from ..server.core import Server
from ..server.events import Called, Done
from ..server.form import batch_count
from .history import thumbnail
from .page_run import Kept

SCRIPTS = ("None", "X/Y/Z plot")  # A1111's Script menu
XYZ = SCRIPTS[1]
AXIS_LABELS = tuple(t.label for t in AXIS_TYPES)  # the axis types offered, by A1111's labels
# The panel's inputs, in the order the page's run takes them (after the form and the history).
PANEL = ("script", "x_type", "x_values", "y_type", "y_values", "z_type", "z_values", "draw_legend",
         "include_lone_images")
SWITCHES = {"draw_legend": ("Draw legend", True), "include_lone_images": ("Include lone images", False)}
PER_IMAGE_API = ("prompt", "negative_prompt", "seed", "guidance_scale", "count")  # (call_fields' lists, by API name)
GRID_CAPTION = "X/Y/Z plot"


def panel_values(values: Sequence[Any]) -> dict[str, Any]:
    """The panel's values as a client sent them (PANEL's order, any JSON; null: the panel's default)
    checked for what they are, by name: the script, each axis's type and values text (read as
    values only for a plot), the switches. RequestError names what is wrong."""
    given: dict[str, Any] = dict(zip(PANEL, values))
    script = given.get("script")
    checked: dict[str, Any] = {"script": choice_input(SCRIPTS[0] if script is None else script, "Script", SCRIPTS)}
    for n in "XYZ":
        which = given.get(f"{n.lower()}_type")
        checked[f"{n.lower()}_type"] = choice_input(AXIS_LABELS[0] if which is None else which, f"{n} type",
                                                    AXIS_LABELS)
        checked[f"{n.lower()}_values"] = text_input(given.get(f"{n.lower()}_values"), f"{n} values")
    for name, (label, default) in SWITCHES.items():
        value = given.get(name)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"{label} must be true or false, got {json_type(value)}.")
        checked[name] = default if value is None else value
    return checked


class PagePlot:
    """One X/Y/Z plot run from the page: `requests` is the server stream's plan (the plot checked
    over the form's fields), `updates` what the page's run shows of the stream."""

    def __init__(self, server: Server, panel: Mapping[str, Any]):
        self.server, self.panel = server, panel
        self.plot, self.planned, self.values = Plot(), [], {}
        self.made: dict[int, tuple[str, int]] = {}  # each cell's file and seed, by its place in A1111's order
        self.last: Done | None = None

    def requests(self, values: Mapping[str, Any]) -> list[Request]:
        """The checked requests of the plot's calls over the form's fields `values` (by name): the
        form is checked first, as a run checks it; the axes' values as the form's fields (a size or
        sampler this server does not offer is refused: nothing compiles); then each call."""
        server, p, offer = self.server, self.panel, self.server.offer
        server.validate_form(values)
        if batch_count(values) != 1:
            raise RequestError("The X/Y/Z plot makes one image a cell: set Batch count to 1.")
        img2img = values.get("image") is not None  # (its Denoising axis: the image's, else the hires fix's)
        x, y, z = (axis(p[f"{n}_type"], p[f"{n}_values"], name=n.upper(), img2img=img2img, csv_mode=True,
                        samplers=offer.samplers, sizes=offer.sizes) for n in "xyz")
        self.plot = Plot(x, y, z, draw_legend=p["draw_legend"], include_lone_images=p["include_lone_images"])
        self.values = {**values, "negative": values.get("negative") or "",
                       "style": values.get("style") or DEFAULT_STYLE}
        fields = {f.api: self.values.get(f.name) for f in FIELDS if f.api}
        self.planned = call_plan(self.plot, fields, self.values["style"], offer.images_per_call, max_cells=MAX_CELLS)
        requests = []
        for call, call_request in self.planned:
            shared = {name: format_size(v) if name == "size" else v for name, v in call.fields.items()
                      if name not in PER_IMAGE_FIELDS}
            each = {key: call_request[key] for key in PER_IMAGE_API if key in call_request}
            requests.append(server.validate_form({**self.values, **shared}, each))
        within_grid((r.hires.size if r.hires else r.size, len(call.cells)) for (call, _), r in zip(self.planned,
                                                                                                   requests))
        return requests

    def updates(self, updates: Iterable[Any]) -> Iterator[Any]:
        """The stream's updates as page_run takes them: each call's cells kept (Kept) as it ends, and
        for its end the plot's Done: the grid first, then (Include lone images) each cell."""
        called = 0
        for update in updates:
            if isinstance(update, Called):
                called = update.call
                yield self._kept(self.planned[update.call - 1][0], update.done)
            elif isinstance(update, Done):
                if not called:  # (a plot of one call: no Called before its Done)
                    yield self._kept(self.planned[0][0], update)
                yield self._done()
            else:
                yield update

    def _kept(self, call: Call, done: Done) -> Kept:
        """A call's cells, as the history keeps each: the form with the cell's own fields, what ran."""
        self.last, runs = done, []
        for cell, (path, _), seed in zip(call.cells, done.gallery, done.seeds, strict=True):
            self.made[cell.index] = (path, seed)
            own = {name: format_size(v) if name == "size" else v for name, v in cell.fields.items()}
            runs.append({**self.values, **own, **done.ran, "seed": seed, "batch_count": 1, "thumb": thumbnail(path)})
        return Kept(runs)

    def _done(self) -> Done:
        """The grid (written as the cells were: their format, the first cell's parameters with the
        plot's), then each cell's image captioned with its axes' values."""
        from PIL import Image

        plot, order = self.plot, sorted(self.made)
        paths, seeds = [self.made[i][0] for i in order], [self.made[i][1] for i in order]
        images = []
        for path in paths:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
        with Image.open(paths[0]) as image:
            grid_text = grid_parameters(plot, read_parameters(image) or "")
        extension = Path(paths[0]).suffix.lstrip(".")
        grids = plot_grids(plot, images)
        files = encode_all(grids, [grid_text] * len(grids), {v: k for k, v in FORMATS.items()}[extension])
        grid_paths = self.server.images.write(files, range(len(files)), extension, name="xyz-grid")
        cells = [cell for call, _ in self.planned for cell in call.cells]
        labels = {cell.index: ", ".join(label for label in cell.labels if label) for cell in cells}
        gallery = [(path, GRID_CAPTION) for path in grid_paths]
        if plot.include_lone_images:
            gallery += [(path, f"{labels[i]} · seed {seed}".lstrip(" ·")) for i, path, seed in zip(order, paths, seeds)]
        shape = " × ".join(str(len(a.values)) for a in (plot.x, plot.y, plot.z) if a.type.label != "Nothing") or "1"
        last = self.last.summary if self.last is not None else ""
        summary = (f"X/Y/Z plot of {plot.count} images ({shape}) in {len(self.planned)} "
                   f"call{'s' if len(self.planned) > 1 else ''}: the grid"
                   f"{', then each image' if plot.include_lone_images else ''}. The last call: {last}")
        return Done(gallery, [seeds[0]] * len(grid_paths) + (seeds if plot.include_lone_images else []), summary,
                    self.last.ran if self.last is not None else {})


def page_plot(server: Server, panel: Sequence[Any]) -> PagePlot | None:
    """The page's run's plot from the panel's values (any JSON, checked), or None: no script."""
    checked = panel_values(panel)
    return PagePlot(server, checked) if checked["script"] == XYZ else None


def axis_hint(label: Any, server: Server) -> str:
    """What an axis of type `label` takes, for its values box (the choices this server offers)."""
    offer = server.offer
    choices = {"Sampler": offer.samplers, "Schedule type": offer.schedules, "RNG source": offer.rngs,
               "Styles": list(STYLES), "Size": [format_size(s) for s in offer.sizes],
               "Hires upscaler": [*HIRES_UPSCALERS, *offer.upscalers]}
    hints = {"Seed": "5, 6, 7 or 1-10 (+3); -1: a random one", "Steps": "10, 20, 30 or 10-30 [3]",
             "Hires steps": "10, 20 or 10-30 (+10)", "CFG Scale": "3, 5, 7 or 3-7 (+2)",
             "Denoising": "0.3, 0.5, 0.7 or 0.3-0.7 [3]",
             "Prompt S/R": "a word of the prompt, then what replaces it: cat, dog, fox",
             "Prompt order": "words of the prompt, in every order: red, cat, hat"}
    if isinstance(label, str) and label in choices:
        return ", ".join(choices[label])
    return hints.get(label, "") if isinstance(label, str) else ""


def wire_panel(page: Any, server: Server, light: Mapping[str, Any]) -> None:
    """The panel's own events: the Script menu shows it (in the browser), an axis type says what
    its values box takes (its placeholder)."""
    page.script.change(None, inputs=[page.script], outputs=[page.plot_panel],
                       js=f"(s) => ({{__type__: 'update', visible: s === {XYZ!r}}})")

    def values_hint(label: Any):
        return gr.Textbox(placeholder=axis_hint(label, server))

    for n in range(3):
        which, values = page.plot[1 + 2 * n], page.plot[2 + 2 * n]
        which.change(values_hint, inputs=[which], outputs=[values], **light)


__all__ = ["AXIS_LABELS", "PANEL", "SCRIPTS", "SWITCHES", "XYZ", "PagePlot", "axis_hint", "page_plot",
           "panel_values", "wire_panel"]
