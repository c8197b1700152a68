"""Stopping: the drain a SIGTERM starts (not ready at once, accepted work finishes, then the process
exits 0), and how the process ends when a thread is still inside XLA.

Why the end needs care: while a thread compiles (the other sizes, in the background) or loads, it
is inside XLA's C++ code. Python's finalization stops such daemon threads by unwinding them from
under that code, which XLA's exception handling turns into `terminate called after throwing an
instance of ...` and SIGABRT: a pod stopped while it warms up would crash instead of exiting 0.
So a process whose XLA work is still in flight ends without finalization (`os._exit`), once its
output is flushed; the work is dropped (a compile not finished writes nothing to the cache).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

from .engine import Engine
from .errors import log
from .warmup import Warmup


def drain(warmup: Warmup, engine: Engine, busy: Callable[[], bool], seconds: float, poll: float = 0.05) -> bool:
    """Stop taking requests and let those accepted finish: not ready at once, then wait until
    neither `busy()` (the web server's queue) nor the engine has work, for at most `seconds`. What
    is still running then is cancelled. Returns whether everything finished."""
    warmup.drain()
    log.info("draining: finishing the requests already accepted (at most %.0f s)", seconds)
    deadline = time.monotonic() + seconds
    working = lambda: busy() or engine.busy
    while working() and time.monotonic() < deadline:
        time.sleep(poll)
    finished = not working()
    engine.close(stop_running=not finished)
    log.info("drained" if finished else "drain deadline passed: the requests still running were cancelled")
    return finished


def end(in_flight: list[str], code: int) -> int:
    """The process's exit status, `code`; or, while threads are still inside XLA (`in_flight`: what
    they do), the exit itself, at once, without finalizing the interpreter (see the module's docstring)."""
    if not in_flight:
        return code
    log.info("exiting while %s: that work is dropped", " and ".join(in_flight))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
