"""What makes a server's images, as the server core sees it: an `Engine` (the model in this process,
local_engine.py, or the back ends a front end sends its generations to, remote_engine.py), the
`Ticket` of one request's work in it, and what the work gives back (`Generated`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..request.names import DEFAULT_RNG, DEFAULT_SCHEDULE
from ..request.request import Request
from .events import Ended, Preview, Progress
from .offer import Offer

Size = tuple[int, int]
# What a ticket reports, in order: Progress after each denoising step, Preview now and then, and
# once Ended, when its result (or what stopped it) is ready.
Report = Callable[[Progress | Preview | Ended], None]


@dataclass
class Generated:
    """One request's images as files (format chosen by the server, parameters embedded), wherever
    they were made: by this process's pipeline or by a back end."""
    files: list[bytes]
    parameters: list[str]  # AUTOMATIC1111's text, as embedded in each file
    seeds: list[int]
    sampler: str
    timings: dict[str, float]  # seconds: text_encoding, denoising, decoding, total, encoding
    schedule: str = DEFAULT_SCHEDULE  # the Schedule type that ran ("Automatic" resolved)
    rng: str = DEFAULT_RNG
    format: str = "jpeg"  # of the files (a1111/images.py's FORMATS)


class Ticket:
    """One request's work in an engine. The engine's threads report to `report` as the work goes
    (see Report) and end with Ended; the caller then takes `result()` in its own thread, where the
    images are encoded (or what stopped them is raised)."""

    def __init__(self, report: Report, encode: Callable[[Any], Generated] | None = None):
        self.report, self._encode = report, encode
        self._outcome: Any = None
        self._error: BaseException | None = None

    # -- the engine's side ------------------------------------------------------------------------

    def progress(self, step: int, steps: int) -> None:
        self.report(Progress(step, steps))

    def preview(self, step: int, steps: int, images: Any) -> None:
        self.report(Preview(step, steps, images))

    def finish(self, outcome: Any = None, error: BaseException | None = None) -> None:
        """The work ended: its outcome (what `encode` turns into Generated) or what stopped it."""
        self._outcome, self._error = outcome, error
        self.report(Ended())

    # -- the caller's side ------------------------------------------------------------------------

    def result(self) -> Generated:
        """The images (once reported done), or what stopped them, raised. Taken once: the work's
        images are freed with it."""
        outcome, error, self._outcome, self._error = self._outcome, self._error, None, None
        if error is not None:
            raise error
        return self._encode(outcome) if self._encode is not None else outcome


class Engine(Protocol):
    """What the server core asks of whatever makes its images."""

    @property
    def loading_message(self) -> str: ...  # what the page says while it starts, and of a failure to start

    @property
    def no_tokenizer_message(self) -> str: ...  # the token counter's words when it has no tokenizer

    @property
    def watch_seconds(self) -> float | None: ...  # how often (s) `unavailable()` is asked; None: never

    def start(self) -> Offer:
        """Blocking: load (or connect), and say what is offered."""
        ...

    def failure_message(self, error: Exception) -> str: ...

    def ready_message(self, seconds: float, offer: Offer) -> str: ...

    def unavailable(self) -> str | None:
        """Why it cannot take work now (None: it can); asked every `watch_seconds`."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The first text encoder's tokenizer, for token counts (None while there is none)."""
        ...

    @property
    def compiling(self) -> list[Size]:
        """Offered sizes not compiled yet, in the order they will be."""
        ...

    @property
    def unfinished(self) -> list[Size]:
        """Sizes with programs still to compile (offered or not), in the order they will be."""
        ...

    def compile(self, size: Size) -> None:
        """Compile what `size` still lacks (blocking; the background's)."""
        ...

    def waits_for_compile(self, request: Request) -> bool:
        """Whether `request`'s first pass needs a program not compiled yet (it waits for it)."""
        ...

    def compiles(self) -> int:
        """XLA compilations in this process since it started (0 where nothing compiles)."""
        ...

    def programs_loaded(self) -> int:
        """Compiled programs loaded from the store (stored_programs.py) since it started."""
        ...

    @property
    def waiting(self) -> int:
        """Requests waiting in the engine (not yet running)."""
        ...

    @property
    def busy(self) -> bool:
        """Whether any accepted request is still waiting or running."""
        ...

    def concurrency(self) -> int:
        """How many requests the web server should hand over at once."""
        ...

    def submit(self, request: Any, report: Report, abandoned: Callable[[], bool], previews: bool,
               image_format: str | None = None) -> Ticket:
        """Start a checked request's work (raises at once what refuses it at the door: warming up,
        the queue full, shutting down; more images than a call makes); `abandoned()` says whether
        its caller has gone; its images as files in `image_format` (None: the server's)."""
        ...

    def upscale(self, image: Any, upscaler: str, scale: float) -> Any:
        """A PIL `image` upscaled by `scale` with `upscaler` (Lanczos or a model the offer names), as
        A1111's Extras does (blocking; RequestError where it cannot)."""
        ...

    def close(self, stop_running: bool) -> None:
        """Accept nothing more; cancel what runs if `stop_running`."""
        ...
