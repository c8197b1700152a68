"""The back ends a front end sends its generations to (an Engine, engine.py), over remote.py's
client: no model here, no JAX. Readiness follows them as they come and go."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..request.errors import RequestError
from ..request.request import Request
from ..weights.hub import load_tokenizer
from .engine import Report, Ticket
from .errors import log
from .offer import Offer
from .remote import Backend, CHECK_SECONDS
from .settings import Settings


class RemoteEngine:
    """The back ends at `settings.backend` (usually a load balancer); `on_call(timings)` after each
    generation they made for this server."""

    no_tokenizer_message = "No token count here (the front end has no tokenizer for this model)."
    watch_seconds = CHECK_SECONDS  # back ends come and go: readiness follows them
    compiling: list[tuple[int, int]] = []  # (they compile; a front end offers what they have)
    unfinished: list[tuple[int, int]] = []
    busy = False  # (nothing waits here: each request is sent at once)
    waiting = 0

    def __init__(self, settings: Settings, on_call: Callable[[dict[str, float] | None], None] = lambda t: None):
        self.settings, self._on_call = settings, on_call
        if settings.backend is None:
            raise ValueError("a remote engine sends its work to back ends: give it their addresses (--backend)")
        self.backend = Backend(settings.backend)
        self.offer: Offer | None = None
        self._tokenizer: Any = None

    @property
    def loading_message(self) -> str:
        return f"Connecting to the back end at {self.settings.backend}; this page will work once it answers."

    def failure_message(self, error: Exception) -> str:
        return f"Could not reach the back end at {self.settings.backend}: {str(error).rstrip('.')}."

    def ready_message(self, seconds: float, offer: Offer) -> str:
        return f"Ready: images are made by {offer.model} on the back ends."

    def start(self) -> Offer:
        """Waits, however long, until a back end describes itself: the page and /healthz answer
        meanwhile, /readyz says 503 (back ends download and compile for minutes)."""
        self.offer = Offer.from_json(self.backend.describe())
        # Token counts need only the model's tokenizer files, which a front end may not reach
        # (a back end's local path, no network): then the page goes without them.
        threading.Thread(target=self._load_tokenizer, args=(self.offer.model,), name="sdxl-tokenizer",
                         daemon=True).start()
        return self.offer

    def _load_tokenizer(self, model: str) -> None:
        try:  # (a model with another UNet is named "BASE + UNET"; the tokenizer is the base's)
            self._tokenizer = load_tokenizer(model.split(" + ")[0])
        except Exception as e:  # best effort: the page works without token counts
            log.info("no tokenizer for %s (token counts are not shown): %s", model, e)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def unavailable(self) -> str | None:
        """None while a back end answers; else why not (one try)."""
        try:
            self.backend.describe(wait_seconds=0)
        except OSError as e:
            return f"at {self.settings.backend}: {e}"
        return None

    def waits_for_compile(self, request: Request) -> bool:  # (a back end offers only what it has compiled)
        return False

    def compile(self, size: tuple[int, int]) -> None:  # (nothing compiles here)
        pass

    def compiles(self) -> int:
        return 0

    def programs_loaded(self) -> int:
        return 0

    def concurrency(self) -> int:
        """As many as the queue holds: the back ends queue and balance them."""
        return self.settings.queue_size

    def submit(self, request: Request, report: Report, abandoned: Callable[[], bool], previews: bool,
               image_format: str | None = None) -> Ticket:
        ticket = Ticket(report)

        def ask_the_back_end() -> None:
            try:
                image_format_used = image_format or (self.offer.image_format if self.offer else None)
                if image_format_used is None:
                    raise RuntimeError("the back ends have not said what they offer yet")
                made = self.backend.generate(request, progress=ticket.progress, abandoned=abandoned,
                                             image_format=image_format_used,
                                             preview=ticket.preview if previews else None)
            except BaseException as e:  # handed to the caller, raised there
                ticket.finish(error=e)
                return
            self._on_call(made.timings)
            ticket.finish(made)

        threading.Thread(target=ask_the_back_end, name="sdxl-remote", daemon=True).start()
        return ticket

    def upscale(self, image: Any, upscaler: str, scale: float) -> Any:
        raise RequestError("This front end does not upscale images itself: ask a back end's /sdapi/v1 directly.")

    def close(self, stop_running: bool) -> None:
        pass
