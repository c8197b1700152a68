"""The model in this process: the pipeline, loaded and compiled, and the batcher that feeds it (an
Engine, engine.py). The one module of the server that imports the generator (JAX)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import jax

from ..generate.compiling.compilation import CompileCounter, before_jax_starts, enable_compile_cache, gpu_unused
from ..generate.call import call_passes
from ..generate.loading import load
from ..generate.compiling.layout import call_batch
from ..generate.pipeline import Pipeline
from ..request.errors import CompileError, GenerationError, RequestError
from ..a1111.images import encode_all
from ..a1111.infotext import parameters_text
from ..request.names import schedule_used
from ..request.request import GenerationResult, Request
from ..request.values import format_size
from ..imaging.upscale import lanczos_by
from .batcher import Batcher, Job
from .engine import Generated, Report, Ticket
from .offer import Offer, provisional
from .settings import Settings, model_not_found_message


def prepare_process(settings: Settings) -> None:
    """Before JAX starts, once per process: no TPU platform where there are no TPU chips (its
    errors would fill the log), the TPU runtime's host buffer sized for a quick start, and the
    persistent compilation cache (a restart reuses programs)."""
    before_jax_starts()
    enable_compile_cache(settings.compile_cache)
    if unused := gpu_unused():
        logging.getLogger("sdxl_tpu").warning(unused)


def compile_first(pipe: Pipeline, guided: bool = True) -> Pipeline:
    """`pipe` compiled for what a first call at its first size runs (text to image, `guided` or not:
    a distilled model's preset runs without guidance), side by side; the rest, and the other sizes,
    follow in the background while it serves."""
    try:
        pipe.warmup(pipe.sizes[:1], pipe.call_programs(guided=guided))
    except Exception as e:
        logging.getLogger("sdxl_tpu").exception("compiling %s failed", format_size(pipe.sizes[0]))
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        raise CompileError(f"The model loaded, but its programs for {format_size(pipe.sizes[0])} did not compile "
                           f"({type(e).__name__}: {first_line}); the log has the whole error. Try fewer images a "
                           "call (--images) or a smaller size, or report it with that log.") from e
    return pipe


def load_and_compile_first(settings: Settings) -> Pipeline:
    """The pipeline of `settings`, loaded, and compiled as compile_first does for the page's
    default guidance (the launch preset's) while its weights are read."""
    guided = first_guided(settings)
    return load(settings.load, warmup=False, compile_cache=settings.compile_cache,
                first=lambda pipe: compile_first(pipe, guided=guided))


def first_guided(settings: Settings) -> bool:
    """Whether a call with the server's defaults is guided (a guidance scale above 1)."""
    return provisional(settings).defaults()["guidance"] > 1


class LocalEngine:
    """The pipeline (from `loader`: settings -> a Pipeline compiled for its first size;
    load_and_compile_first by default) and the batcher that feeds it; `on_call(timings)` after each
    pipeline call (None: the call failed). `max_waiting` bounds the batcher's queue (a back end's;
    the playground's web server has a bounded queue of its own)."""

    loading_message = "Loading the model and compiling what a first image needs; this page will work once that is done."
    no_tokenizer_message = "Token count available once the model is loaded."
    watch_seconds: float | None = None  # the model in this process does not go away

    def __init__(self, settings: Settings, on_call: Callable[[dict[str, float] | None], None] = lambda t: None,
                 loader: Callable[[Settings], Any] | None = None, max_waiting: int | None = None):
        self.settings, self._on_call, self.max_waiting = settings, on_call, max_waiting
        self._loader = loader or load_and_compile_first
        self.pipeline: Any = None
        self.batcher: Batcher | None = None
        self._compiles = CompileCounter().__enter__()  # listens for the life of the process
        self._stored_loaded = False
        self._first_guided = first_guided(settings)  # (asked by every status poll: derived once)

    def failure_message(self, error: Exception) -> str:
        return model_not_found_message(self.settings.load.model, str(error).rstrip("."))

    def ready_message(self, seconds: float, offer: Offer) -> str:
        what = format_size(offer.sizes[0]) if self.unfinished else "every size"
        unused = gpu_unused()  # (said where people look: the page's status line, and the log at start)
        return f"Ready ({seconds:.0f} s to load and compile {what})." + (f" ⚠️ {unused}" if unused else "")

    def start(self) -> Offer:
        pipe = self._loader(self.settings)
        self.pipeline = pipe
        self.batcher = Batcher(pipe, on_call=lambda images, result: self._on_call(
            result.timings if result is not None else None), max_waiting=self.max_waiting,
            preview_every=self.settings.preview_every)
        offer = provisional(self.settings)  # (what the settings say), with what the model says
        return dataclasses.replace(
            offer, model=pipe.model_name, sizes=list(pipe.sizes), samplers=list(pipe.samplers),
            default_sampler=offer.default_sampler if self.settings.recipe else pipe.default_sampler,
            max_prompt_chunks=pipe.max_prompt_chunks, controlnets=pipe.unit_models, ip_adapters=pipe.ip_adapters,
            embeddings=tuple((name, e.count) for name, e in pipe.embeddings.loaded.items()),
            skipped_embeddings=tuple(pipe.embeddings.skipped.items()), upscalers=pipe.upscalers.names,
            refiner=pipe.refiner.name if pipe.refiner else None)

    def unavailable(self) -> str | None:
        return None

    def upscale(self, image: Any, upscaler: str, scale: float) -> Any:
        if upscaler == "Lanczos":
            return lanczos_by(image, scale)
        if self.pipeline is None or upscaler not in self.pipeline.upscalers.names:
            raise RequestError(f"No upscaler {upscaler!r} here.")
        model = self.pipeline.upscalers[upscaler]
        with self.pipeline.lock:  # (the device runs one call at a time; an upscale waits for the call it meets)
            return model.upscale(image, scale)

    @property
    def tokenizer(self) -> Any:
        return self.pipeline.tokenizers[0] if self.pipeline is not None else None

    @property
    def compiling(self) -> list[tuple[int, int]]:
        """Sizes not offered yet: without what a first call runs (compile_first's)."""
        if self.pipeline is None:
            return []
        first_call = self.pipeline.call_programs(guided=self._first_guided)
        return [size for size in self.pipeline.sizes if not self.pipeline.is_compiled(size, first_call)]

    @property
    def unfinished(self) -> list[tuple[int, int]]:
        """Sizes with any program still to compile, the first size first."""
        if self.pipeline is None:
            return []
        return [size for size in self.pipeline.sizes if not self.pipeline.is_compiled(size)]

    def waits_for_compile(self, request: Request) -> bool:
        """Whether `request` runs a program not compiled yet in either pass (call_passes): a network's
        outside --network-sizes, or two ControlNets at once, compile when first asked for."""
        if self.pipeline is None:
            return False
        pipe, units = self.pipeline, [unit.model for unit in request.controls]
        passes = call_passes(pipe, request.images(request.count or pipe.images_per_call),
                             controlnets=[u for u in units if u in pipe.controlnets],
                             image_prompt=pipe.ip_adapter in units, image=request.image is not None)
        return not all(pipe.is_compiled(size, names) for size, names in passes)

    def compile(self, size: tuple[int, int]) -> None:
        """Compile `size`'s programs still missing; the first call loads every program still
        missing from the program store first, side by side (on a restart, all of them: nothing then
        compiles)."""
        if not self._stored_loaded:
            self._stored_loaded = True
            self.pipeline.load_stored(self.unfinished)
        self.pipeline.warmup([size])
        if not self.unfinished:  # (then the upscaler models, which the hires fix's second pass waits for)
            try:
                self.pipeline.upscalers.warm()
            except Exception:  # (a model that fails here fails again, with its message, when a request asks)
                logging.getLogger("sdxl_tpu").exception("an upscaler model did not compile")

    def compiles(self) -> int:
        return self._compiles.compiles

    def programs_loaded(self) -> int:
        store = self.pipeline.program_store if self.pipeline is not None else None
        return store.loaded if store is not None else 0

    @property
    def waiting(self) -> int:
        return self.batcher.waiting if self.batcher is not None else 0

    @property
    def busy(self) -> bool:
        return self.batcher is not None and self.batcher.busy

    def concurrency(self) -> int:
        """As many requests as one pipeline call can serve: more than one where the host has more
        chips than a request has images (images are split evenly over the chips)."""
        per_request = self.settings.load.images_per_call
        return max(1, call_batch(per_request, len(jax.devices())) // per_request)

    def submit(self, request: Request, report: Report, abandoned: Callable[[], bool], previews: bool,
               image_format: str | None = None) -> Ticket:
        if self.batcher is None:
            raise RequestError("The model is still warming up; please try again in a moment.")
        per_call = self.settings.load.images_per_call
        if (request.count or 0) > per_call:
            raise RequestError(f"This server makes at most {per_call} images a request, not {request.count}.")
        ticket = Ticket(report, encode=lambda result: self._encode(result, image_format or self.settings.image_format))
        self.batcher.enqueue(request.images(request.count or per_call), progress=ticket.progress,
                             abandoned=abandoned, preview=ticket.preview if previews else None,
                             on_done=lambda job: _finish(ticket, job, request), init_image=request.image,
                             mask=request.mask)
        return ticket

    def _encode(self, result: GenerationResult, image_format: str) -> Generated:
        """A call's images as files in `image_format`, each with its parameters."""
        start = time.perf_counter()
        parameters = [parameters_text(info, self.pipeline.stamp_for(info)) for info in result.infos]
        files = encode_all(result.images, parameters, image_format)
        first = result.infos[0]  # (one request's images: one sampler, schedule and noise source)
        return Generated(files, parameters, result.seeds, first.sampler or self.pipeline.default_sampler,
                         dict(result.timings, encoding=time.perf_counter() - start),
                         schedule=schedule_used(first.sampler, first.schedule), rng=first.rng,
                         format=image_format)

    def close(self, stop_running: bool) -> None:
        if self.batcher is not None:
            self.batcher.close(stop_running=stop_running)
            self.batcher.join(timeout=30)


def _finish(ticket: Ticket, job: Job, request: Request) -> None:
    """A batcher's job ended: its outcome to the ticket (an image that is not one, for the user;
    Only masked's images pasted back into the request's image)."""
    error = RequestError(str(job.error)) if isinstance(job.error, GenerationError) else job.error
    result = job.result
    if result is not None and error is None:
        try:
            result = dataclasses.replace(result, images=request.finish(result.images))
        except Exception as e:  # noqa: BLE001 (the ticket must end whatever happens)
            result, error = None, e
    ticket.finish(result, error)
