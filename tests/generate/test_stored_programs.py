"""Compiled programs stored beside the compilation cache and loaded untraced on a restart
(stored_programs.py): nothing traced or compiled, the same images, and any unusable entry a
logged miss, never a crash."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from sdxl_tpu.generate.compiling.programs import program
from sdxl_tpu.generate.compiling.stored_programs import ProgramStore, graphs_fingerprint

REQUEST = dict(prompt="a red chair", negative_prompt="blurry", seed=7, steps=3, size=(64, 64))
# Three images a call: programs no other test of the session compiles (the IP-Adapter's and the
# refiner's tests make two a call), so XLA compiles them here.
OPTIONS = dict(dtype="float32", sizes=[(64, 64)], images_per_call=3)

RESTART = """
import json, logging, sys
import numpy as np
logging.basicConfig(level=logging.INFO, format="%(message)s")
from sdxl_tpu import CompileCounter, load_pipeline
counts = {}
with CompileCounter() as weights:  # (the programs that lay the weights out come from JAX's cache)
    pipe = load_pipeline(sys.argv[1], compile_cache=sys.argv[2], warmup=False, **json.loads(sys.argv[3]))
with CompileCounter() as programs:
    pipe.warmup()
result = pipe.generate(**json.loads(sys.argv[4]))
np.save(sys.argv[5], np.stack([np.asarray(im) for im in result.images]))
print(json.dumps({part: {"compiles": c.compiles, "traces": c.traces, "cache_hits": c.cache_hits,
                         "cache_misses": c.cache_misses}
                  for part, c in (("weights", weights), ("programs", programs))}))
"""


def _images(result) -> np.ndarray:
    return np.stack([np.asarray(im) for im in result.images])


def test_a_restart_loads_the_stored_programs_untraced_and_makes_the_same_images(tiny_checkpoint, tiny_pipeline,
                                                                                tmp_path, caplog):
    """Compiled here (and stored: its own store, the session's JAX cache), then a new process:
    it loads every program without asking XLA or JAX's cache for any; the same images, bit for bit."""
    from sdxl_tpu.generate.loading import load
    from sdxl_tpu.request.load import LoadOptions

    store = tmp_path / "cache" / "programs"
    with caplog.at_level(logging.INFO, logger="sdxl_tpu"):
        here = load(LoadOptions(model=str(tiny_checkpoint), **OPTIONS), compile_cache=tmp_path / "cache")
    assert f"64x64: 0 programs loaded from {store}, 7 compiled and stored, 0 from JAX's cache" in caplog.text
    assert len(list(store.iterdir())) == 7

    expected = _images(here.generate(**REQUEST))
    # (the two traces: the denoising programs' state shapes, jax.eval_shape of the sampler's init,
    # a few operations; no program is traced)
    nothing = {"compiles": 0, "traces": 2, "cache_hits": 0, "cache_misses": 0}
    for start in ("first", "second"):
        result = subprocess.run([sys.executable, "-c", RESTART, str(tiny_checkpoint), str(tmp_path / "cache"),
                                 json.dumps(OPTIONS), json.dumps(REQUEST), str(tmp_path / "images.npy")],
                                capture_output=True, text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert result.returncode == 0, result.stderr[-3000:]
        counts = json.loads(result.stdout.strip().splitlines()[-1])
        assert counts["programs"] == nothing, result.stderr[-3000:]
        assert f"64x64: 7 programs loaded from {store} side by side, in" in result.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "images.npy"), expected)
        # The weights' layout programs: compiled by the first start into JAX's cache (the session
        # compiled them, not into this cache), read from it by the second: it compiles nothing.
        weights = counts["weights"]
        if start == "first":
            assert weights["compiles"] == weights["cache_misses"] > 0, counts
            compiled_first = weights["compiles"]
        else:
            assert (weights["compiles"], weights["cache_hits"], weights["cache_misses"]) == (
                0, compiled_first, 0), counts


