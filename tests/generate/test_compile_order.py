"""A new server's compile order (issue 51): what a first call runs compiles first, side by side,
while the weights are read; the first image never waits for a program it does not use; the rest
follows in the background, each program made once however many threads ask for it. XLA's compile
is made slow on purpose here, as a TPU's is (minutes a program): every program's compile waits for
the event that must come first."""

from __future__ import annotations

import collections
import threading

import pytest

from sdxl_tpu import CompileCounter
from sdxl_tpu.generate.compiling import compilation
from sdxl_tpu.server.core import Server
from sdxl_tpu.server.events import Done, Started
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.page.page_run import page_run
from sdxl_tpu.server.settings import Settings
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.request.recipes import RECIPES
from sdxl_tpu.weights.checkpoint import Checkpoint

SIZES = [(64, 64), (96, 64)]
FIELDS = dict(prompt="a cat", negative="", style="(No style)", seed=5, randomize=False, guidance=5.0, steps=2,
              size="64x64", sampler=None, schedule=None, rng=None)
WAIT = 30  # seconds: only a broken order waits this long (a test that fails, never a slow one)


def end(server: Server) -> None:
    """The background's compiles ended (a thread inside XLA at the interpreter's exit aborts it),
    the batcher closed."""
    if server.warmup.done_event.is_set() and server.warmup.status == "ready":
        assert server.warmup.compiled_event.wait(WAIT)
    if server.engine.batcher is not None:
        server.engine.batcher.close()


def test_the_first_call_compiles_first_side_by_side_and_the_first_image_waits_for_nothing_else(
        tiny_checkpoint, tiny_pipeline, tmp_path, monkeypatch):
    """(tiny_pipeline: the same programs are in JAX's persistent cache, so each real compile is quick.)"""
    first_image = threading.Event()
    started: list[str] = []
    compile_program = compilation.compile_program
    server = Server(Settings(load=LoadOptions(model=str(tiny_checkpoint), dtype="float32", sizes=SIZES),
                             compile_cache=None), images=ImageStore(tmp_path / "images"))
    first_call = ("encode", "noise", "denoise", "decode")  # (text to image, guided: before the pipeline exists)
    # The first call's programs all compile at once, or this barrier breaks (each waits for the others).
    together = threading.Barrier(len(first_call), timeout=WAIT)

    compiling = threading.Event()  # the weights are read while the first programs compile
    fill = Checkpoint.fill

    def fill_while_compiling(checkpoint, models):
        assert compiling.wait(WAIT), "the weights were read before any program began to compile"
        return fill(checkpoint, models)

    def slow(name: str, lowered):
        started.append(name)
        compiling.set()
        if not first_image.is_set():
            if name in first_call and len(started) <= len(first_call):
                together.wait()
            else:  # anything else waits for the first image: were that image waiting on it, both would hang
                assert first_image.wait(WAIT), f"{name} waited for the first image in vain"
        return compile_program(name, lowered)

    monkeypatch.setattr(compilation, "compile_program", slow)
    monkeypatch.setattr(compilation, "compile_workers", lambda: 8)  # (an accelerator's: a CPU's is 1)
    monkeypatch.setattr(Checkpoint, "fill", fill_while_compiling)
    try:
        server.warmup.load()  # (blocking: loaded, and the first call's programs compiled)
        assert server.warmup.status == "ready", server.warmup.message
        assert server.engine.pipeline.call_programs() == first_call
        assert sorted(started) == sorted(first_call), started
        assert server.warmup.compiling == [(96, 64)] and "1 more size compiling (96x64)" in server.warmup.status_line
        body, status = server.warmup.readiness()  # (what /readyz says: ready, and what still compiles)
        assert status == 200 and body["compiling"] == ["96x64"] and body["unfinished"] == ["64x64", "96x64"]
        assert server.warmup.ready_sizes == [(64, 64)] and not server.warmup.compiled_event.is_set()

        with CompileCounter() as counter:
            updates = list(server.stream(FIELDS))
        assert isinstance(updates[-1], Done), updates[-1]
        assert counter.compiles == 0  # (what the first image ran was all compiled; the rest still waits)
        assert isinstance(updates[0], Started) and not updates[0].compiling
        # A run of another kind (guidance 1: the unguided loop, still waiting to compile) says so at its
        # start, and the page's run panel tells the person why nothing moves yet.
        unguided = server.stream({**FIELDS, "guidance": 1.0})
        announced = next(unguided)
        unguided.close()  # (nothing submitted: the run is checked, then the stream closed)
        assert isinstance(announced, Started) and announced.compiling
        panel = next(page_run([announced], FIELDS, []))["panel"]
        assert "waiting for its programs to compile" in str(panel)
        first_image.set()

        # Guidance 1 runs the unguided loop: the background compiles it too; this call waits for
        # that compile (or makes it first), never a second one.
        assert isinstance(list(server.stream({**FIELDS, "guidance": 1.0}))[-1], Done)
        assert server.warmup.compiled_event.wait(WAIT)
        assert server.warmup.compiling == [] and server.engine.unfinished == []
        assert server.warmup.readiness() == ({"status": "ready", "message": server.warmup.message, "compiling": [],
                                             "unfinished": []}, 200)
        per_size = set(server.engine.pipeline.programs_at()) - {"encode"}
        assert collections.Counter(started) == {"encode": 1, **{name: len(SIZES) for name in per_size}}, started
        rest = per_size - set(first_call)  # (the first size's: before any other size's)
        assert set(started[len(first_call):len(first_call) + len(rest)]) == rest, started
        with CompileCounter() as counter:
            assert isinstance(list(server.stream({**FIELDS, "size": "96x64"}))[-1], Done)
        assert counter.compiles == 0
    finally:
        first_image.set()
        end(server)


