"""Serving one pipeline to many callers: requests that arrive together share a call, abandoned
work stops, a full queue or a drain refuses new work with a message.

`Batcher` owns the accelerator: one thread takes waiting requests and runs them through
`Pipeline.run_images`. On a host with more chips than one request has images (v5e-8, 8 x H200),
requests of the same size, step count, sampler, Schedule type and kind of guidance are packed into one call (their
noise sources may differ: each image draws its own); a lone request waits at
most `max_wait` for a partner. A request whose caller has gone is dropped while it waits and,
once running, stopped between denoising steps (when every request of its call has gone).

(The web server's SIGTERM drain, uvicorn's server subclassed, is internals.DrainingServer.)
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import numpy as np

from ..request.errors import Cancelled, RequestError
from ..request.request import GenerationResult, ImageInfo, guided, preview_cadence

log = logging.getLogger("sdxl_tpu.server.batcher")

SHUTTING_DOWN = "The server is shutting down; please try again in a moment."
BUSY = "The server is busy (its queue is full); please try again in a moment."
MAX_WAIT_SECONDS = 0.02


class QueueFull(Exception):
    """Turned away at the door: as many requests wait as the queue holds (try another server)."""


class ShuttingDown(RequestError):
    """Turned away at the door: the server is draining (try another server)."""

    def __init__(self, message: str = SHUTTING_DOWN):
        super().__init__(message)


class StillCompiling(RequestError):
    """A size this server offers but has not compiled yet (it will shortly; another server may have it)."""


def never() -> bool:
    return False


@dataclass(eq=False)
class Job:
    """One caller's images, waiting for (or in) a pipeline call."""
    infos: list[ImageInfo]
    progress: Callable[[int, int], None] | None = None
    abandoned: Callable[[], bool] = never
    done: threading.Event = field(default_factory=threading.Event)
    result: GenerationResult | None = None
    error: BaseException | None = None
    on_done: Callable[[Job], None] | None = None  # told (on the accelerator's thread) once `done` is set
    preview: Callable[[int, int, np.ndarray], None] | None = None  # (step, steps, its images' previews)
    init_image: np.ndarray | None = None  # from an image: it at the call's size, (H, W, 3) uint8
    mask: np.ndarray | None = None  # inpainting: where it is repainted, (H, W) uint8

    def outcome(self) -> GenerationResult:
        """The images, or what stopped them (raised); call once `done` is set."""
        if self.error is not None:
            raise self.error
        if self.result is None:
            raise RuntimeError("the job is not done")
        return self.result

    @property
    def shape(self) -> tuple:
        """What a call's images must share: one sampler's tables on one schedule and strength (and whether they
        are guided: a call of unguided images runs the UNet on half the batch, so they are not
        mixed with guided ones), whether they are masked (inpainting), their hires fix and their
        ControlNets' settings (each image brings its own control images). The RNG is per image: JAX
        and CPU noise mix in a call."""
        first = self.infos[0]
        return (first.size, first.steps, first.sampler, first.schedule, first.strength, guided(self.infos),
                self.mask is not None, first.hires, first.controls)


