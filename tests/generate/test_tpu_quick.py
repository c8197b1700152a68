"""The chip's benchmark scripts, checked on the CPU before device time is spent on them:
benchmarks/tpu_quick.py (what it reports, how it sorts a program's operations by kind),
first_image.py (a new server's start, in the order it happens) and program_compile.py (sizes
stored, then read back)."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tpu_quick  # noqa: E402


def test_op_kinds_sorts_convolutions_matmuls_reductions_and_copies():
    def program(x, kernel, w):
        y = jax.lax.conv_general_dilated(x, kernel, (1, 1), ((1, 1), (1, 1)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = y - y.mean(axis=(1, 2), keepdims=True)
        return (y.reshape(2, -1, 8) @ w).transpose(0, 2, 1)

    hlo = jax.jit(program).lower(jnp.ones((2, 16, 16, 8)), jnp.ones((3, 3, 8, 8)), jnp.ones((8, 8))).compile().as_text()
    kinds = set(tpu_quick.op_kinds(hlo).values())
    assert {"convolution 3x3", "matmul", "reduction (norms, softmax)", "copy / transpose"} <= kinds, kinds


def test_one_unet_evaluation_reports_its_time_and_keeps_its_output(tmp_path):
    argv = [sys.executable, str(ROOT / "benchmarks" / "tpu_quick.py"), "unet", "--architecture", "tiny",
            "--size", "64x64", "--runs", "2", "--json", "--save", str(tmp_path / "out.npy")]
    report = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
                        .splitlines()[-1])
    assert report["rows"] == 2 and report["ms"] > 0 and report["tflops"] > 0 and report["compile_s"] > 0
    out = np.load(tmp_path / "out.npy")
    assert out.shape == (2, 8, 8, 4) and np.isfinite(out).all()
    # --against: the dB of a later output against this one
    assert tpu_quick.psnr(out, out) == float("inf")
    assert 20 < tpu_quick.psnr(out, out + 0.01 * np.random.default_rng(0).standard_normal(out.shape)) < 80


def test_first_image_reports_a_start_in_the_order_it_happens(tiny_checkpoint, tiny_pipeline, compile_cache):
    """first_image.py's in-process measurement, on the tiny model (the programs tiny_pipeline put in
    JAX's cache of the session make the compiles quick): each moment of the start after the one
    before, every program named."""
    import argparse

    import first_image

    args = argparse.Namespace(model=str(tiny_checkpoint), architecture=None, sizes="64x64", images=4,
                              dtype="float32", steps=1, compile_cache=str(compile_cache))
    report = first_image.measure(args)
    s = report["seconds"]
    assert 0 < s["imports"] <= s["ready"] < s["first_image"] <= s["everything"], s
    assert s["imports"] < s["loaded"] <= s["ready"], s  # (the weights, read while the first programs compile)
    assert report["sizes"] == ["64x64"] and report["platform"].startswith("cpu")
    made = len(report["programs"]) + report["programs_loaded"]  # (compiled, from JAX's cache, or stored)
    assert made >= 4 and {p["name"] for p in report["programs"]} <= {"encode", "encode_image", "noise", "init",
                                                                        "denoise", "denoise_unguided", "decode"}
    assert "first image" in first_image.format_report("cold", report)


def test_program_compile_stores_sizes_side_by_side_and_a_new_process_reads_them_back(tmp_path):
    """benchmarks/program_compile.py as `tpu.sh sizes` runs it: two sizes' decoders compiled two at
    a time and stored, then read back (not compiled) by a new process, each with its device memory."""
    def run(*extra: str) -> dict:
        argv = [sys.executable, str(ROOT / "benchmarks" / "program_compile.py"), "--architecture", "tiny",
                "--sizes", "64x64,96x64", "--programs", "decode", "--workers", "2", "--json", *extra]
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
                          .splitlines()[-1])

    compiled = run("--store", str(tmp_path))
    assert [(r["program"], r["size"]) for r in compiled["programs"]] == [("decode", "64x64"), ("decode", "96x64")]
    assert all(r["compile_s"] > 0 and r["temporaries_gib"] > 0 for r in compiled["programs"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode-64x64-auto.pickle", "decode-96x64-auto.pickle"]
    loaded = run("--load", str(tmp_path))
    assert all("compile_s" not in r and r["load_s"] > 0 for r in loaded["programs"])
    assert [r["temporaries_gib"] for r in loaded["programs"]] == [r["temporaries_gib"] for r in compiled["programs"]]
    assert loaded["first_program_s"] > 0 and "first_load_s" in loaded
    # benchmarks/runtime_start.py (`tpu.sh start`) reads one back in a new process, step by step
    argv = [sys.executable, str(ROOT / "benchmarks" / "runtime_start.py"), "--program",
            str(tmp_path / "decode-64x64-auto.pickle"), "--profile", "--json"]
    start = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
                       .splitlines()[-1])
    assert list(start["seconds"]) == ["import_jax", "runtime_start", "package_imports", "program_read", "total"]
    assert start["seconds"]["program_read"] > 0 and start["device"] == "cpu"
    assert any("deserialize_and_load" in line for line in start["program_read_profile"])


def test_geglu_variants_compute_what_the_model_does():
    """The feed-forward's tuning variants (--geglu) differ from the generator only in how XLA may
    fuse them: the same numbers to bfloat16's rounding."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from sdxl_tpu.bench.random_weights import random_fill
    from sdxl_tpu.models.layers import Precision
    from sdxl_tpu.models.unet_blocks import FeedForwardGEGLU

    ff = random_fill(nnx.eval_shape(lambda: FeedForwardGEGLU(64, 256, Precision.of("bfloat16"))), seed=1)
    x = jax.random.normal(jax.random.key(0), (2, 16, 64), jnp.bfloat16)
    shipped = np.asarray(jax.jit(lambda x: ff(x))(x), np.float32)
    for name in ("one-matmul", "barrier", "one-matmul-barrier"):
        variant = np.asarray(jax.jit(lambda x: tpu_quick.geglu_variant(name)(ff, x))(x), np.float32)  # noqa: B023
        assert np.abs(variant - shipped).max() <= 2 ** -7 * np.abs(shipped).max(), name


def test_the_one_pass_attention_kernel_under_trial_equals_xla_attention():
    """benchmarks/attention_kernels.py's one-pass kernel (Pallas's interpreter on the CPU), both
    exponentials, against XLA's attention on the same inputs: a variant timed on the chip computes
    attention, or its figure means nothing."""
    import attention_kernels

    from sdxl_tpu.models.attention import xla_attention

    keys = jax.random.split(jax.random.key(3), 3)
    q, k, v = (jax.random.normal(key, (2, 256, 3, 64), jnp.float32) * 2 for key in keys)
    expected = np.asarray(xla_attention(q, k, v))
    for base2 in (True, False):
        got = np.asarray(attention_kernels.one_pass(q, k, v, block_q=128, base2=base2, interpret=True))
        assert np.abs(got - expected).max() < 1e-4, (base2, np.abs(got - expected).max())
