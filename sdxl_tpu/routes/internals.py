"""What Gradio and uvicorn do not offer publicly, in one place. Each use here reads or sets
something internal to them; tests/server/test_internals.py checks every one against the installed
release, so an upgrade that changes them fails loudly there (requirements.txt keeps gradio
below its next major version).

Gradio: the queue's bookkeeping (which sessions and events exist, which run, whether work is
left), the running event's id, the "launched" flags of mounted Blocks, a gallery's record of the
files it may serve, the event that ends the queue's heartbeat streams, and how its MCP server
answers a gallery. uvicorn: its exit handling, for a SIGTERM that drains instead of stopping."""

from __future__ import annotations

import base64
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

log = logging.getLogger("sdxl_tpu.server")


def mark_launched(blocks: Any) -> None:
    """Put Gradio's own file checks in force for Blocks mounted with gr.mount_gradio_app.

    Gradio refuses input files that were not uploaded (processing_utils._check_allowed) only once
    the Blocks "has launched", which only Blocks.launch() sets; mounted Blocks never do, so any
    file-data object in any input made the server copy that file into its cache and serve it.
    Gradio marks Blocks it swaps in on reload the same way (utils.BaseReloader.swap_blocks).
    `is_running` too: while it is false Gradio also registers SVG input paths as static files and
    its queue stops sending heartbeats.
    """
    blocks.has_launched = True
    blocks.is_running = True


class QueueView:
    """What Gradio's queue holds, read from its bookkeeping as Gradio's own routes do.

    For the guard: which sessions and events exist (Gradio's event streams for anything else
    start a 200 response and then fail inside it, a 500 logged with a traceback, so the guard
    answers 404 first). For the server: whether an event is still wanted, when it was queued,
    and whether any work is left (to drain)."""

    def __init__(self, blocks: Any):
        self.blocks = blocks

    def has_session(self, session_hash: str) -> bool:
        return session_hash in self.blocks._queue.pending_messages_per_session

    def has_event(self, event_id: str) -> bool:
        queue = self.blocks._queue
        event = queue.event_ids_to_events.get(event_id)
        session = event.session_hash if event is not None else next(
            (s for s, ids in queue.pending_event_ids_session.items() if event_id in ids), event_id)
        return self.has_session(session)

    def _running(self) -> list:
        return [event for job in list(self.blocks._queue.active_jobs) if job for event in job]

    def running_event(self, event_id: str | None) -> Any:
        """The running event `event_id` while its caller is still there (Gradio marks an event
        not alive when its page or client disconnects, and forgets it when it is cancelled)."""
        return next((e for e in self._running() if e._id == event_id and e.alive), None)

    @staticmethod
    def current_event_id() -> str | None:
        """The id of the event whose handler is running in this thread."""
        from gradio.context import LocalContext

        return LocalContext.event_id.get(None)

    def waiting(self) -> int:
        """Events queued and not yet started."""
        return len(self.blocks._queue)

    def busy(self) -> bool:
        """Anything queued or running."""
        return self.waiting() > 0 or bool(self._running())


def forget_served(gallery: Any, paths: list[str]) -> None:
    """Files a gallery may no longer serve (deleted from the image store): Gradio's record of
    the files a component handed out, which it serves only while they are listed."""
    gallery.temp_files.difference_update(paths)


def serve_gallery_as_images(blocks: Any, read: Callable[[str], bytes | None]) -> None:
    """Answer an MCP tool call's gallery with its images (Blocks mounted with mcp_server=True).

    Gradio's MCP server (GradioMCPServer.postprocess_output_data) turns an output that is a file
    into an image of the protocol, re-encoded, but a gallery's value, a list of {"image": file,
    "caption"}, into one text. Here each gallery item becomes its file as written (its parameters
    inside), `read(path)` giving the bytes of a file the app wrote (None: not one), then its
    caption; the other outputs go through Gradio's own conversion."""
    mcp = blocks.mcp_server_obj
    postprocess, types = mcp.postprocess_output_data, mcp.types

    def items(data: Any) -> list:  # (a call with progress reports gets the outputs, one without a tuple of them)
        return [x for d in data for x in items(d)] if isinstance(data, (list, tuple)) else [data]

    def answer(data: list, root_url: str) -> list:
        images, others = [], []
        for output in items(data):
            image = output.get("image") if isinstance(output, dict) else None
            path = image.get("path") if isinstance(image, dict) else image
            blob = read(path) if isinstance(path, str) else None
            if blob is None:
                others.append(output)
                continue
            suffix = str(path).rsplit(".", 1)[-1].lower()
            images.append(types.ImageContent(type="image", data=base64.b64encode(blob).decode(),
                                             mimeType=f"image/{'jpeg' if suffix == 'jpg' else suffix}"))
            if output.get("caption"):
                images.append(types.TextContent(type="text", text=str(output["caption"])))
        return images + postprocess(others, root_url)

    mcp.postprocess_output_data = answer


def heartbeat_stopper(app: Any) -> Callable[[], None]:
    """What ends the heartbeat streams of the Gradio app mounted on `app` (gr.mount_gradio_app),
    so open pages do not hold a shutdown: its App's stop_event."""
    from starlette.routing import Mount

    gradio_app: Any = next(r.app for r in app.routes if isinstance(r, Mount))  # (Gradio's App)
    return gradio_app.stop_event.set


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM drains: `drain()` runs in a thread while the server keeps
    answering; when it returns, `before_exit()` runs in the event loop (e.g. to end long-lived
    streams that would hold the shutdown) and the server exits, without re-raising SIGTERM, so
    the process ends with status 0. SIGINT, or a second SIGTERM, stops at once as uvicorn does."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], object],
                 before_exit: Callable[[], None] | None = None):
        super().__init__(config)
        self.drain, self.before_exit = drain, before_exit
        self.draining = False
        self._drained = threading.Event()

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGTERM and not self.draining and not self.should_exit:
            self.draining = True
            threading.Thread(target=self._drain, name="sdxl-drain", daemon=True).start()
            return
        super().handle_exit(sig, frame)

    def _drain(self) -> None:
        try:
            self.drain()
        except Exception:
            log.exception("drain failed; exiting anyway")
        finally:
            self._drained.set()

    async def on_tick(self, counter: int) -> bool:
        if self._drained.is_set() and not self.should_exit:
            if self.before_exit is not None:
                self.before_exit()
            self.should_exit = True
        return await super().on_tick(counter)
