"""AUTOMATIC1111's web API, /sdapi/v1, on the same server as everything else (a1111/a1111_api.py
reads its bodies): the same request checks, queue, batching (a request of batch_size 1 shares a
compiled call with others), cancellation and drain. batch_size x n_iter images are made a call's
worth at a time, seeds following on as A1111's. What its clients read: images as base64 PNG with
their parameters text, `parameters` (the request) and `info` (A1111's JSON string).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import threading
import time
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..a1111.a1111_api import SCHEDULER_NAMES, SETTINGS_TAKEN, generation_fields, info_json, script_named
from ..a1111.xyz_plot import SCRIPT_NAME
from ..a1111.controlnet_units import model_list, module_list
from ..request.errors import Cancelled, RequestError
from ..imaging.image_input import from_base64
from ..a1111.images import encode_preview
from ..a1111.infotext import parse as parse_parameters
from ..a1111.png_info import png_info
from ..request.styles import STYLES, apply_style
from ..version import VERSION
from ..request.calls import split
from .many_images import one_call
from .xyz_runs import plot_generate
from ..server.events import Ended, Preview, Progress
from ..server.core import Server
from .http_io import RETRY_AFTER, checked_request, error_response, json_body, logged_status, read_body

log = logging.getLogger("sdxl_tpu.routes.sdapi")
PREFIX = "/sdapi/v1"


class Jobs:
    """What /progress reports and /interrupt stops: the A1111 requests running, as A1111's one
    shared state reads (the latest request's step, its calls so far, its last preview)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.interrupted = False
        self.skipped = False
        self.job_no = self.job_count = self.step = self.steps = 0
        self.started = time.monotonic()
        self.preview: Any = None  # the latest preview's first image (array, or a back end's JPEG)

    def begin(self, calls: int) -> None:
        with self.lock:
            if self.running == 0:
                self.interrupted = False
            self.running += 1
            self.job_no, self.job_count, self.step, self.steps = 0, calls, 0, 0
            self.started, self.preview = time.monotonic(), None

    def report(self, event: Progress | Preview | Ended) -> None:
        with self.lock:
            if isinstance(event, Progress):
                self.step, self.steps = event.step, event.steps
            elif isinstance(event, Preview) and len(event.images):
                self.preview = event.images[0]

    def next_call(self, done: int) -> None:
        with self.lock:
            self.job_no, self.step, self.skipped = done, 0, False

    def end(self) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0:  # (idle: A1111's progress reads zeros)
                self.job_no = self.job_count = self.step = self.steps = 0

    def progress(self) -> dict[str, Any]:
        with self.lock:
            share = (self.job_no + (self.step / self.steps if self.steps else 0)) / max(self.job_count, 1)
            share = share if self.running else 0.0
            elapsed = time.monotonic() - self.started
            preview = self.preview
            state = {"skipped": self.skipped, "interrupted": self.interrupted, "stopping_generation": False,
                     "job": "" if not self.running else f"task({self.job_no + 1}/{self.job_count})",
                     "job_count": self.job_count if self.running else 0, "job_timestamp": "0",
                     "job_no": self.job_no, "sampling_step": self.step, "sampling_steps": self.steps}
        image = None
        if preview is not None:
            image = base64.b64encode(preview if isinstance(preview, bytes) else encode_preview(preview)).decode()
        return {"progress": share, "eta_relative": elapsed / share - elapsed if share > 0 else 0.0, "state": state,
                "current_image": image, "textinfo": None, "current_task": None}


def sdapi_routes(server: Server) -> list[Route]:
    """The /sdapi/v1 routes of `server`."""
    jobs = Jobs()

    async def generation(http: HTTPRequest, img2img: bool) -> Response:
        if server.warmup.status in ("loading", "error"):
            return error_response(503, server.warmup.message, RETRY_AFTER["loading"])
        try:
            data = json_body(await read_body(http))
            with server.metrics.counted(time.monotonic(), http.url.path):
                answer = await _generate(server, jobs, http, data, img2img)
        except Exception as e:  # noqa: BLE001 (every failure is an answer)
            return error_response(*logged_status(e, http.url.path, log, "an A1111 API generation"))
        return JSONResponse(answer)

    async def txt2img(http: HTTPRequest) -> Response:
        return await generation(http, img2img=False)

    async def img2img(http: HTTPRequest) -> Response:
        return await generation(http, img2img=True)

    async def progress(http: HTTPRequest) -> Response:
        return JSONResponse(jobs.progress())

    async def interrupt(http: HTTPRequest) -> Response:
        with jobs.lock:
            jobs.interrupted = jobs.running > 0
        return JSONResponse({})

    async def skip(http: HTTPRequest) -> Response:
        with jobs.lock:
            jobs.skipped = jobs.running > 0
        return JSONResponse({})

    async def samplers(http: HTTPRequest) -> Response:
        return JSONResponse([{"name": name, "aliases": [], "options": {}} for name in server.offer.samplers])

    async def schedulers(http: HTTPRequest) -> Response:
        return JSONResponse([{"name": name, "label": label, "aliases": None, "default_rho": -1,
                              "need_inner_model": False}
                             for name, label in SCHEDULER_NAMES.items() if label in server.offer.schedules])

    async def sd_models(http: HTTPRequest) -> Response:
        model = server.offer.model
        return JSONResponse([{"title": model, "model_name": model.rstrip("/").rsplit("/", 1)[-1], "hash": None,
                              "sha256": None, "filename": model, "config": None}])

    async def options(http: HTTPRequest) -> Response:
        current = {"sd_model_checkpoint": server.offer.model, "samples_format": "png", "sd_vae": "Automatic",
                   "CLIP_stop_at_last_layers": 1, "eta_noise_seed_delta": 0,
                   "randn_source": "CPU" if server.offer.default_rng == "CPU" else server.offer.default_rng}
        if http.method == "GET":
            return JSONResponse(current)
        try:  # (settings change nothing here: those that would are refused, the others taken as they are)
            wanted = json_body(await read_body(http))
            unknown = sorted(set(wanted) - SETTINGS_TAKEN)
            if unknown:
                raise RequestError(f"Options {', '.join(unknown[:5])} cannot be set here; the image settings "
                                   "are per request (override_settings).")
            for key in ("sd_model_checkpoint", "randn_source"):
                if key in wanted and wanted[key] != current[key]:
                    raise RequestError(f"{key} is {current[key]} on this server and cannot change at run time"
                                       + (f": checkpoint {wanted[key]!r} is not loaded." if key.startswith("sd_")
                                          else "; give randn_source per request in override_settings."))
        except RequestError as e:
            return error_response(422, str(e))
        return JSONResponse({})

    async def read_png_info(http: HTTPRequest) -> Response:
        try:
            image = json_body(await read_body(http)).get("image")
            if not isinstance(image, str):
                raise RequestError("image must be an image file as base64 text (PNG, JPEG or WebP).")
            found = await asyncio.to_thread(png_info, from_base64(image, "Image"), "Image")
        except RequestError as e:
            return error_response(422, str(e))
        text = found.text or ""
        parsed: dict[str, Any] = {}
        if text:
            p = parse_parameters(text)
            parsed = {"Prompt": p.prompt, "Negative prompt": p.negative_prompt, **p.settings}
        return JSONResponse({"info": text, "items": {"parameters": text} if text else {}, "parameters": parsed})

    async def prompt_styles(http: HTTPRequest) -> Response:
        return JSONResponse([{"name": n, "prompt": p, "negative_prompt": q} for n, (p, q) in STYLES.items()])

    async def loras(http: HTTPRequest) -> Response:
        return JSONResponse([{"name": name, "alias": name, "path": name, "metadata": {"fused_scale": scale}}
                             for name, scale in server.offer.loras])

    async def embeddings(http: HTTPRequest) -> Response:  # (A1111's answer; "shape": SDXL's 768 + 1280 a vector)
        entry = lambda n: {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None, "shape": 2048, "vectors": n}
        skipped = server.offer.skipped_embeddings
        return JSONResponse({"loaded": {name: entry(n) for name, n in server.offer.embeddings},
                             "skipped": {name: {**entry(0), "reason": why} for name, why in skipped}})

    async def scripts(http: HTTPRequest) -> Response:
        return JSONResponse({"txt2img": [SCRIPT_NAME], "img2img": [SCRIPT_NAME]})

    async def upscalers(http: HTTPRequest) -> Response:  # (the hires fix's and Extras' pixel upscalers)
        entry = lambda name, model, scale: {"name": name, "model_name": model, "model_path": None, "model_url": None,
                                            "scale": scale}  # (no path: the server's files are its own)
        return JSONResponse([entry("None", None, 4), entry("Lanczos", None, 4),
                             *(entry(name, name, 4) for name in server.offer.upscalers)])

    async def latent_upscale_modes(http: HTTPRequest) -> Response:
        return JSONResponse([{"name": "Latent"}])

    # sd-webui-controlnet's lists, at its own paths
    controlnet_lists = {"model_list": lambda: model_list(server.offer.controlnets), "module_list": module_list,
                        "version": lambda: {"version": 2}}

    def controlnet_route(answer):
        async def route(http: HTTPRequest) -> Response:
            return JSONResponse(answer())
        return route

    get = {"progress": progress, "samplers": samplers, "schedulers": schedulers, "sd-models": sd_models,
           "prompt-styles": prompt_styles, "loras": loras, "embeddings": embeddings, "scripts": scripts,
           "upscalers": upscalers, "latent-upscale-modes": latent_upscale_modes}
    post = {"txt2img": txt2img, "img2img": img2img, "interrupt": interrupt, "skip": skip, "png-info": read_png_info}
    return ([Route(f"{PREFIX}/{name}", fn, methods=["GET"]) for name, fn in get.items()]
            + [Route(f"{PREFIX}/{name}", fn, methods=["POST"]) for name, fn in post.items()]
            + [Route(f"{PREFIX}/options", options, methods=["GET", "POST"])]
            + [Route(f"/controlnet/{name}", controlnet_route(answer), methods=["GET"])
               for name, answer in controlnet_lists.items()])


async def _generate(server: Server, jobs: Jobs, http: HTTPRequest, data: dict[str, Any],
                    img2img: bool) -> dict[str, Any]:
    """One txt2img or img2img body, its images made a call's worth at a time."""
    fields, count, image_format = generation_fields(data, img2img, server.offer.model, server.offer.refiner)
    style = fields.pop("style", None)
    if script_named(data) is not None:
        if count != 1:
            raise RequestError("The X/Y/Z plot makes one image a cell: leave batch_size and n_iter at 1.")
        return await plot_generate(server, jobs, http, data, fields, image_format, style, img2img)
    if style is not None:
        fields["prompt"], fields["negative_prompt"] = apply_style(style, fields["prompt"], fields["negative_prompt"])
    request, _ = await asyncio.to_thread(checked_request, fields, server)
    calls = split(request, count, server.offer.images_per_call)
    images, texts, infos = [], [], []
    jobs.begin(len(calls))
    try:
        for done, one in enumerate(calls):
            jobs.next_call(done)
            if jobs.interrupted:
                break
            try:
                made = await one_call(server, http, one, image_format, jobs.report,
                                      lambda: jobs.interrupted or jobs.skipped)
            except Cancelled:
                if jobs.interrupted or jobs.skipped:  # (A1111 answers with what it made)
                    continue
                raise
            images += [base64.b64encode(f).decode("ascii") for f in made.files]
            texts += made.parameters
            infos += [dataclasses.replace(i, sampler=made.sampler, schedule=made.schedule)
                      for i in one.images(one.count if one.count is not None else len(made.files))]
            server.metrics.count_images(len(made.files), made.timings.get("encoding", 0.0))
    finally:
        jobs.end()
    echoed = {k: v for k, v in data.items() if k not in ("init_images", "mask")}  # (as A1111: not sent back)
    send = data.get("send_images", True) is not False
    info = info_json(infos, texts, server.offer.model, None, [style] if style else [], VERSION) if infos else "{}"
    return {"images": images if send else [], "parameters": echoed, "info": info}


__all__ = ["PREFIX", "Jobs", "sdapi_routes"]
