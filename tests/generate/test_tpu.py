"""On a TPU chip: what only the chip can show. Run there by `bash benchmarks/tpu.sh test`
(`pytest -m tpu` in one process, JAX_PLATFORMS=tpu,cpu); everywhere else skipped with the reason.
Nothing here needs torch or diffusers: the chip's machine has neither.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from sdxl_tpu import CompileCounter
from sdxl_tpu.models import attention as attn


def _on_tpu() -> bool:
    # JAX_PLATFORMS=cpu (conftest's default) never opens the chip: the backend is only asked where
    # the TPU was asked for.
    return "tpu" in os.environ.get("JAX_PLATFORMS", "") and jax.default_backend() == "tpu"


pytestmark = [pytest.mark.tpu, pytest.mark.skipif(not _on_tpu(), reason="needs a TPU chip: "
                                                  "JAX_PLATFORMS=tpu,cpu pytest -m tpu (benchmarks/tpu.sh test)")]


def _psnr(reference: np.ndarray, value: np.ndarray) -> float:
    mse = float(np.mean((reference.astype(np.float64) - value.astype(np.float64)) ** 2))
    peak = float(reference.max() - reference.min())
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


@pytest.mark.parametrize("batch, length, heads, head_dim, kernel", [
    (2, 4096, 10, 64, "splash"),   # the UNet's 64x64 level at 1024x1024
    (2, 1024, 20, 64, "splash"),   # its 32x32 level
    (2, 3952, 10, 64, "splash"),   # 1216x832's 64x-level (76x52 tokens): padded to 4096, masked
    (2, 988, 20, 64, "splash"),    # its 32x-level: padded to 1024
    (2, 512, 20, 64, "xla"),
    (1, 16384, 1, 512, "xla"),     # the VAE's mid block at 1024x1024: its 512-wide head (SPLASH_MAX_HEAD_DIM)
])
def test_tpu_attention_matches_xla_attention_at_each_sdxl_level(batch, length, heads, head_dim, kernel):
    keys = jax.random.split(jax.random.key(length), 3)
    dtype = jnp.float32 if head_dim == 512 else jnp.bfloat16  # (the VAE runs in float32: its tiles fit VMEM)
    q, k, v = (jax.random.normal(key, (batch, length, heads, head_dim), dtype) for key in keys)
    chosen = jax.jit(attn.tpu_attention)
    assert ("tpu_custom_call" in chosen.lower(q, k, v).compile().as_text()) == (kernel == "splash")
    exact = attn.xla_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
    error = float(jnp.max(jnp.abs(chosen(q, k, v).astype(jnp.float32) - exact)))
    xla_error = float(jnp.max(jnp.abs(attn.xla_attention(q, k, v).astype(jnp.float32) - exact)))
    print(f"{length} tokens x {heads} heads of {head_dim}: {kernel} max error {error:.2e}, XLA's {xla_error:.2e}")
    assert error < max(6 * xla_error, 1e-2)


def test_small_unet_on_the_chip_equals_the_cpu():
    """One evaluation of the small architecture's UNet, bfloat16 on both, the chip's splash
    attention against the CPU's XLA attention."""
    from sdxl_tpu.bench.random_weights import random_fill
    from sdxl_tpu.models.layers import Precision
    from sdxl_tpu.models.unet import UNet2DConditionModel, UNetConfig
    from sdxl_tpu.weights.architectures import architecture_configs

    config = architecture_configs("small")["unet"]
    unet = random_fill(nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(config),
                                                                     Precision.of("bfloat16"))), seed=5)
    graph, params = nnx.split(unet)
    rng = np.random.default_rng(0)
    pooled = config["projection_class_embeddings_input_dim"] - 6 * config["addition_time_embed_dim"]
    inputs = (rng.standard_normal((2, 32, 32, 4)).astype(np.float32), np.float32(500.0),
              rng.standard_normal((2, 77, config["cross_attention_dim"])).astype(np.float32),
              rng.standard_normal((2, pooled)).astype(np.float32),
              np.tile(np.float32([[256, 256, 0, 0, 256, 256]]), (2, 1)))
    forward = jax.jit(lambda params, *a: nnx.merge(graph, params)(*a).astype(jnp.float32))
    outputs = {}
    for device in (jax.devices("tpu")[0], jax.devices("cpu")[0]):
        outputs[device.platform] = np.asarray(forward(*jax.device_put((params, *inputs), device)))
    db = _psnr(outputs["cpu"], outputs["tpu"])
    print(f"small UNet, bf16: chip against CPU {db:.1f} dB")
    assert np.isfinite(outputs["tpu"]).all() and db >= 30


@pytest.fixture(scope="module")
def chip_pipeline(tiny_checkpoint):
    """The tiny checkpoint in bfloat16 (the default) at 64x64 and its hires size 96x96, on the chip."""
    from sdxl_tpu import load_pipeline

    return load_pipeline(tiny_checkpoint, sizes=((64, 64), (96, 96)))


@pytest.fixture(scope="module")
def chip_inpainting_pipeline(tiny_inpainting_checkpoint):
    """The tiny checkpoint with a 9-channel inpainting UNet, bfloat16, 64x64, on the chip."""
    from sdxl_tpu import load_pipeline

    return load_pipeline(tiny_inpainting_checkpoint, sizes=((64, 64),))


def _picture() -> Image.Image:
    y, x = np.mgrid[0:64, 0:64] / 64
    return Image.fromarray(np.stack([255 * x, 255 * ((x - .5) ** 2 + (y - .5) ** 2 < .1), 127 + 120 * np.sin(25 * y)],
                                    -1).astype(np.uint8))


def _mask() -> Image.Image:
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 8:40] = 255
    return Image.fromarray(mask, "L")


def test_every_sampler_img2img_inpainting_and_hires_run_on_the_chip_without_nan_or_recompiles(
        chip_pipeline, chip_inpainting_pipeline):
    """A non-finite image raises GenerationError, so each call returning is the check for NaN."""
    from sdxl_tpu.request.names import SAMPLERS

    for pipe in (chip_pipeline, chip_inpainting_pipeline):
        pipe.generate("warm", steps=2, size=(64, 64))  # (the first call's host-side caches)
        pipe.generate("warm", steps=2, size=(64, 64), image=_picture(), strength=0.5, mask_image=_mask())
    with CompileCounter() as counter:
        for i, sampler in enumerate(SAMPLERS):
            result = chip_pipeline.generate("a castle", "blurry", seed=i, steps=4, size=(64, 64), sampler=sampler)
            assert [im.size for im in result.images] == [(64, 64)] * len(result.images)
        chip_pipeline.generate("a castle", seed=1, steps=6, size=(64, 64), image=_picture(), strength=0.6)
        chip_pipeline.generate("a red door", seed=2, steps=6, size=(64, 64), image=_picture(), strength=0.8,
                               mask_image=_mask())
        chip_inpainting_pipeline.generate("a red door", seed=3, steps=6, size=(64, 64), image=_picture(),
                                          strength=1.0, mask_image=_mask())
        hires = chip_pipeline.run(chip_pipeline.request("a lighthouse", seed=4, steps=4, size=(64, 64), hires=True,
                                                        hires_scale=1.5, hires_upscaler="Latent", hires_steps=4,
                                                        hires_strength=0.5))
        assert {im.size for im in hires.images} == {(96, 96)}
    assert counter.compiles == 0 and counter.traces == 0, vars(counter)
