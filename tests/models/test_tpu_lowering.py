"""The TPU programs, lowered on every run of the suite: each per-size program of SDXL base 1.0 at
1024x1024, for a v5e-4 host's mesh of four chips, lowered for TPU from this CPU machine with
shapes alone (tests/helpers/tpu_lowering.py). What lowering cannot prove: that Mosaic compiles the splash
kernel for a given TPU generation and how fast it runs, XLA's TPU compile and memory fit (bench
--compile-only on a TPU says that), and on a GPU, which cuDNN kernel is chosen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdxl_tpu.generate.compiling.programs import PROGRAMS
from sdxl_tpu.models.attention import SPLASH_MIN_LENGTH
from sdxl_tpu.weights.architectures import architecture_configs

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 4


@pytest.fixture(scope="module")
def lowered() -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "tpu_lowering.py")], capture_output=True,
                          text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    print(f"lowered {len(report['programs'])} programs for TPU in {report['seconds']} s")
    return report


def self_attention_layers() -> dict[int, int]:
    """SDXL base 1.0's UNet: its self-attention layers per sequence length at 1024x1024 (latents
    of 128x128; each level halves them), from its config as diffusers builds the blocks."""
    unet = architecture_configs("sdxl")["unet"]
    side, depth = 1024 // 8, unet["transformer_layers_per_block"]
    layers: dict[int, int] = {}
    for level, kind in enumerate(unet["down_block_types"]):
        if kind.startswith("CrossAttn"):
            length = (side >> level) ** 2
            layers[length] = layers.get(length, 0) + unet["layers_per_block"] * depth[level]
    for level, kind in zip(reversed(range(len(depth))), unet["up_block_types"]):
        if kind.startswith("CrossAttn"):
            length = (side >> level) ** 2
            layers[length] = layers.get(length, 0) + (unet["layers_per_block"] + 1) * depth[level]
    lowest = (side >> (len(depth) - 1)) ** 2
    layers[lowest] += depth[-1]  # (the mid block)
    return layers


def test_every_program_lowers_for_tpu_sharded_over_the_mesh_without_host_callbacks(lowered):
    """Each program: the mesh of four, the image batch split over it (every batch argument), the
    parameters replicated (all the others), no call back to the host inside."""
    assert lowered["devices"] == DEVICES and set(lowered["programs"]) == set(PROGRAMS)
    for name, program in lowered["programs"].items():
        arguments = program["arguments"]
        assert program["mesh"] and arguments["batch"] >= 1, (name, program)
        assert arguments["batch"] + arguments["replicated"] == arguments["all"], (name, arguments)
        assert program["callbacks"] == 0, name
    # The networks' parameters are replicated: the UNet's hundreds of arrays in both denoising loops.
    assert lowered["programs"]["denoise"]["arguments"]["replicated"] > 1000


def test_splash_attention_where_it_is_chosen_and_xla_elsewhere(lowered):
    """The UNet's self-attention runs the splash kernel at the levels whose sequences are long
    enough (at 1024x1024: 64x64 and 32x32 latents, every layer of both), its cross-attention
    (77 tokens) and the text encoders' causal attention run XLA's, and so does the VAE's mid-block
    attention (one head of 512: splash's kernel for it compiled for 75 s to save 1.6 ms an image)."""
    layers = self_attention_layers()
    assert layers == {4096: 10, 1024: 60}  # (SDXL's: 2x2 + 3x2 layers at 64x64, 2x10 + 10 + 3x10 at 32x32)
    expected = {length: n for length, n in layers.items() if length >= SPLASH_MIN_LENGTH}
    assert expected == {4096: 10, 1024: 60}
    for name in ("denoise", "denoise_unguided"):
        program = lowered["programs"][name]
        assert {int(k): v for k, v in program["splash_calls"].items()} == expected, (name, program)
        assert program["kernels"] == len(expected)  # (one kernel per sequence length, called from every layer)
    for name in ("encode", "noise", "init", "decode", "encode_image"):
        assert lowered["programs"][name]["kernels"] == 0, name
