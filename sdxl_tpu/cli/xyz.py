"""`generate`'s X/Y/Z plot, AUTOMATIC1111's script (a1111/xyz_plot.py) on the command line: the axes
of --x-type/--x-values (and y, z) read and checked, the plot's cells packed into calls of --images and
each call's Request checked, all before anything loads; then each call run, each cell's PNG and the
grid's written with their own parameters text, as A1111's script writes them.

JAX-free as the rest of cli/: the pipeline is handed in (its `run` and `stamp_for`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..a1111.images import encode, save_png
from ..a1111.infotext import parameters_text
from ..a1111.xyz_plot import Call, Plot, call_plan, grid_parameters, plot_grids, within_grid
from ..a1111.xyz_axes import axis
from ..request.errors import RequestError
from ..request.request import Request
from ..request.values import number_input

MAX_CELLS = 1000  # in one plot made here (the server's is a1111_api.MAX_IMAGES); the grid's pixels bound it too


@dataclass(frozen=True)
class PlotRun:
    """A checked plot and its calls, each with the Request that makes its cells' images."""
    plot: Plot
    calls: tuple[tuple[Call, Request], ...]

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """The sizes its calls run at (a hires fix's larger ones too): what the pipeline compiles."""
        found = [size for _, r in self.calls for size in (r.size, *([r.hires.size] if r.hires else []))]
        return list(dict.fromkeys(found))


def plot_of(args: argparse.Namespace, img2img: bool = False) -> Plot | None:
    """The plot `generate`'s axis options give (None: no axis given); RequestError says what is wrong."""
    given = {n: (getattr(args, f"{n}_type"), getattr(args, f"{n}_values")) for n in "xyz"}
    for n, (which, values) in given.items():
        if which is None and values:
            raise RequestError(f"--{n}-values are the values of an axis: give --{n}-type too.")
    if all(which is None for which, _ in given.values()):
        return None
    margin = int(number_input(args.margin_size, "--margin-size", 0, 500, whole=True))
    x, y, z = (axis(int(which) if which and which.strip().isdigit() else which, values or "", name=n.upper(),
                    img2img=img2img, csv_mode=True) for n, (which, values) in given.items())
    return Plot(x, y, z, draw_legend=args.draw_legend, include_lone_images=True, include_sub_grids=args.sub_grids,
                margin_size=margin)


def plan(plot: Plot, fields: Mapping[str, Any], more: Mapping[str, Any], per_call: int) -> PlotRun:
    """The plot over `generate`'s request `fields` (Request.of's, by API name; `more`: its other
    arguments), its cells in calls of at most `per_call` images, each call's Request checked."""
    planned = tuple((call, Request.of(**call_request, **more))
                    for call, call_request in call_plan(plot, fields, None, per_call, max_cells=MAX_CELLS))
    within_grid((r.hires.size if r.hires else r.size, len(call.cells)) for call, r in planned)
    return PlotRun(plot, planned)


def run(pipe: Any, plot_run: PlotRun, out: Path) -> None:
    """Each call through `pipe.run`, each cell's PNG written as it is made (xyz-NNN.png, NNN its place
    in A1111's order), then the grid (xyz-grid.png; with sub-grids each Z value's, xyz-grid-zN.png);
    the paths and a line per call printed."""
    plot, made = plot_run.plot, {}
    out.mkdir(parents=True, exist_ok=True)
    digits = len(str(plot.count))
    for number, (call, request) in enumerate(plot_run.calls, 1):
        start = time.perf_counter()
        result = pipe.run(request, images=len(call.cells))
        for cell, image, info in zip(call.cells, result.images, result.infos, strict=True):
            path = out / f"xyz-{cell.index + 1:0{digits}d}.png"
            save_png(image, info, path, model=pipe.stamp_for(info))
            print(path)
            made[cell.index] = (image, info)
        print(f"call {number} of {len(plot_run.calls)}: {len(call.cells)} images in "
              f"{time.perf_counter() - start:.3f} s", flush=True)
    ordered = [made[i] for i in sorted(made)]
    first = ordered[0][1]
    text = grid_parameters(plot, parameters_text(first, pipe.stamp_for(first)))
    grids = plot_grids(plot, [image for image, _ in ordered])
    for k, grid in enumerate(grids):
        path = out / ("xyz-grid.png" if k == 0 else f"xyz-grid-z{k}.png")
        path.write_bytes(encode(grid, text, "png"))
        print(path)


__all__ = ["PlotRun", "plan", "plot_of", "run"]