class Batcher:
    """Runs callers' images through `pipeline` (anything with `images_per_call` and
    `run_images(infos, progress=, stop=)`) on one thread, several callers per call when they fit."""

    def __init__(self, pipeline, max_wait: float = MAX_WAIT_SECONDS,
                 on_call: Callable[[int, GenerationResult | None], None] | None = None,
                 max_waiting: int | None = None, preview_every: int | None = None):
        self.pipeline, self.max_wait, self.on_call = pipeline, max_wait, on_call
        self.preview_every = preview_every  # steps between previews (None: about four a run; 0: none)
        self.max_waiting = max_waiting  # None: unbounded (the web server's queue bounds it)
        self.capacity = pipeline.images_per_call
        self.calls = 0  # pipeline calls made (a call may serve several callers)
        self._jobs: collections.deque[Job] = collections.deque()
        self._running: list[Job] = []
        self._cond = threading.Condition()
        self._closed = self._stop_all = False
        self._thread = threading.Thread(target=self._loop, name="sdxl-batcher", daemon=True)
        self._thread.start()

    # -- callers ----------------------------------------------------------------------------------

    def submit(self, infos: Sequence[ImageInfo], progress: Callable[[int, int], None] | None = None,
               abandoned: Callable[[], bool] = never) -> GenerationResult:
        """Blocks until the images are made. Raises Cancelled if `abandoned()` turned true (or the
        server stopped everything), RequestError once closed, QueueFull when `max_waiting`
        callers already wait, or what the pipeline raised."""
        job = self.enqueue(infos, progress, abandoned)
        job.done.wait()
        return job.outcome()

    def enqueue(self, infos: Sequence[ImageInfo], progress: Callable[[int, int], None] | None = None,
                abandoned: Callable[[], bool] = never, on_done: Callable[[Job], None] | None = None,
                preview: Callable[[int, int, np.ndarray], None] | None = None,
                init_image: np.ndarray | None = None, mask: np.ndarray | None = None) -> Job:
        """`submit` without waiting: the accepted job (its `done` is set, and `on_done(job)` called,
        when it ends). Raises at once what `submit` raises at the door. `preview(step, steps,
        images)` is given live previews of its images (see preview.py), if any are made.
        `init_image`: the image its images start from (img2img; their infos carry the strength), and
        `mask` where it is repainted (inpainting; their infos carry the mask's settings)."""
        if not 1 <= len(infos) <= self.capacity:
            raise ValueError(f"a request makes 1 to {self.capacity} images, not {len(infos)}")
        if (init_image is None) != (infos[0].strength is None):
            raise ValueError("images that start from an image need their denoising strength, and only they")
        if mask is not None and init_image is None:
            raise ValueError("a mask comes with the image it masks")
        job = Job(list(infos), progress, abandoned, on_done=on_done, preview=preview, init_image=init_image,
                  mask=mask)
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            if self.max_waiting is not None and len(self._jobs) >= self.max_waiting:
                raise QueueFull(BUSY)
            self._jobs.append(job)
            self._cond.notify_all()
        return job

    @property
    def waiting(self) -> int:
        """Callers waiting for a call."""
        return len(self._jobs)

    @property
    def busy(self) -> bool:
        return bool(self._jobs or self._running)

    def close(self, stop_running: bool = False) -> None:
        """Accept nothing more; what was accepted still runs unless `stop_running`, which cancels
        it (waiting callers and the running call, at its next step)."""
        with self._cond:
            self._closed = True
            self._stop_all = self._stop_all or stop_running
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the accelerator's thread -----------------------------------------------------------------

    def _gone(self, job: Job) -> bool:
        try:
            return self._stop_all or bool(job.abandoned())
        except Exception:  # a broken predicate must not stop the accelerator's thread
            log.exception("abandoned() failed; treating the request as still wanted")
            return False

    def _drop_abandoned(self) -> None:
        for job in [j for j in self._jobs if self._gone(j)]:
            self._jobs.remove(job)
            self._finish(job, error=Cancelled("dropped while waiting: the caller has gone"))

    @staticmethod
    def _finish(job: Job, result: GenerationResult | None = None, error: BaseException | None = None) -> None:
        job.result, job.error = result, error
        job.done.set()
        if job.on_done is not None:
            try:
                job.on_done(job)
            except Exception:  # a caller's notification must not stop the accelerator's thread
                log.exception("on_done failed")

    def _next_call(self) -> list[Job] | None:
        """The jobs of the next call: the oldest, plus later ones of the same shape that fit, for
        at most `max_wait` while there is room. None once closed and empty."""
        with self._cond:
            while True:
                self._drop_abandoned()
                if self._jobs:
                    break
                if self._closed:
                    return None
                self._cond.wait()
            batch = [self._jobs.popleft()]
            deadline = time.monotonic() + self.max_wait
            while True:
                room = self.capacity - sum(len(j.infos) for j in batch)
                for job in list(self._jobs):
                    if job.shape == batch[0].shape and len(job.infos) <= room and not self._gone(job):
                        self._jobs.remove(job)
                        batch.append(job)
                        room -= len(job.infos)
                left = deadline - time.monotonic()
                if room < len(batch[0].infos) or left <= 0 or self._closed:
                    self._running = batch
                    return batch
                self._cond.wait(left)

    def _loop(self) -> None:
        while (batch := self._next_call()) is not None:
            try:
                self._run(batch)
            except Exception as e:  # a bug here must fail its call's requests, not hang them and the queue
                log.exception("a call failed in the batcher")
                for job in batch:
                    if not job.done.is_set():
                        self._finish(job, error=e)
            finally:
                self._running = []

    def _tell(self, job: Job, what: str, *args) -> None:
        callback = getattr(job, what)
        if callback is not None and not self._gone(job):
            try:
                callback(*args)
            except Exception:  # a caller's progress display must not fail the others
                log.exception("%s callback failed", what)

    def _run(self, batch: list[Job]) -> None:
        def progress(done: int, steps: int) -> None:
            for job in batch:
                self._tell(job, "progress", done, steps)

        def preview(step: int, steps: int, images) -> None:
            start = 0
            for job in batch:
                self._tell(job, "preview", step, steps, images[start:start + len(job.infos)])
                start += len(job.infos)

        images = sum(len(j.infos) for j in batch)
        # Previews only when a caller shows them (an API caller that waits for the result does not).
        options: dict = {}  # run_images' optional arguments
        if any(job.preview is not None for job in batch):
            every = preview_cadence(self.preview_every, batch[0].infos[0].steps)
            options.update(preview=preview, preview_every=every)
        if batch[0].init_image is not None:  # (strength is in a job's shape: all of the call or none)
            options["init_images"] = np.concatenate([np.repeat(_given(j.init_image)[None], len(j.infos), axis=0)
                                                      for j in batch])
        if batch[0].mask is not None:  # (as the image: all of the call or none)
            options["masks"] = np.concatenate([np.repeat(_given(j.mask)[None], len(j.infos), axis=0) for j in batch])
        try:
            result = self.pipeline.run_images([i for j in batch for i in j.infos], progress=progress,
                                              stop=lambda: all(self._gone(j) for j in batch), **options)
        except BaseException as e:  # every caller of the call learns what happened
            if isinstance(e, Cancelled):
                log.info("call %s", e)
            self.calls += 1
            self._report(images, None)
            for job in batch:
                self._finish(job, error=e)
            if not isinstance(e, Exception):
                raise
            return
        self.calls += 1
        self._report(images, result)
        start = 0
        for job in batch:
            n = len(job.infos)
            part = GenerationResult(result.images[start:start + n], result.infos[start:start + n],
                                    dict(result.timings))
            start += n
            if self._gone(job):  # its caller left while the call ran: nobody to give the images to
                self._finish(job, error=Cancelled("finished after the caller had gone"))
            else:
                self._finish(job, result=part)

    def _report(self, images: int, result: GenerationResult | None) -> None:
        if self.on_call is not None:
            try:
                self.on_call(images, result)
            except Exception:
                log.exception("on_call failed")


def _given(image: np.ndarray | None) -> np.ndarray:
    """A job's starting image or mask, where the call's first job has one (a call's jobs share their kind)."""
    if image is None:
        raise ValueError("the jobs of one call all start from an image (and a mask), or none does")
    return image
