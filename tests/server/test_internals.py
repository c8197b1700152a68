"""Every use of Gradio's and uvicorn's internals (sdxl_tpu/routes/internals.py), checked against
the installed releases: if an upgrade renames or changes one, this fails here, by name, instead
of the page or the drain breaking quietly."""

from __future__ import annotations

import signal
import threading
from importlib.metadata import version

import gradio as gr
import pytest
import uvicorn
from fastapi import FastAPI

from sdxl_tpu.routes.internals import (DrainingServer, QueueView, forget_served, heartbeat_stopper, mark_launched,
                                      serve_gallery_as_images)


@pytest.fixture(scope="module")
def demo():
    with gr.Blocks() as blocks:
        gallery = gr.Gallery()
        gr.Button().click(lambda: None, outputs=[gallery])
    blocks.queue()
    blocks.gallery = gallery
    return blocks


def test_gradio_is_the_major_release_these_were_checked_against():
    assert version("gradio").split(".")[0] == "6"


def test_the_queue_bookkeeping_queue_view_reads(demo):
    queue = demo._queue
    assert isinstance(queue.pending_messages_per_session, dict)
    assert isinstance(queue.event_ids_to_events, dict)
    assert isinstance(queue.pending_event_ids_session, dict)
    assert isinstance(queue.active_jobs, list)
    view = QueueView(demo)
    assert view.waiting() == 0 and not view.busy()
    assert not view.has_session("nobody") and not view.has_event("nothing")
    assert view.running_event("nothing") is None
    # A session Gradio knows (as queue/join records it) is seen as one.
    queue.pending_messages_per_session["someone"] = object()
    try:
        assert view.has_session("someone")
    finally:
        del queue.pending_messages_per_session["someone"]


def test_an_event_carries_its_id_and_whether_its_caller_is_there(demo):
    from gradio.queueing import Event

    event = Event("someone", next(iter(demo.fns.values())), None, None)
    assert isinstance(event._id, str) and event._id and event.alive is True


def test_the_running_event_id_comes_from_gradios_context():
    from gradio.context import LocalContext

    token = LocalContext.event_id.set("an-event")
    try:
        assert QueueView.current_event_id() == "an-event"
    finally:
        LocalContext.event_id.reset(token)
    assert QueueView.current_event_id() is None


def test_mark_launched_puts_gradios_file_check_in_force(demo, tmp_path):
    """Unmarked (mounted) Blocks let any path through; marked, a file not uploaded is refused."""
    from gradio import processing_utils
    from gradio.context import LocalContext

    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    with gr.Blocks() as mounted:
        gr.Markdown("x")
    token = LocalContext.blocks.set(mounted)
    try:
        processing_utils._check_allowed(secret, check_in_upload_folder=True)  # not launched: no check
        mark_launched(mounted)
        assert mounted.has_launched and mounted.is_running
        with pytest.raises(Exception, match="not uploaded"):
            processing_utils._check_allowed(secret, check_in_upload_folder=True)
    finally:
        LocalContext.blocks.reset(token)


def test_a_gallery_forgets_files_it_may_serve(demo):
    gallery = demo.gallery
    gallery.temp_files.update({"/tmp/a.jpg", "/tmp/b.jpg"})
    forget_served(gallery, ["/tmp/a.jpg"])
    assert "/tmp/a.jpg" not in gallery.temp_files and "/tmp/b.jpg" in gallery.temp_files


def test_the_heartbeat_streams_end_on_the_mounted_apps_stop_event():
    with gr.Blocks() as blocks:
        gr.Markdown("x")
    app = gr.mount_gradio_app(FastAPI(), blocks, path="/")
    stop = heartbeat_stopper(app)
    from starlette.routing import Mount

    gradio_app = next(r.app for r in app.routes if isinstance(r, Mount))
    assert not gradio_app.stop_event.is_set()
    stop()
    assert gradio_app.stop_event.is_set()


def test_an_mcp_tool_calls_gallery_is_answered_with_its_images(tmp_path):
    """Gradio's MCP server converts outputs in postprocess_output_data (a gallery: into one text);
    the replacement answers each gallery item with its file as written and its caption, in both
    shapes a call's outputs come in (a tuple without progress reports, a list with), reads no file
    the app did not write, and leaves the other outputs to Gradio."""
    with gr.Blocks() as blocks:
        gallery, text = gr.Gallery(), gr.Markdown()
        gr.Button().click(lambda: None, outputs=[gallery, text], api_name="generate")
    gr.mount_gradio_app(FastAPI(), blocks, path="/", mcp_server=True)
    ours = tmp_path / "a.jpeg"
    ours.write_bytes(b"\xff\xd8 the app's image")
    serve_gallery_as_images(blocks, lambda path: ours.read_bytes() if path == str(ours) else None)
    items = [{"image": {"path": str(ours), "url": None}, "caption": "seed 1"},
             {"image": {"path": "/etc/passwd", "url": None}, "caption": None}]
    for outputs in ([(items, "summary")], [items, "summary"]):
        content = blocks.mcp_server_obj.postprocess_output_data(outputs, "http://127.0.0.1")
        assert [c.type for c in content] == ["image", "text", "text", "text"], content
        assert content[0].mimeType == "image/jpeg" and content[0].data == "/9ggdGhlIGFwcCdzIGltYWdl"
        assert content[1].text == "seed 1" and content[-1].text == "summary"
        assert "root:" not in content[2].text  # (a path it did not write: Gradio's text of it, never read)


def test_uvicorn_exit_handling_drains_on_the_first_sigterm():
    drained = threading.Event()
    ended = []
    server = DrainingServer(uvicorn.Config(FastAPI()), drain=drained.set, before_exit=lambda: ended.append(1))
    server.handle_exit(signal.SIGTERM, None)
    assert server.draining and not server.should_exit  # draining, still serving
    assert drained.wait(5) and server._drained.wait(5)
    import asyncio

    assert asyncio.run(server.on_tick(1)) is True  # uvicorn's loop asks on_tick whether to exit
    assert server.should_exit and ended == [1]
    # SIGINT stops at once, as uvicorn's own handler does.
    other = DrainingServer(uvicorn.Config(FastAPI()), drain=lambda: None)
    other.handle_exit(signal.SIGINT, None)
    assert other.should_exit and not other.draining


def test_the_tpu_runtime_pins_a_smaller_host_buffer_unless_one_is_chosen():
    """The TPU runtime's 4 GiB of pinned host memory took 11 s of a v5e replica's start (1 GiB: 4.9 s):
    the entry points ask for TPU_HOST_BUFFER_BYTES before JAX starts, and keep an operator's choice."""
    from sdxl_tpu.generate.compiling.compilation import TPU_HOST_BUFFER_BYTES, size_tpu_host_buffer

    env: dict[str, str] = {"JAX_PLATFORMS": "tpu"}
    size_tpu_host_buffer(env)
    assert env == {"JAX_PLATFORMS": "tpu", "TPU_PREMAPPED_BUFFER_SIZE": str(TPU_HOST_BUFFER_BYTES)}
    chosen = {"TPU_PREMAPPED_BUFFER_SIZE": str(4 << 30)}
    size_tpu_host_buffer(chosen)
    assert chosen == {"TPU_PREMAPPED_BUFFER_SIZE": str(4 << 30)}