def _server(tiny_checkpoint, tmp_path) -> Server:
    return Server(Settings(load=LoadOptions(model=str(tiny_checkpoint), dtype="float32", sizes=SIZES),
                           compile_cache=None), images=ImageStore(tmp_path / "images"))


def test_a_program_that_does_not_compile_at_start_is_said_as_such_not_as_a_missing_model(
        tiny_checkpoint, tiny_pipeline, tmp_path, monkeypatch):
    def fails(name: str, lowered):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem (a fake)\nmore of XLA's report")

    monkeypatch.setattr(compilation, "compile_program", fails)
    server = _server(tiny_checkpoint, tmp_path)
    server.warmup.load()
    message = server.warmup.message
    assert server.warmup.status == "error" and "\n" not in message, message
    assert message.startswith("The model loaded, but its programs for 64x64 did not compile (RuntimeError: "
                              "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem (a fake))"), message
    assert "Could not load the model" not in message and "more of XLA's report" not in message


def test_a_size_that_does_not_compile_in_the_background_is_refused_by_name_while_the_others_serve(
        tiny_checkpoint, tiny_pipeline, tmp_path, monkeypatch):
    compile_program, ready = compilation.compile_program, threading.Event()

    def fails_once_ready(name: str, lowered):
        if ready.is_set():
            raise RuntimeError("RESOURCE_EXHAUSTED: out of HBM (a fake)")
        return compile_program(name, lowered)

    monkeypatch.setattr(compilation, "compile_program", fails_once_ready)
    server = _server(tiny_checkpoint, tmp_path)
    try:
        told = server.warmup.on_ready  # (told "ready" before the background starts)
        server.warmup.on_ready = lambda now_ready: (told(now_ready), now_ready and ready.set())
        server.warmup.load()
        assert server.warmup.compiled_event.wait(WAIT)  # (ended: every size tried)
        assert server.warmup.failed == SIZES and server.warmup.broken == [(96, 64)]
        assert server.warmup.compiling == [] and server.warmup.ready_sizes == [(64, 64)]
        assert server.warmup.readiness()[0]["unfinished"] == []  # (nothing compiles any more)
        assert server.warmup.status_line.endswith(" 96x64 did not compile on this server (see its log).")
        with pytest.raises(RequestError, match=r"^Size 96x64 did not compile on this server \(its log says why\); "
                                               r"the sizes ready: 64x64\.$"):
            list(server.stream({**FIELDS, "size": "96x64"}))
        assert isinstance(list(server.stream(FIELDS))[-1], Done)  # (64x64 serves what its first call compiled)
    finally:
        end(server)


