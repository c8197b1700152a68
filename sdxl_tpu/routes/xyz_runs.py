"""AUTOMATIC1111's X/Y/Z plot through /sdapi/v1/txt2img and img2img (`script_name: "x/y/z plot"`,
`script_args` in A1111's order: a1111/xyz_plot.py): the plot's cells packed into full calls (cells
that differ only in seed, prompts, guidance or style share one), progress over the whole plot,
Interrupt stopping it between calls, and the answer as A1111's: the grid (then each z value's grid,
with include_sub_grids) first, then, with include_lone_images, every cell's image; `info` with each
image's parameters text, the grid's first."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
from typing import Any

from PIL import Image
from starlette.requests import Request as HTTPRequest

from ..a1111.a1111_api import MAX_IMAGES, info_json
from ..a1111.images import encode_all
from ..a1111.xyz_plot import call_plan, grid_parameters, plot_grids, script_plot
from ..request.errors import Cancelled
from ..server.core import Server
from ..version import VERSION
from .http_io import checked_request
from .many_images import one_call


async def plot_generate(server: Server, jobs: Any, http: HTTPRequest, data: dict[str, Any], fields: dict[str, Any],
                        image_format: str, style: str | None, img2img: bool) -> dict[str, Any]:
    """The plot of `data`'s script_args over the request `fields` (by API name, its style not yet applied)."""
    offer = server.offer
    plot = script_plot(data.get("script_args"), img2img=img2img, samplers=offer.samplers, sizes=offer.sizes,
                       max_cells=MAX_IMAGES)
    batches = call_plan(plot, fields, style, offer.images_per_call, max_cells=MAX_IMAGES)
    made: dict[int, tuple[bytes, str, Any]] = {}  # each cell's file, its parameters text, its ImageInfo
    jobs.begin(len(batches))
    try:
        for done, (call, call_request) in enumerate(batches):
            jobs.next_call(done)
            if jobs.interrupted:
                break
            request, _ = await asyncio.to_thread(checked_request, call_request, server)
            try:
                out = await one_call(server, http, request, image_format, jobs.report, lambda: jobs.interrupted)
            except Cancelled:
                if jobs.interrupted:  # (A1111 answers with what it made)
                    break
                raise
            infos = [dataclasses.replace(i, sampler=out.sampler, schedule=out.schedule)
                     for i in request.images(len(call.cells))]
            for cell, file, text, info in zip(call.cells, out.files, out.parameters, infos):
                made[cell.index] = (file, text, info)
            server.metrics.count_images(len(out.files), out.timings.get("encoding", 0.0))
    finally:
        jobs.end()
    ordered = [made[i] for i in sorted(made)]
    if len(made) < plot.count:  # interrupted: the cells made, no grid
        return _answer(data, ordered, offer.model, style)
    # The grids, their parameters the first cell's with the plot's axes (A1111's), in the cells' format.
    grid_text, first_info = grid_parameters(plot, ordered[0][1]), ordered[0][2]

    def grid_files() -> list[bytes]:
        grids = plot_grids(plot, [Image.open(io.BytesIO(file)).convert("RGB") for file, _, _ in ordered])
        return encode_all(grids, [grid_text] * len(grids), image_format)

    grids = await asyncio.to_thread(grid_files)
    return _answer(data, [(grid, grid_text, first_info) for grid in grids]
                   + (ordered if plot.include_lone_images else []), offer.model, style)


def _answer(data: dict[str, Any], images: list[tuple[bytes, str, Any]], model: str,
            style: str | None) -> dict[str, Any]:
    """A1111's answer of `images` (each file, its parameters text and its ImageInfo), in order."""
    texts, infos = [text for _, text, _ in images], [info for _, _, info in images]
    send = data.get("send_images", True) is not False
    info = info_json(infos, texts, model, None, [style] if style else [], VERSION) if infos else "{}"
    echoed = {k: v for k, v in data.items() if k not in ("init_images", "mask")}
    return {"images": [base64.b64encode(f).decode("ascii") for f, _, _ in images] if send else [], "parameters": echoed,
            "info": info}


__all__ = ["plot_generate"]
