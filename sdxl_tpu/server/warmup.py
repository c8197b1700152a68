"""A server's warm-up and compilation state. The page answers at once while, in the background, the
model loads and what a first call at its first size runs compiles (a front end: waits for its back
ends); then the rest compiles size by size, each size offered once ready; readiness follows an
engine that can go away.

    status: "loading" -> "ready", or "error"; "waiting" while the engine is unavailable;
            "draining" once the server is asked to stop
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..request.errors import CompileError, RequestError
from ..request.values import format_size, parse_size
from ..weights.errors import CheckpointError, PreviewDecoderError
from .batcher import SHUTTING_DOWN, StillCompiling
from .engine import Engine, Size
from .errors import log
from .offer import Offer
from .settings import model_not_found_message


_DOING = {"sdxl-warmup": "the model still loads", "sdxl-compile": "sizes still compile"}


class Warmup:
    """`offer` is what the server offers: the settings' provisional one until the engine describes
    itself (`described`). `on_ready(ready)` is told each change of readiness."""

    def __init__(self, engine: Engine, provisional: Offer, on_ready: Callable[[bool], None] = lambda ready: None):
        self.engine, self.offer, self.on_ready = engine, provisional, on_ready
        self.described = False
        self.status, self.message = "loading", engine.loading_message
        self.error: str | None = None
        self.done_event = threading.Event()  # loading ended, ready or not
        self.compiled_event = threading.Event()  # every size compiled (or failed to: `failed`)
        self.failed: list[Size] = []  # sizes whose background compile failed (logged)
        self._threads: list[threading.Thread] = []  # those that may be inside XLA: loading, compiling

    def start(self) -> threading.Thread:
        return self._thread(self.load, "sdxl-warmup")

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def load(self) -> None:
        """Load and compile the first size, or wait until a back end describes itself (blocking);
        the status becomes "ready" or "error"."""
        start = time.perf_counter()
        try:
            offer = self.engine.start()
        except PreviewDecoderError as e:  # its message says what to do (--preview approx, or a local copy)
            self._fail(str(e))
        except (CheckpointError, OSError, ValueError) as e:
            self._fail(self.engine.failure_message(e))
        except CompileError as e:  # (the model is not what failed: its message says what did; the log the rest)
            self._fail(str(e))
        except Exception as e:  # anything else: still no traceback for the user, but keep it in the log
            traceback.print_exc()
            self._fail(model_not_found_message(self.offer.model, f"{type(e).__name__}: {e}"))
        else:
            self.offer, self.described = offer, True
            if self.status == "loading":  # (a drain may have begun meanwhile)
                self._become("ready", self.engine.ready_message(time.perf_counter() - start, offer))
            if self.engine.unfinished:
                self._thread(self._compile_the_rest, "sdxl-compile")
            else:
                self.compiled_event.set()
            if self.engine.watch_seconds is not None:
                threading.Thread(target=self._follow, name="sdxl-follow", daemon=True).start()
        finally:
            self.done_event.set()

    def _compile_the_rest(self) -> None:
        """Compile what the first call did not need, size by size: the first size's other
        programs (guidance 1, from an image), then the other sizes (each offered once compiled)."""
        for size in self.engine.unfinished:
            if self.draining:
                return
            start = time.perf_counter()
            try:
                self.engine.compile(size)
            except Exception:  # the sizes compiled so far keep serving, the others still compile
                log.exception("compiling %s failed", format_size(size))
                self.failed.append(size)
                continue
            log.info("compiled %s in %.1f s", format_size(size), time.perf_counter() - start)
        self.compiled_event.set()

    def _follow(self) -> None:
        """Readiness follows an engine that comes and goes (a front end's back ends): "waiting" while
        it is unavailable, ready again once it is back; the server never exits for it."""
        seconds = self.engine.watch_seconds
        while not self.draining and seconds is not None:
            time.sleep(seconds)
            missing = self.engine.unavailable()
            if missing is not None and self.status == "ready":
                self._become("waiting", f"Waiting for the back ends {missing.rstrip('.')}.")
                log.warning("the back ends do not answer: %s", missing)
            elif missing is None and self.status == "waiting":
                self._become("ready", self.engine.ready_message(0.0, self.offer))
                log.info("the back ends answer again")

    def _become(self, status: str, message: str) -> None:
        self.status, self.message = status, message
        self.on_ready(status == "ready")

    def _fail(self, message: str) -> None:
        self.status, self.error, self.message = "error", message, message

    def drain(self) -> None:
        """Not ready from now on: the server stops taking requests (no more sizes compile)."""
        self._become("draining", SHUTTING_DOWN)

    def in_flight(self) -> list[str]:
        """What is still loading or compiling (inside XLA, where a process must not be finalized)."""
        return [_DOING[t.name] for t in self._threads if t.is_alive()]

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def draining(self) -> bool:
        return self.status == "draining"

    @property
    def compiling(self) -> list[Size]:
        """Offered sizes not compiled yet (in the order they will be)."""
        return [size for size in self.engine.compiling if size not in self.failed]

    @property
    def broken(self) -> list[Size]:
        """Offered sizes that failed to compile and cannot serve."""
        return [size for size in self.engine.compiling if size in self.failed]

    @property
    def ready_sizes(self) -> list[Size]:
        """The sizes a request may ask for now."""
        unready = self.engine.compiling
        return [size for size in self.offer.sizes if size not in unready]

    @property
    def status_line(self) -> str:
        """What the page says of the server: its message, how many sizes are still compiling, and
        which failed to."""
        compiling, broken = (self.compiling, self.broken) if self.ready else ([], [])
        line = self.message
        if compiling:
            line += (f" {len(compiling)} more size{'s' if len(compiling) > 1 else ''} compiling "
                     f"({', '.join(format_size(s) for s in compiling)}); they join the size menu when ready.")
        if broken:
            line += f" {', '.join(map(format_size, broken))} did not compile on this server (see its log)."
        return line

    def readiness(self) -> tuple[dict[str, Any], int]:
        """GET /readyz: the body and status code (200 once warm, 503 while loading, waiting or
        draining), with the sizes still compiling ("compiling": not offered yet; "unfinished": any
        program still compiling in the background, an offered size's guidance-1 loop or image
        encoder included)."""
        unfinished = [s for s in self.engine.unfinished if s not in self.failed]
        return ({"status": self.status, "message": self.status_line,
                 "compiling": [format_size(s) for s in self.compiling],
                 "unfinished": [format_size(s) for s in unfinished]}, 200 if self.ready else 503)

    def check_size(self, size: Any) -> None:
        """Refuses a size that is offered but not compiled yet (StillCompiling), before anything else."""
        try:
            wanted = parse_size(size)
        except RequestError:
            return  # the field's own check names the problem
        if wanted in self.broken:
            raise RequestError(f"Size {format_size(wanted)} did not compile on this server (its log says why); the "
                               "sizes ready: " + ", ".join(map(format_size, self.ready_sizes)) + ".")
        if wanted in self.compiling:
            raise StillCompiling(f"Size {format_size(wanted)} is still being compiled; it will be available in a "
                                 "moment (the sizes ready now: " + ", ".join(map(format_size, self.ready_sizes)) + ").")
