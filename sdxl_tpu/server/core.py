"""The server core that the Gradio playground (app.py) and the HTTP back end share: the model
loaded and warmed up in the background while the page already answers (or, for a front end, the
back ends'), the request handler with its progress and previews, counting, saving, draining."""

from __future__ import annotations

import queue
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..spec.errors import RequestError
from ..spec.images import encode_preview
from ..spec.names import RNGS, SAMPLERS, SCHEDULES
from ..spec.recipes import RECIPES, Recipe
from ..spec.request import Request
from ..spec.styles import DEFAULT_STYLE
from ..spec.values import format_size, parse_size, schedule_input
from ..weights.errors import CheckpointError, PreviewDecoderError
from .batcher import SHUTTING_DOWN, Generated, Job, StillCompiling, never
from .engines import LocalEngine, RemoteEngine
from .errors import log
from .files import ImageStore
from .form import FORM_FIELDS, token_count, validate
from .metrics import Metrics
from .offer import ModelInfo, offered_presets
from .settings import Settings, model_not_found_message

if TYPE_CHECKING:
    from ..generate.pipeline import Pipeline


class Server:
    """A server's state and request handling around its engine (engines.py: the model in this
    process, or for a front end (`settings.backend`) the back ends): its warm-up state ("loading"
    -> "ready", or "error"; "draining" once asked to stop), a request's streamed progress,
    previews and images, and what it counts (`metrics`). Checks, counting, saving and the page are
    the same for either engine.

    `max_waiting` bounds the batcher's queue (the back end's; the playground's web server has a
    bounded queue of its own)."""

    def __init__(self, settings: Settings, loader: Callable[[Settings], Pipeline] | None = None,
                 images: ImageStore | None = None, max_waiting: int | None = None):
        self.settings = settings
        self.images = images  # where served images are written (app.py: in Gradio's cache folder)
        self.engine = (RemoteEngine(settings, self._count_call) if settings.backend is not None
                       else LocalEngine(settings, loader, self._count_call, max_waiting))
        self.status = "loading"
        self.message = self.engine.loading_message
        self.error: str | None = None
        self.info: ModelInfo | None = None  # once loaded (or connected)
        self.warmup_seconds: float | None = None
        self.queue_waiting: Callable[[], int] = lambda: 0  # requests waiting in the web server's queue
        self.metrics = Metrics()
        if settings.backend is None:  # (a front end compiles nothing and imports no JAX)
            self.metrics.compiles.listen()
        self.metrics.queue_depth.set_function(lambda: self.queue_waiting() + self.engine.waiting)
        self.ready_event = threading.Event()
        self.done_event = threading.Event()
        self.compiled_event = threading.Event()  # every size compiled (set at once when they all were at start)

    @property
    def pipeline(self) -> Pipeline | None:
        """The model in this process (None for a front end, or until loaded)."""
        return self.engine.pipeline

    batcher = property(lambda self: self.engine.batcher)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        self.engine.tokenizer = tokenizer

    def image_store(self, folder: Path, on_delete: Callable[[list[str]], None] | None = None) -> ImageStore:
        """A store for this server's images in a folder of its own under `folder`."""
        s = self.settings
        return ImageStore(folder / f"sdxl-{uuid.uuid4().hex[:12]}", fmt=self.image_format,
                          keep_seconds=s.keep_images_seconds, max_bytes=s.max_image_bytes, on_delete=on_delete)

    def load(self) -> None:
        """Load and compile (blocking), or, for a front end, wait (bounded) until the back end
        describes itself. Sets status to "ready" or "error"."""
        start = time.perf_counter()
        try:
            self.info = self.engine.start()
            if self.compiling:
                threading.Thread(target=self._compile_the_rest, name="sdxl-compile", daemon=True).start()
        except PreviewDecoderError as e:  # its message says what to do (--preview approx, or a local copy)
            self._fail(str(e))
        except (CheckpointError, OSError, ValueError) as e:
            self._fail(self.engine.failure_message(e))
        except Exception as e:  # anything else: still no traceback for the user, but keep it in the log
            traceback.print_exc()
            self._fail(model_not_found_message(self.settings.model, f"{type(e).__name__}: {e}"))
        else:
            self.warmup_seconds = time.perf_counter() - start
            if self.status == "loading":  # (a drain may have begun meanwhile)
                self.status = "ready"
                self.message = self.engine.ready_message(self.warmup_seconds, self.info)
                self.metrics.ready.set(1)
            self.ready_event.set()
            if not self.compiling:
                self.compiled_event.set()
            if self.engine.remote:
                threading.Thread(target=self._follow_the_back_ends, name="sdxl-backends", daemon=True).start()
        finally:
            self.done_event.set()

    def _compile_the_rest(self) -> None:
        """Compile the sizes still missing, one by one (each is offered once compiled)."""
        for size in self.compiling:
            if self.draining:
                return
            start = time.perf_counter()
            try:
                self.engine.compile(size)
            except Exception:  # the sizes compiled so far keep serving
                log.exception("compiling %s failed", format_size(size))
                return
            log.info("compiled %s in %.1f s", format_size(size), time.perf_counter() - start)
        self.compiled_event.set()

    def _follow_the_back_ends(self, every: float | None = None) -> None:
        """A front end's readiness follows its back ends, which come and go: not ready ("waiting")
        while none answers, ready again once one does; it never exits for them."""
        from .remote import CHECK_SECONDS

        while not self.draining:
            time.sleep(CHECK_SECONDS if every is None else every)
            missing = self.engine.answering()
            if missing is not None and self.status == "ready":
                self.status = "waiting"
                self.message = f"Waiting for the back ends at {self.settings.backend}: {missing.rstrip('.')}."
                self.metrics.ready.set(0)
                log.warning("the back ends do not answer: %s", missing)
            elif missing is None and self.status == "waiting":
                self.status, self.message = "ready", self.engine.ready_message(0.0, self.info)
                self.metrics.ready.set(1)
                log.info("the back ends answer again")

    @property
    def compiling(self) -> list[tuple[int, int]]:
        """Offered sizes not compiled yet (in the order they will be)."""
        return self.engine.compiling

    @property
    def ready_sizes(self) -> list[tuple[int, int]]:
        """The sizes a request may ask for now."""
        compiling = self.compiling
        return [size for size in self.sizes if size not in compiling]

    @property
    def status_line(self) -> str:
        """What the page says of the server: its message, and how many sizes are still compiling."""
        compiling = self.compiling if self.ready else []
        if not compiling:
            return self.message
        return (f"{self.message} {len(compiling)} more size{'s' if len(compiling) > 1 else ''} compiling "
                f"({', '.join(format_size(s) for s in compiling)}); they join the size menu when ready.")

    def check_size(self, size: Any) -> None:
        """Refuses a size that is offered but not compiled yet (StillCompiling), before anything else."""
        try:
            wanted = parse_size(size)
        except RequestError:
            return  # the field's own check names the problem
        if wanted in self.compiling:
            raise StillCompiling(f"Size {format_size(wanted)} is still being compiled; it will be available in a "
                                 "moment (the sizes ready now: " + ", ".join(map(format_size, self.ready_sizes)) + ").")

    def _fail(self, message: str) -> None:
        self.status, self.error, self.message = "error", message, message

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.load, name="sdxl-warmup", daemon=True)
        thread.start()
        return thread

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def readiness(self) -> tuple[dict[str, Any], int]:
        """GET /readyz: the body and status code (200 once warm, 503 while loading or draining), with
        the sizes still compiling."""
        return ({"status": self.status, "message": self.status_line,
                 "compiling": [format_size(s) for s in self.compiling]}, 200 if self.ready else 503)

    @property
    def draining(self) -> bool:
        return self.status == "draining"

    @property
    def concurrency(self) -> int:
        """How many requests run at once (see the engine's)."""
        return self.engine.concurrency()

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return list(self.info.sizes if self.info else self.settings.sizes)

    @property
    def samplers(self) -> list[str]:
        return list(self.info.samplers if self.info else SAMPLERS)

    @property
    def schedules(self) -> list[str]:
        return list(self.info.schedules if self.info else SCHEDULES)

    @property
    def rngs(self) -> list[str]:
        return list(self.info.rngs if self.info else RNGS)

    @property
    def default_schedule(self) -> str:
        """The Schedule type of a request that names none (the back end's, for a front end)."""
        return self.info.default_schedule if self.info is not None else self.settings.schedule

    @property
    def default_rng(self) -> str:
        """The noise source of a request that names none (the back end's, for a front end)."""
        return self.info.default_rng if self.info is not None else self.settings.rng

    @property
    def image_format(self) -> str:
        return self.info.image_format if self.info else self.settings.image_format

    @property
    def recipe(self) -> Recipe | None:
        """The launch preset (the back end's, for a front end)."""
        if self.info is not None:
            return RECIPES[self.info.preset] if self.info.preset else None
        return self.settings.recipe

    @property
    def default_sampler(self) -> str:
        """The launch preset's sampler, else the model's own (until it is loaded: SDXL base's, Euler)."""
        if self.info is not None:
            return self.info.default_sampler
        return self.settings.recipe.sampler if self.settings.recipe is not None else "Euler"

    @property
    def presets(self) -> list[Recipe]:
        """The presets the page offers (see `offered_presets`)."""
        return [RECIPES[name] for name in (self.info.presets if self.info else offered_presets(self.settings.recipe))]

    def token_count(self, prompt: Any, style: Any = DEFAULT_STYLE) -> str:
        """Markdown: the prompt's token count with the style applied (see form.token_count)."""
        chunks = self.info.max_prompt_chunks if self.info is not None else self.settings.max_prompt_chunks
        unavailable = ("No token count here (the front end has no tokenizer for this model)." if self.engine.remote
                       else "Token count available once the model is loaded.")
        return token_count(self.tokenizer, chunks, prompt, style, unavailable)

    # -- requests -------------------------------------------------------------------------------

    def counted(self, queued_at: float):
        """Counts the request run inside by outcome (see Metrics.counted)."""
        return self.metrics.counted(queued_at)

    def stream(self, fields: Sequence[Any], abandoned: Callable[[], bool] | None = None,
               queued_at: float | None = None, previews: bool = True) -> Iterator[tuple]:
        """One /generate call, from the form's fields as the client sent them (see `validate_form`),
        as what the page shows while it runs, in order:
            ("progress", step, steps)            after each denoising step
            ("preview", [(path, caption)])       live previews of the four images (if `previews`)
            ("done", [(path, caption)], seeds, info markdown, the sampler used)
        Counted in `metrics` by outcome. `queued_at` (time.monotonic()) is when the request joined
        the queue; `abandoned()` says whether its caller has gone (so does closing the stream)."""
        closed = threading.Event()
        gone = lambda: closed.is_set() or (abandoned is not None and bool(abandoned()))
        with self.counted(time.monotonic() if queued_at is None else queued_at):
            try:
                request = self.validate_form(fields)
                yield from self._updates(request, gone, previews)
            except GeneratorExit:
                closed.set()
                raise

    def validate_form(self, fields: Sequence[Any]) -> Request:
        """The form's fields as a client sent them (FORM_FIELDS' order; without a schedule or rng,
        or with null, this server's defaults) as a checked Request (see `validate`), its Schedule
        type checked with the sampler that will run it (the model's own where none is named)."""
        values = dict(zip(FORM_FIELDS, fields))
        self.check_size(values.get("size"))
        schedule, rng = values.pop("schedule", None), values.pop("rng", None)
        request = validate(**values, sizes=self.sizes, samplers=self.samplers,
                           schedule=self.default_schedule if schedule is None else schedule,
                           rng=self.default_rng if rng is None else rng)
        if request.sampler is None:
            schedule_input(self.pipeline.default_sampler if self.pipeline is not None else self.default_sampler,
                           request.schedule)
        return request

    def generate(self, request: Request, progress: Callable[[int, int], None] | None = None,
                 abandoned: Callable[[], bool] | None = None):
        """A checked request's images, without previews: ([(path, caption)], seeds, info markdown).
        Raises RequestError for the user, Cancelled when `abandoned()` turned true first."""
        for update in self._updates(request, abandoned or never, previews=False):
            if update[0] == "progress" and progress is not None:
                progress(*update[1:])
        return update[1:4]

    def _updates(self, request: Request, gone: Callable[[], bool], previews: bool) -> Iterator[tuple]:
        """`stream`'s updates for a checked request: the work runs on the batcher's thread (or a
        back end's), and what it reports is handed over in the caller's thread, where the web
        framework's progress display has its context."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        put_progress = lambda step, steps: events.put(("progress", step, steps))
        put_preview = (lambda step, steps, images: events.put(("preview", step, steps, images))) if previews else None
        self.engine.submit(request, put_progress, gone, put_preview, self.image_format,
                           done=lambda collect: events.put(("done", collect)))
        while True:  # every job ends (done, failed or cancelled), and says so
            kind, *args = events.get()
            if kind == "progress":
                yield ("progress", *args)
            elif kind == "preview":
                yield ("preview", self._preview_gallery(request, *args))
            else:
                made = args[0]()  # (here, in the caller's thread: encoding, or what stopped it, raised)
                break
        yield ("done", *self._gallery(request, made), made.sampler)

    def _store(self) -> ImageStore:
        if self.images is None:  # (app.py gives the store in Gradio's cache folder, where it serves from)
            self.images = self.image_store(Path(tempfile.gettempdir()))
        return self.images

    def _preview_gallery(self, request: Request, step: int, steps: int, images) -> list[tuple[str, str]]:
        """Previews (uint8 arrays, or JPEG files from a back end) as small files in the store."""
        files = [image if isinstance(image, bytes) else encode_preview(image) for image in images]
        paths = self._store().write(files, range(len(files)), name="preview", extension="jpg")
        return [(path, f"preview · step {step} / {steps}") for path in paths]

    def _gallery(self, request: Request, made: Generated) -> tuple[list[tuple[str, str]], list[int], str]:
        # Written once, as encoded with their parameters, where Gradio serves them from (no copy).
        start = time.perf_counter()
        paths = self._store().write(made.files, made.seeds)
        saving = made.timings.get("encoding", 0.0) + time.perf_counter() - start
        self.count_images(len(paths), saving)
        gallery = [(path, f"seed {seed}") for path, seed in zip(paths, made.seeds)]
        t = made.timings
        info = (f"Generated {len(paths)} images of {format_size(request.size)} in {t['total']:.2f} s "
                f"(text {t['text_encoding']:.2f} s, denoising {t['denoising']:.2f} s for {request.steps} steps of "
                f"{made.sampler} (Schedule type {made.schedule}, RNG {made.rng}), "
                f"decoding {t['decoding']:.2f} s; {saving:.2f} s to save). "
                f"Seeds: {', '.join(str(s) for s in made.seeds)}.")
        return gallery, made.seeds, info

    def enqueue(self, request: Request, progress: Callable[[int, int], None] | None = None,
                abandoned: Callable[[], bool] | None = None, on_done: Callable[[], None] | None = None,
                preview: Callable[[int, int, Any], None] | None = None) -> Job:
        """The request, accepted for this process' pipeline (the back end's way in; see
        LocalEngine.enqueue); `finish` it once done."""
        if self.error is not None:
            raise RequestError(self.error)
        return self.engine.enqueue(request, progress=progress, abandoned=abandoned, on_done=on_done, preview=preview)

    def finish(self, job: Job) -> Generated:  # noqa: D102
        return self.engine.finish(job)

    def count_images(self, images: int, saving_seconds: float) -> None:
        """Images handed to a caller, and the seconds it took to encode (and write) them."""
        self.metrics.stage_seconds.labels("saving").observe(saving_seconds)
        self.metrics.images.inc(images)

    def _count_call(self, timings: dict[str, float] | None) -> None:
        self.metrics.calls.inc()
        if timings is not None:
            for stage in ("text_encoding", "denoising", "decoding"):
                self.metrics.stage_seconds.labels(stage).observe(timings[stage])

    # -- stopping -------------------------------------------------------------------------------

    def drain(self, busy: Callable[[], bool] = lambda: False, seconds: float | None = None,
              poll: float = 0.05) -> bool:
        """Stop taking requests and let those accepted finish: not ready at once (status
        "draining"), then wait until neither `busy()` (the web server's queue) nor the batcher
        has work, for at most `seconds` (default: settings.drain_seconds). What is still running
        then is cancelled. Returns whether everything finished."""
        self.status, self.message = "draining", SHUTTING_DOWN
        self.metrics.ready.set(0)
        log.info("draining: finishing the requests already accepted (at most %.0f s)",
                 self.settings.drain_seconds if seconds is None else seconds)
        deadline = time.monotonic() + (self.settings.drain_seconds if seconds is None else seconds)
        working = lambda: busy() or self.engine.busy
        while working() and time.monotonic() < deadline:
            time.sleep(poll)
        finished = not working()
        self.engine.close(stop_running=not finished)
        log.info("drained" if finished else "drain deadline passed: the requests still running were cancelled")
        return finished
