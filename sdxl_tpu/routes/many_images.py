"""A request for any number of images, as the APIs of other tools ask (A1111's batch_size x n_iter,
OpenAI's n), split into the server's calls (request/calls.py), each run
through the engine while its HTTP caller waits (a caller who leaves stops it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from starlette.requests import Request as HTTPRequest

from ..request.request import Request
from ..server.batcher import ShuttingDown
from ..server.core import Server
from ..server.engine import Generated, Report
from ..server.events import Ended, Preview, Progress


async def one_call(server: Server, http: HTTPRequest, request: Request, image_format: str,
                   report: Report = lambda event: None, stopped: Callable[[], bool] = lambda: False) -> Generated:
    """One request's images through the engine (progress and previews to `report`); the caller
    leaving or `stopped()` turning true stops it (Cancelled)."""
    if server.warmup.draining:  # (between the calls of a request too)
        raise ShuttingDown()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    gone = threading.Event()

    def told(event: Progress | Preview | Ended) -> None:  # (the engine's threads)
        if isinstance(event, Ended):
            loop.call_soon_threadsafe(done.set)
        else:
            report(event)

    ticket = server.submit(request, told, lambda: gone.is_set() or stopped(), previews=True, image_format=image_format)
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 0.25)
        except TimeoutError:
            if await http.is_disconnected():
                gone.set()
    return await asyncio.to_thread(ticket.result)


__all__ = ["one_call"]
