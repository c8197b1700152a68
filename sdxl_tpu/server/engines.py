"""What makes a server's images, behind one interface for the server core (core.py): the model
in this process (LocalEngine: the pipeline, loaded and compiled, and the batcher that feeds it)
or the back ends a front end sends its generations to (RemoteEngine, over remote.py).

Each one: `start()` (blocking: load, or connect) returns what it offers (ModelInfo);
`submit(...)` starts a request's work and hands `done` a function that, called in the caller's
thread, gives the images (or raises what stopped them); `compiling`, `busy`, `close()` and the
messages the page shows while it starts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..spec.images import encode_all
from ..spec.infotext import parameters_text
from ..spec.names import RNGS, SCHEDULES, schedule_used
from ..spec.errors import GenerationError, RequestError
from ..spec.request import Request
from ..spec.values import format_size
from .batcher import Batcher, Generated, Job, never
from .errors import log
from .offer import ModelInfo, offered_presets
from .settings import Settings, model_not_found_message

Done = Callable[[Callable[[], Generated]], None]  # receives: call me (in your thread) for the images


def _raise(error: BaseException) -> Generated:
    raise error


def load_and_compile_first(s: Settings) -> Any:
    """The pipeline of `s`, compiled for its first size (the others follow in the background)."""
    from ..generate.loading import load_pipeline

    pipe = load_pipeline(s.model, dtype=s.dtype, sizes=s.sizes, images_per_call=s.images_per_call,
                         attention=s.attention, unet=s.unet, timestep_spacing=s.timestep_spacing,
                         prediction_type=s.prediction_type, config=s.config, loras=s.loras, preview=s.preview,
                         max_prompt_chunks=s.max_prompt_chunks, warmup=False)
    pipe.warmup(pipe.sizes[:1])
    return pipe


class LocalEngine:
    """The model in this process: the pipeline (from `loader`: settings -> a Pipeline compiled for
    its first size, load_and_compile_first by default) and the batcher that feeds it;
    `on_call(timings)` after each pipeline call."""

    remote = False

    def __init__(self, settings: Settings, loader: Callable[[Settings], Any] | None,
                 on_call: Callable[[dict[str, float] | None], None], max_waiting: int | None = None):
        self.settings, self._on_call, self.max_waiting = settings, on_call, max_waiting
        self._loader = loader or load_and_compile_first
        self.pipeline: Any = None
        self.batcher: Batcher | None = None
        self.tokenizer = None

    loading_message = "Loading the model and compiling every size; this page will work once that is done."

    def failure_message(self, error: Exception) -> str:
        return model_not_found_message(self.settings.model, str(error).rstrip("."))

    def ready_message(self, seconds: float, info: ModelInfo) -> str:
        what = format_size(info.sizes[0]) if self.compiling else "every size"
        return f"Ready ({seconds:.0f} s to load and compile {what})."

    def start(self) -> ModelInfo:
        pipe = self._loader(self.settings)
        self.pipeline, self.tokenizer = pipe, pipe.tokenizers[0]
        self.batcher = Batcher(pipe, on_call=lambda images, result: self._on_call(
            result.timings if result is not None else None), max_waiting=self.max_waiting,
            preview_every=self.settings.preview_every)
        recipe, s = self.settings.recipe, self.settings
        return ModelInfo(model=pipe.model_name, sizes=list(pipe.sizes), samplers=list(pipe.samplers),
                         default_sampler=recipe.sampler if recipe is not None else pipe.default_sampler,
                         preset=recipe.name if recipe is not None else None, presets=offered_presets(recipe),
                         images_per_call=s.images_per_call, image_format=s.image_format,
                         max_prompt_chunks=pipe.max_prompt_chunks,
                         # (every Schedule type and noise source, unless the pipeline says otherwise)
                         schedules=list(getattr(pipe, "schedules", SCHEDULES)), default_schedule=s.schedule,
                         rngs=list(getattr(pipe, "rngs", RNGS)), default_rng=s.rng)

    @property
    def compiling(self) -> list[tuple[int, int]]:
        """Offered sizes not compiled yet (in the order they will be)."""
        if self.pipeline is None:
            return []
        return [size for size in self.pipeline.sizes if not self.pipeline.is_compiled(size)]

    def compile(self, size: tuple[int, int]) -> None:
        self.pipeline.warmup([size])

    @property
    def waiting(self) -> int:
        return self.batcher.waiting if self.batcher is not None else 0

    @property
    def busy(self) -> bool:
        return self.batcher is not None and self.batcher.busy

    def concurrency(self) -> int:
        """As many requests as one pipeline call can serve: more than one where the host has more
        chips than a request has images (images are split evenly over the chips)."""
        import jax

        from ..generate.pipeline import call_batch

        per_request = self.settings.images_per_call
        return max(1, call_batch(per_request, len(jax.devices())) // per_request)

    def enqueue(self, request: Request, progress: Callable[[int, int], None] | None = None,
                abandoned: Callable[[], bool] | None = None, on_done: Callable[[], None] | None = None,
                preview: Callable[[int, int, Any], None] | None = None) -> Job:
        """The request, accepted for the pipeline (see Batcher.enqueue); `finish` it once done."""
        if self.batcher is None:
            raise RequestError("The model is still warming up; please try again in a moment.")
        return self.batcher.enqueue(request.images(self.settings.images_per_call), progress=progress,
                                    abandoned=abandoned or never, on_done=on_done, preview=preview)

    def finish(self, job: Job) -> Generated:
        """A finished job's images, encoded in the server's format with their parameters (or what
        stopped them, raised)."""
        try:
            result = job.outcome()
        except GenerationError as e:
            raise RequestError(str(e)) from None
        start = time.perf_counter()
        parameters = [parameters_text(info, self.pipeline.stamp) for info in result.infos]
        files = encode_all(result.images, parameters, self.settings.image_format)
        first = result.infos[0]  # (one request's images: one sampler, schedule and noise source)
        return Generated(files, parameters, result.seeds, first.sampler,
                         dict(result.timings, encoding=time.perf_counter() - start),
                         schedule=schedule_used(first.sampler, first.schedule), rng=first.rng)

    def submit(self, request: Request, progress: Callable[[int, int], None], abandoned: Callable[[], bool],
               preview: Callable[[int, int, Any], None] | None, image_format: str, done: Done) -> None:
        # The job is handed over through `held`, taken out when collected: no job <-> callback
        # reference cycle keeps a finished call's images alive until the garbage collector runs.
        held: dict[str, Job] = {}
        held["job"] = self.enqueue(request, progress=progress, abandoned=abandoned, preview=preview,
                                   on_done=lambda: done(lambda: self.finish(held.pop("job"))))

    def close(self, stop_running: bool) -> None:
        if self.batcher is not None:
            self.batcher.close(stop_running=stop_running)
            self.batcher.join(timeout=30)


class RemoteEngine:
    """The back ends at `settings.backend` (usually a load balancer): no model here; `start()`
    waits (bounded) until one describes itself."""

    remote = True

    def __init__(self, settings: Settings, on_call: Callable[[dict[str, float] | None], None]):
        self.settings, self._on_call = settings, on_call
        self.backend: Any = None  # remote.Backend, once started
        self.tokenizer = None
        self.pipeline = self.batcher = None
        self.compiling: list[tuple[int, int]] = []
        self.busy, self.waiting = False, 0

    @property
    def loading_message(self) -> str:
        return f"Connecting to the back end at {self.settings.backend}; this page will work once it answers."

    def failure_message(self, error: Exception) -> str:
        return f"Could not reach the back end at {self.settings.backend}: {str(error).rstrip('.')}."

    def ready_message(self, seconds: float, info: ModelInfo) -> str:
        return f"Ready: images are made by {info.model} on the back ends."

    def start(self) -> ModelInfo:
        """Waits, however long, until a back end describes itself: the page and /healthz answer
        meanwhile, /readyz says 503 (back ends download and compile for minutes)."""
        from .remote import Backend

        self.backend = Backend(self.settings.backend)
        info = ModelInfo.from_json(self.backend.describe())
        # Token counts need only the model's tokenizer files, which a front end may not reach
        # (a back end's local path, no network): then the page goes without them.
        threading.Thread(target=self._load_tokenizer, args=(info.model,), name="sdxl-tokenizer", daemon=True).start()
        return info

    def _load_tokenizer(self, model: str) -> None:
        from ..weights.hub import load_tokenizer

        try:  # (a model with another UNet is named "BASE + UNET"; the tokenizer is the base's)
            self.tokenizer = load_tokenizer(model.split(" + ")[0])
        except Exception as e:  # best effort: the page works without token counts
            log.info("no tokenizer for %s (token counts are not shown): %s", model, e)

    def answering(self) -> str | None:
        """None while a back end answers; else why not (one try, for readiness to follow them)."""
        try:
            self.backend.describe(wait_seconds=0)
        except OSError as e:
            return str(e)
        return None

    def concurrency(self) -> int:
        """As many as the queue holds: the back ends queue and balance them."""
        return self.settings.queue_size

    def submit(self, request: Request, progress: Callable[[int, int], None], abandoned: Callable[[], bool],
               preview: Callable[[int, int, Any], None] | None, image_format: str, done: Done) -> None:
        def ask_the_back_end() -> None:
            try:
                made = self.backend.generate(request, progress=progress, abandoned=abandoned,
                                             image_format=image_format, preview=preview)
            except BaseException as e:  # handed to the caller, raised there
                error = e
                done(lambda: _raise(error))
                return
            self._on_call(made.timings)
            done(lambda: made)

        threading.Thread(target=ask_the_back_end, name="sdxl-remote", daemon=True).start()

    def close(self, stop_running: bool) -> None:
        pass
