"""`python -m sdxl_tpu bench` in its CI-sized form (the tiny preset)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_bench_tiny_reports_everything(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_TPU_TINY_DIR=str(tmp_path / "tiny"))
    result = subprocess.run([sys.executable, "-m", "sdxl_tpu", "bench", "--preset", "tiny", "--steps", "3",
                             "--runs", "2", "--dtype", "float32", "--compare-progress", "--json"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(result.stdout.strip().splitlines()[-1])
    assert r["images"] == 4 and r["size"] == "64x64" and r["steps"] == 3
    assert r["cold_compile_s"] > 0 and r["warm_compile_s"] > 0
    lat = r["latency_s"]
    assert 0 < lat["min"] <= lat["median"] <= lat["max"] and lat["runs"] == 2
    assert r["s_per_step"] > 0 and r["images_per_s"] > 0
    assert r["flops"]["unet_per_image_eval_tflop"] > 0 and r["flops"]["achieved_tflops"] > 0
    assert r["memory_bytes"]["compiled"]["denoise"]["peak_estimate"] > 0
    assert "progress_overhead" in r


def test_flop_formula_gives_the_known_sdxl_numbers():
    """6.76 TFLOP per UNet evaluation and 10.5 TFLOP per VAE decode at 1024x1024 (see MISSION)."""
    from flax import nnx

    from sdxl_tpu.bench import model_flops
    from sdxl_tpu.checkpoint import Models
    from sdxl_tpu.unet import UNet2DConditionModel, UNetConfig
    from sdxl_tpu.vae import AutoencoderKL, VAEConfig

    from sdxl_tpu.tiny import preset_configs

    c = preset_configs("sdxl")
    unet = nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(c["unet"])))
    vae = nnx.eval_shape(lambda: AutoencoderKL(VAEConfig.from_dict(c["vae"])))
    flops = model_flops(Models(None, None, unet, vae), (1024, 1024))
    assert abs(flops["unet"] / 1e12 - 6.76) < 0.01
    assert abs(flops["vae_decode"] / 1e12 - 10.47) < 0.01


def test_bench_compile_only_reports_compile_time_and_memory(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", SDXL_TPU_TINY_DIR=str(tmp_path / "tiny"))
    result = subprocess.run([sys.executable, "-m", "sdxl_tpu", "bench", "--preset", "tiny", "--compile-only"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("compile ") and lines[0].endswith(" s")
    assert {line.split()[1] for line in lines[1:]} == {"encode", "noise", "denoise", "decode"}


def test_kernels_check_reads_the_compiled_attention_layer():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "kernels_check.py"
    result = subprocess.run([sys.executable, str(script), "--tokens", "256", "--channels", "128",
                             "--heads", "2"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(result.stdout)
    # XLA's CPU backend keeps the three projections apart and has no fused attention kernel.
    assert r["backend"] == "cpu" and r["projection_matmuls"] == 3 and r["attention_kernels"] == []