def test_a_program_from_jax_cache_is_used_but_not_stored(tiny_pipeline, tmp_path, caplog):
    """XLA's CPU client cannot serialize a program it deserialized (such entries failed when run:
    "Function ... not found"), so what JAX's persistent cache gives is not stored. The smallest
    program at a size nothing else compiles: compiled and stored in `a`; then, for store `b`, from
    JAX's cache (the session's), not stored; then from `a`, loaded; the same result each time."""
    pipe, size = tiny_pipeline, (88, 64)
    a, b = ProgramStore(tmp_path / "a"), ProgramStore(tmp_path / "b")
    args = program("init", pipe.layout, size, pipe.graphs, pipe.params)[1]
    concrete = jax.tree.map(lambda x: jax.device_put(np.full(x.shape, 0.5, x.dtype), x.sharding), args)
    results = []
    for store, said in ((a, "0 programs loaded from {}, 1 compiled and stored, 0 from JAX's cache"),
                        (b, "0 programs loaded from {}, 0 compiled and stored, 1 from JAX's cache (not stored)"),
                        (a, "1 programs loaded from {}, 0 compiled and stored, 0 from JAX's cache")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="sdxl_tpu"):
            results.append(store.programs(["init"], pipe.layout, size, pipe.graphs, pipe.params)["init"](*concrete))
        assert "88x64: " + said.format(store.directory) in caplog.text
    assert (a.loaded, b.loaded) == (1, 0) and not b.directory.exists()
    for other in results[1:]:
        for x, y in zip(jax.tree.leaves(other), jax.tree.leaves(results[0]), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_restarts_sizes_load_side_by_side_and_compile_nothing(tiny_pipeline, tmp_path, caplog):
    """The sizes a restart still lacks are loaded at once, across sizes (CompiledPrograms.load_stored,
    what a server's first background compile does): nothing compiles, the text encoders' program the
    first size has serves the others, and each size is complete. The smallest program, at two sizes
    nothing else compiles (so XLA compiles and stores them here)."""
    from sdxl_tpu import CompileCounter
    from sdxl_tpu.generate.compiling.compiled import CompiledPrograms

    pipe, sizes, store = tiny_pipeline, [(104, 64), (112, 64)], ProgramStore(tmp_path / "programs")
    for size in sizes:
        store.programs(["init"], pipe.layout, size, pipe.graphs, pipe.params)
    restarted = CompiledPrograms(pipe.layout, pipe.graphs, pipe.params, ProgramStore(store.directory))
    encode = object()  # (the first size's, compiled at start)
    restarted.by_size[(64, 64)] = {"encode": encode}
    with CompileCounter() as counter, caplog.at_level(logging.INFO, logger="sdxl_tpu"):
        restarted.load_stored([(name, size) for size in sizes for name in ("encode", "init")])
    assert (counter.compiles, counter.cache_hits, restarted.store.loaded) == (0, 0, 2)
    assert f"104x64, 112x64: 2 programs loaded from {store.directory} side by side, in" in caplog.text
    for size in sizes:
        assert restarted.has(size, ["encode", "init"]) and restarted.by_size[size]["encode"] is encode
    # A size the store lacks is left for its own compile, not compiled here.
    with CompileCounter() as counter:
        restarted.load_stored([("init", (120, 64))])
    assert counter.compiles == 0 and not restarted.has((120, 64), ["init"])


def test_an_unusable_entry_is_a_logged_miss_and_a_stored_one_runs_as_compiled(tiny_pipeline, tmp_path, caplog):
    """The smallest program at a size nothing else compiles (so XLA compiles it here, not JAX's cache)."""
    pipe, devices, size = tiny_pipeline, list(tiny_pipeline.mesh.devices.flat), (80, 64)
    fn, args = program("init", pipe.layout, size, pipe.graphs, pipe.params)
    compiled = fn.lower(*args).compile()
    concrete = jax.tree.map(lambda a: jax.device_put(np.full(a.shape, 0.5, a.dtype), a.sharding), args)
    store = ProgramStore(tmp_path / "programs")
    key = store.key("init", size, pipe.layout, args, graphs_fingerprint(pipe.graphs))
    assert store.load(key, args, devices) is None and not caplog.records  # absent: a silent miss

    store.save(key, compiled)
    assert [p.name for p in store.directory.iterdir()] == [f"{key}.pkl"]  # (no temporary file left)
    whole = (store.directory / f"{key}.pkl").read_bytes()
    other = pickle.loads(whole) | {"key": "0" * 64}  # a whole entry, of another key
    for what, data in {"empty": b"", "truncated": whole[: len(whole) // 2], "garbage": os.urandom(4096),
                       "another key's entry": pickle.dumps(other), "another format": b"\x80\x04K\x01."}.items():
        caplog.clear()
        (store.directory / f"{key}.pkl").write_bytes(data)
        with caplog.at_level(logging.WARNING, logger="sdxl_tpu"):
            assert store.load(key, args, devices) is None, what
        assert "cannot be used" in caplog.text and "compiling it afresh" in caplog.text, what

    store.save(key, compiled)  # over the bad entry, atomically
    loaded = store.load(key, args, devices)
    for a, b in zip(jax.tree.leaves(loaded(*concrete)), jax.tree.leaves(compiled(*concrete)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # A store that cannot be written (its directory is a file) is logged, and nothing else happens.
    (tmp_path / "a-file").write_text("")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sdxl_tpu"):
        ProgramStore(tmp_path / "a-file").save(key, compiled)
    assert "could not store a compiled program" in caplog.text


def test_no_compile_cache_no_store():
    """`--compile-cache ''` means none: no store either (not a programs/ folder where the CLI runs)."""
    assert ProgramStore.beside(None) is None and ProgramStore.beside("") is None
    assert ProgramStore.beside("/c").directory == Path("/c/programs")


def test_the_key_changes_with_what_a_program_depends_on(tiny_pipeline):
    pipe = tiny_pipeline
    store, graphs = ProgramStore("unused"), graphs_fingerprint(pipe.graphs)

    def key(name="denoise", size=(64, 64), layout=pipe.layout, graphs=graphs):
        return store.key(name, size, layout, program(name, layout, size, pipe.graphs, pipe.params)[1], graphs)

    base = key()
    assert key() == base  # (and the restart test: the same in another process)
    assert key(size=(96, 64)) != base
    assert key(name="denoise_unguided") != base
    assert key(layout=dataclasses.replace(pipe.layout, batch=8)) != base
    assert key(layout=dataclasses.replace(pipe.layout, stepwise=not pipe.layout.stepwise)) != base
    assert key(graphs="other networks") != base


@pytest.mark.parametrize("change", ["dtype", "attention"])
def test_the_graphs_fingerprint_sees_static_attributes(change):
    """Two UNets of one architecture and weights layout that compile differently differ here."""
    from sdxl_tpu.models.layers import Precision
    from sdxl_tpu.models.unet import UNet2DConditionModel, UNetConfig
    from sdxl_tpu.weights.architectures import architecture_configs

    config = UNetConfig.from_dict(architecture_configs("tiny")["unet"])
    other = {"dtype": Precision.of("bfloat16", "float32"), "attention": Precision.of("float32", attention="xla")}
    graphs = [{"unet": nnx.split(nnx.eval_shape(lambda p=p: UNet2DConditionModel(config, p)))[0]}
              for p in (Precision.of("float32"), other[change])]
    assert graphs_fingerprint(graphs[0]) == graphs_fingerprint(graphs[0])
    assert graphs_fingerprint(graphs[0]) != graphs_fingerprint(graphs[1])


def test_a_sizes_programs_compile_side_by_side():
    """Every program's compile starts before any ends: each (fake) compile waits at a barrier for
    the other, which a compile one after another never reaches (the barrier then breaks)."""
    import threading

    from sdxl_tpu.generate.compiling.compilation import compile_side_by_side

    barrier = threading.Barrier(2, timeout=120)

    class Lowered:
        def compile(self):
            barrier.wait()
            return threading.get_ident()

    out = compile_side_by_side({"denoise": Lowered(), "decode": Lowered()}, workers=2)  # (a CPU's default: 1)
    assert list(out) == ["denoise", "decode"] and all(by_xla for _, by_xla in out.values())
    assert out["denoise"][0] != out["decode"][0]  # two threads


def test_a_programs_compile_starts_while_the_next_is_traced_and_each_is_handed_on_when_done():
    """The slowest program's compile need not wait for the others' tracing (tracing holds the GIL,
    an accelerator's compile does not): the second program is lowered only once the first's compile
    has begun, which lowering everything first never allows (the wait then times out)."""
    import threading

    from sdxl_tpu.generate.compiling.compilation import compile_side_by_side

    first_compiling, handed_on = threading.Event(), []

    class Lowered:
        def __init__(self, name):
            self.name = name

        def compile(self):
            if self.name == "denoise":
                first_compiling.set()
            return self.name

    def lower_decode():
        assert first_compiling.wait(60), "decode was traced before denoise's compile began"
        return Lowered("decode")

    out = compile_side_by_side({"denoise": lambda: Lowered("denoise"), "decode": lower_decode}, workers=2,
                               then=lambda name, compiled, by_xla: handed_on.append((name, compiled)))
    assert {name: compiled for name, (compiled, _) in out.items()} == {"denoise": "denoise", "decode": "decode"}
    assert sorted(handed_on) == [("decode", "decode"), ("denoise", "denoise")]


def test_loading_a_controlnet_keeps_the_programs_that_do_not_use_it():
    """A program's key fingerprints the pipeline's networks and only the ControlNets its name carries:
    a server restarted with one more ControlNet reads its stored programs instead of compiling them."""
    from flax import nnx

    from sdxl_tpu.generate.compiling.stored_programs import graphs_fingerprint, used_graphs

    graph = lambda n: nnx.split(nnx.Linear(n, 2, rngs=nnx.Rngs(0)))[0]  # noqa: E731
    base = {"unet": graph(2), "vae": graph(3)}
    more = {**base, "controlnet/edges": graph(4), "controlnet/depth": graph(5)}
    key = lambda graphs, name: graphs_fingerprint(used_graphs(graphs, name))  # noqa: E731
    assert key(more, "denoise") == key(base, "denoise") and key(more, "decode") == key(base, "decode")
    assert set(used_graphs(more, "denoise+edges")) == {"unet", "vae", "controlnet/edges"}
    assert key(more, "denoise+edges") != key({**base, "controlnet/edges": graph(6)}, "denoise+edges")
