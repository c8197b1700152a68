"""The server core that the Gradio playground (app.py) and the HTTP back end (backend.py) share: a
request's way through the server, from the form's fields to images on disk (or, for the back end,
a checked request to images in its answer), with its progress, previews and what is counted.

Its parts, one job each: the engine that makes the images (engine.py; the model in this process or
a front end's back ends), the warm-up and compilation state (warmup.py), the image files (files.py),
the drain (drain.py), the metrics (metrics.py).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..a1111.dynamic_prompts import Wildcards
from ..request.errors import RequestError
from ..request.fields import DEFAULT_STYLE
from ..request.calls import split
from ..request.recipes import RECIPES, Recipe
from ..request.request import Request
from .drain import drain, end
from .engine import Engine, Report, Ticket
from .events import Called, Done, Ended, Preview, Progress, Shown, Started
from .files import ImageStore, batch_done, final_gallery, previews_gallery, summary, temporary_store
from .form import batch_count, token_count, validate
from .metrics import Metrics
from .offer import Offer, provisional
from .remote_engine import RemoteEngine
from .settings import Settings
from .uploads import Uploads
from .warmup import Warmup


def engine_for(settings: Settings, on_call: Callable[[dict[str, float] | None], None],
               loader: Callable[[Settings], Any] | None = None, max_waiting: int | None = None) -> Engine:
    """The back ends at `settings.backend`, or the model in this process (JAX, imported only then)."""
    if settings.backend is not None:
        return RemoteEngine(settings, on_call)
    from .local_engine import LocalEngine

    return LocalEngine(settings, on_call, loader, max_waiting)


class Server:
    """A server: its settings, engine (from `loader`, for a test, a stand-in for the model's
    loading), warm-up, metrics and where its images are written (`images`: the playground's, in Gradio's
    cache folder; else a temporary folder). `max_waiting` bounds the engine's queue (the back end's;
    the playground's web server has a bounded queue of its own)."""

    def __init__(self, settings: Settings, loader: Callable[[Settings], Any] | None = None,
                 max_waiting: int | None = None, images: ImageStore | None = None):
        self.settings = settings
        self._web_waiting: Callable[[], int] = lambda: 0
        self.metrics = Metrics(queue_depth=lambda: self._web_waiting() + self.engine.waiting,
                               compiles=lambda: self.engine.compiles(),
                               programs_loaded=lambda: self.engine.programs_loaded())
        self.engine = engine_for(settings, self.metrics.count_call, loader, max_waiting)
        self.warmup = Warmup(self.engine, provisional(settings), on_ready=lambda ready: self.metrics.ready.set(ready))
        self._images = images
        self.uploads: Uploads | None = None  # what people upload to the page (the playground's; None: no uploads)
        # The wildcards __name__ draws from (a front end: None, its back end's are used).
        self.wildcards = None if settings.backend else Wildcards(settings.wildcards)

    @property
    def images(self) -> ImageStore:
        if self._images is None:
            self._images = temporary_store()
        return self._images

    def count_waiting(self, waiting: Callable[[], int]) -> None:
        """Also count, as waiting, the requests in the web server's own queue (the playground's)."""
        self._web_waiting = waiting

    def start(self) -> threading.Thread:
        """Load and compile (a front end: connect) in the background; the server answers meanwhile."""
        return self.warmup.start()

    # -- what it offers ---------------------------------------------------------------------------

    @property
    def offer(self) -> Offer:
        """What it offers: the model's (a front end: its back ends'), or its settings' until known."""
        return self.warmup.offer

    @property
    def ready(self) -> bool:
        return self.warmup.ready

    @property
    def recipe(self) -> Recipe | None:
        """The launch preset (a front end: its back ends')."""
        return RECIPES[self.offer.preset] if self.offer.preset else None

    @property
    def presets(self) -> list[Recipe]:
        """The presets the page offers."""
        return [RECIPES[name] for name in self.offer.presets]

    @property
    def concurrency(self) -> int:
        """How many requests run at once (see the engine's)."""
        return self.engine.concurrency()

    def token_count(self, prompt: Any, style: Any = DEFAULT_STYLE) -> str:
        """Markdown: the prompt's token count with the style applied, the embeddings it names and
        what its LoRA tags do here (see form.token_count)."""
        return token_count(self.engine.tokenizer, self.offer.max_prompt_chunks, prompt, style,
                           self.engine.no_tokenizer_message, self.offer.loras, self.offer.embeddings)

    # -- requests ---------------------------------------------------------------------------------

    def validate_form(self, values: Mapping[str, Any], each: Mapping[str, list] | None = None) -> Request:
        """The form's fields as a client sent them (by name) as a checked Request (form.validate;
        `each`: per-image values the server made); a size offered but still compiling is refused
        first (StillCompiling)."""
        self.warmup.check_size(values.get("size"))
        return validate(values, self.offer, self.uploads.read if self.uploads is not None else None, self.wildcards,
                        each)

    def batch(self, values: Mapping[str, Any]) -> list[Request]:
        """The form's fields as the checked requests of the calls they make (its Batch count)."""
        request = self.validate_form(values)
        calls, per_call = batch_count(values), self.offer.images_per_call
        return split(request, calls * per_call, per_call)

    def stream(self, values: Mapping[str, Any], abandoned: Callable[[], bool] | None = None,
               queued_at: float | None = None, previews: bool = True, route: str = "page",
               plan: Callable[[Mapping[str, Any]], list[Request]] | None = None
               ) -> Iterator[Started | Progress | Shown | Called | Done]:
        """One /generate call, from the form's fields as the client sent them (`plan(values)`: the
        checked requests of its calls; default `batch`), as what the page shows while it runs, in order:
            Started   once checked: the seeds it will make, its steps, its calls
            Progress  after each denoising step, counted over all its calls
            Shown     live previews of the call's images (if `previews`), after the calls' before
            Called    after each call, in a run of several
            Done      the images, their seeds, the summary, what ran (events.py)
        Counted in `metrics` by `route` and outcome. `queued_at` (time.monotonic()) is when the request joined
        the queue; `abandoned()` says whether its caller has gone (so does closing the stream)."""
        closed = threading.Event()
        gone = lambda: closed.is_set() or (abandoned is not None and bool(abandoned()))
        with self.metrics.counted(time.monotonic() if queued_at is None else queued_at, route):
            try:
                parts = (plan or self.batch)(values)
                n, per_call = len(parts), self.offer.images_per_call
                # Each call's steps, as its request says them until it reports its own (a hires fix's too).
                steps = [p.steps + (0 if p.hires is None else p.hires.steps or p.steps) for p in parts]
                yield Started([s for p in parts for s in p.seeds(p.count or per_call)], parts[0].steps,
                              self.engine.waits_for_compile(parts[0]), n, sum(steps))
                made: list[Done] = []
                finished: list[tuple[str, str]] = []  # (the finished calls' images, in view while the next runs)
                for i, part in enumerate(parts):
                    for update in self._updates(part, gone, previews):
                        if isinstance(update, Progress):
                            if update.steps != (guess := steps[i]):  # (the calls guessed alike run alike)
                                steps[i:] = [update.steps if s == guess else s for s in steps[i:]]
                            yield Progress(sum(steps[:i]) + update.step, sum(steps), i + 1, n)
                        elif isinstance(update, Shown):
                            yield Shown(finished + update.gallery)
                        else:
                            made.append(update)
                            finished = finished + update.gallery
                            if n > 1:
                                yield Called(update, i + 1, n)
                            if len(made) < n:
                                yield Shown(finished)
                yield made[0] if n == 1 else batch_done(made)
            except GeneratorExit:
                closed.set()
                raise

    def generate(self, request: Request, progress: Callable[[int, int], None] | None = None,
                 abandoned: Callable[[], bool] | None = None) -> tuple[list[tuple[str, str]], list[int], str]:
        """A checked request's images, without previews: ([(path, caption)], seeds, summary).
        Raises RequestError for the user, Cancelled when `abandoned()` turned true first."""
        update = None
        for update in self._updates(request, abandoned or (lambda: False), previews=False):
            if isinstance(update, Progress) and progress is not None:
                progress(update.step, update.steps)
        assert isinstance(update, Done)  # (the stream's last)
        return update.gallery, update.seeds, update.summary

    def submit(self, request: Request, report: Report, abandoned: Callable[[], bool], previews: bool,
               image_format: str | None = None) -> Ticket:
        """A checked request, handed to the engine (see Engine.submit); refused while the model
        could not be loaded."""
        if self.warmup.error is not None:
            raise RequestError(self.warmup.error)
        return self.engine.submit(request, report, abandoned, previews, image_format)

    def _updates(self, request: Request, gone: Callable[[], bool], previews: bool
                 ) -> Iterator[Progress | Shown | Done]:
        """`stream`'s updates for a checked request: the work runs on the engine's threads, and what
        it reports is handed over here, in the caller's thread (where the web framework's progress
        display has its context), as are the images, encoded and written."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        ticket = self.submit(request, events.put, gone, previews)
        while not isinstance(event := events.get(), Ended):  # every ticket ends so (images, failure or cancel)
            if isinstance(event, Preview):
                yield Shown(previews_gallery(self.images, event.step, event.steps, event.images))
            else:
                yield event
        made = ticket.result()
        gallery, saving = final_gallery(self.images, made)
        self.metrics.count_images(len(gallery), saving)
        # (what ran, as the form names it: the sampler that ran, the Schedule type and RNG as asked)
        ran = dict(sampler=made.sampler, schedule=request.schedule, rng=request.rng)
        yield Done(gallery, made.seeds, summary(made, request.size, request.steps, saving, request.hires), ran)

    # -- stopping ---------------------------------------------------------------------------------

    def drain(self, busy: Callable[[], bool] = lambda: False, seconds: float | None = None) -> bool:
        """Stop taking requests and let those accepted finish (see drain.drain), for at most
        `seconds` (default: the settings' drain_seconds)."""
        return drain(self.warmup, self.engine, busy, self.settings.drain_seconds if seconds is None else seconds)

    def in_flight(self) -> list[str]:
        """What still runs inside XLA (loading, compiling, a call), which the process's end must mind."""
        return self.warmup.in_flight() + (["a call still runs"] if self.engine.busy else [])

    def run(self, web: Any, url: str, starting: str) -> int:
        """A server process's life: warm up in the background while `web` (internals.DrainingServer)
        answers at once at `url` (the first line says so, and what it starts: `starting`); say when
        ready (or, when the model cannot be loaded, why, and stop); serve until SIGTERM has drained;
        delete the images written; the exit status (1: no model)."""
        def stop_on_error() -> None:
            self.warmup.done_event.wait()
            if self.warmup.error is not None:
                print(f"error: {self.warmup.error}", file=sys.stderr, flush=True)
                web.should_exit = True
            elif self.ready:
                print(f"ready: {url} ({self.warmup.message})", flush=True)

        self.start()
        threading.Thread(target=stop_on_error, daemon=True).start()
        print(f"serving on {url} ({starting})", flush=True)
        web.run()
        if self._images is not None:
            self._images.close()
        print("stopped", flush=True)
        return end(self.in_flight(), 1 if self.warmup.error is not None else 0)