def test_a_preset_without_guidance_compiles_the_unguided_loop_first(tiny_checkpoint, tiny_pipeline, tmp_path,
                                                                    monkeypatch):
    """A distilled model's preset (Lightning, Turbo, LCM) runs without guidance: its first call, and
    so what compiles before the page works, is the unguided loop's."""
    started, ready = [], threading.Event()
    compile_program = compilation.compile_program

    def recorded(name: str, lowered):
        if not ready.is_set():  # (what compiles before the page works)
            started.append(name)
        return compile_program(name, lowered)

    monkeypatch.setattr(compilation, "compile_program", recorded)
    server = Server(Settings(load=LoadOptions(model=str(tiny_checkpoint), dtype="float32", sizes=SIZES),
                             compile_cache=None, recipe=RECIPES["Lightning 4-step"]),
                    images=ImageStore(tmp_path / "images"))
    try:
        server.warmup.load()
        ready.set()
        assert server.offer.defaults()["guidance"] == 0.0 and server.warmup.ready_sizes == [(64, 64)]
        assert sorted(started) == ["decode", "denoise_unguided", "encode", "noise"], started
    finally:
        end(server)


def test_weights_that_do_not_fit_are_refused_before_anything_compiles(tiny_checkpoint, tmp_path, monkeypatch):
    """The first programs compile while the weights are read, but a checkpoint whose tensors do not
    fit the networks is refused from the files' headers first: at once, naming the tensor, and
    with no compile left running behind the error (minutes on a TPU, and a thread inside XLA)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (file,) = (broken / "vae").glob("*.safetensors")
    tensors = load_file(file)
    name = next(k for k, v in tensors.items() if k.endswith(".bias") and v.size > 1)
    tensors[name] = tensors[name][:-1]
    save_file(tensors, file)
    compiled: list[str] = []
    monkeypatch.setattr(compilation, "compile_program",
                        lambda name, lowered: (compiled.append(name), pytest.fail("compiled"))[1])
    server = Server(Settings(load=LoadOptions(model=str(broken), dtype="float32", sizes=SIZES[:1]), compile_cache=None),
                    images=ImageStore(tmp_path / "images"))
    server.warmup.load()
    assert server.warmup.status == "error" and "wrong shape" in server.warmup.error and name in server.warmup.error
    assert compiled == [] and server.in_flight() == []


def test_programs_compile_at_once_as_the_host_memory_holds(monkeypatch):
    """On an accelerator a program compiles on one host core, and an SDXL UNet's takes ~9 GiB of host
    memory: as many at once as MemAvailable holds, never more than the cores, at least one; a CPU's
    compiler is threaded itself (one at a time)."""
    gib = 2**30
    monkeypatch.setattr(compilation.os, "cpu_count", lambda: 13)
    monkeypatch.setattr(compilation.jax, "default_backend", lambda: "tpu")
    assert compilation.compile_workers(available=35 * gib) == 3  # (a v5e host: 40 GiB)
    assert compilation.compile_workers(available=4 * gib) == 1
    assert compilation.compile_workers(available=400 * gib) == 13
    available = compilation.host_memory_available()
    assert available is None or 0 < available < 2**50  # (this host's, from /proc/meminfo)
    monkeypatch.setattr(compilation.jax, "default_backend", lambda: "cpu")
    assert compilation.compile_workers(available=400 * gib) == 1
