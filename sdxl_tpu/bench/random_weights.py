"""Random weights for an architecture (weights/architectures.py), made on the device with nothing read or
written, and the tiny checkpoint's tokenizers: what `bench --random-weights` and benchmarks/ run."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from typing import Any, cast

import jax
import numpy as np
from flax import nnx

from ..generate.loading import with_weights
from ..generate.pipeline import Pipeline
from ..models.clip_vision import CLIPVisionConfig, CLIPVisionModelWithProjection
from ..models.controlnet import ControlNetConfig, ControlNetModel
from ..models.ip_adapter import IPAdapter, IPAdapterConfig, unet_attention_shapes
from ..models.layers import Precision
from ..models.unet import UNet2DConditionModel, UNetConfig
from ..sampler.from_config import SCHEDULER_CONFIG, samplers_for
from ..weights.architectures import architecture_configs, refiner_configs
from ..weights.checkpoint import Models
from ..weights.ip_adapter import ImagePromptModels
from ..weights.refiner import RefinerModels
from ..weights.tiny import abstract_networks


# Normal draws reused cyclically from one pool, scaled once per fan-in: drawing SDXL's 2.6 billion
# UNet parameters afresh took 45 s of a CPU core each time a benchmark process started, copying
# them from the pool about 2 s. Timing and memory do not depend on the values; a random start per
# parameter keeps layers distinct.
POOL_SIZE = 1 << 22


def random_fill(model: nnx.Module, seed: int = 0) -> nnx.Module:
    """An abstract model's parameters filled with random values (nothing read or written): on the
    host, one parameter at a time, then placed on the device. (Drawn on the device, each distinct
    shape compiled a program of its own: 30 s for the small preset.)"""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(2 * POOL_SIZE, np.float32)
    scaled: dict[tuple[int, Any], np.ndarray] = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape, dtype = var.get_value().shape, var.get_value().dtype
        if path[-1] == "scale":
            value = np.ones(shape, dtype)
        elif path[-1] == "bias":
            value = np.zeros(shape, dtype)
        else:  # kernels (fan-in is every axis but the last) and embeddings
            fan_in = math.prod(shape[:-1]) if path[-1] == "kernel" else 1
            if (fan_in, dtype) not in scaled:
                scaled[fan_in, dtype] = (pool / np.float32(math.sqrt(fan_in))).astype(dtype)
            value = _cyclic(scaled[fan_in, dtype], int(rng.integers(POOL_SIZE)), math.prod(shape)).reshape(shape)
        var.set_value(jax.device_put(value))
    return model


def _cyclic(pool: np.ndarray, start: int, size: int) -> np.ndarray:
    """`size` values of `pool` from `start` on, wrapping to `start` again: chunk copies, no arithmetic."""
    out = np.empty(size, pool.dtype)
    chunk = pool[start:start + POOL_SIZE]
    for offset in range(0, size, POOL_SIZE):
        out[offset:offset + POOL_SIZE] = chunk[:size - offset]
    return out


def random_pipeline(architecture: str, precision: Precision, first: Callable[[Pipeline], Any] | None = None,
                    **pipeline: Any) -> Pipeline:
    """A Pipeline of `architecture` with random weights, the tiny checkpoint's tokenizers and SDXL
    base 1.0's samplers, compiled on first use (`pipeline`: Pipeline's options, e.g. sizes);
    `first(pipeline)` while the weights are made, as a server's load does (loading.with_weights)."""
    networks = abstract_networks(architecture_configs(architecture), precision)
    pipe = Pipeline(_models(networks), random_tokenizers(), samplers_for(SCHEDULER_CONFIG)[0], model_name=architecture,
                    **pipeline)
    return with_weights(pipe, lambda: fill_randomly(networks), first)


def controlnet_config(unet: dict[str, Any], vae_factor: int) -> dict[str, Any]:
    """A ControlNet config for a UNet config (as ControlNetModel.from_unet copies it), its control
    image embedding SDXL's (16, 32, 96, 256) cut to the VAE's factor."""
    steps = int(math.log2(vae_factor))
    down = {k: v for k, v in unet.items() if k not in ("up_block_types", "out_channels", "sample_size")}
    return {**down, "_class_name": "ControlNetModel",
            "conditioning_embedding_out_channels": [16, 32, 96, 256][:steps + 1]}


def random_controlnets(architecture: str, precision: Precision, count: int) -> dict[str, ControlNetModel]:
    """`count` ControlNets for `architecture`'s UNet with random weights, named random-0, random-1, ..."""
    configs = architecture_configs(architecture)
    factor = 2 ** (len(configs["vae"]["block_out_channels"]) - 1)
    config = ControlNetConfig.from_dict(controlnet_config(configs["unet"], factor))
    return {f"random-{i}": cast(ControlNetModel, random_fill(nnx.eval_shape(lambda: ControlNetModel(config, precision)),
                                                             seed=10 + i)) for i in range(count)}


# The published image encoders (transformers' CLIPVisionModelWithProjection configs): h94/IP-Adapter's
# sdxl_models/image_encoder (ViT-bigG/14), for ip-adapter_sdxl, and models/image_encoder (ViT-H/14), for
# ip-adapter-plus_sdxl_vit-h; the tiny architecture's a small one at the same 224 pixels.
IMAGE_ENCODERS = {
    "vit-bigg": dict(hidden_size=1664, intermediate_size=8192, num_hidden_layers=48, num_attention_heads=16,
                     image_size=224, patch_size=14, projection_dim=1280, hidden_act="gelu"),
    "vit-h": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                  image_size=224, patch_size=14, projection_dim=1024, hidden_act="gelu"),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=224,
                 patch_size=14, projection_dim=24),
}


def random_image_prompt(architecture: str, precision: Precision, plus: bool) -> ImagePromptModels:
    """An IP-Adapter for `architecture`'s UNet and its image encoder with random weights, sized as
    the published SDXL ones: ip-adapter_sdxl (plain, ViT-bigG: 4 tokens) or ip-adapter-plus_sdxl_vit-h
    (`plus`: ViT-H's hidden states through a 4-layer resampler: 16 tokens)."""
    encoder = CLIPVisionConfig.from_dict(IMAGE_ENCODERS["tiny" if architecture == "tiny" else
                                                       "vit-h" if plus else "vit-bigg"])
    unet = nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(architecture_configs(architecture)["unet"]),
                                                       precision))
    width, blocks = unet.config.cross_attention_dim[0], unet_attention_shapes(unet)
    if plus:
        hidden = 1280 if architecture != "tiny" else 128
        config = IPAdapterConfig(plus=True, image_embed_dim=encoder.hidden_size, cross_attention_dim=width,
                                 num_tokens=16, blocks=blocks, hidden_dims=hidden, depth=4, heads=hidden // 64,
                                 ff_inner=4 * hidden)
    else:
        config = IPAdapterConfig(plus=False, image_embed_dim=encoder.projection_dim, cross_attention_dim=width,
                                 num_tokens=4, blocks=blocks)
    name = "ip-adapter-plus_sdxl_vit-h" if plus else "ip-adapter_sdxl"
    return ImagePromptModels(
        name, cast(IPAdapter, random_fill(nnx.eval_shape(lambda: IPAdapter(config, precision)), seed=20)),
        cast(CLIPVisionModelWithProjection, random_fill(
            nnx.eval_shape(lambda: CLIPVisionModelWithProjection(encoder, precision)), seed=21)))


def random_refiner(architecture: str, precision: Precision) -> RefinerModels:
    """`architecture`'s refiner (refiner_configs: SDXL refiner 1.0's for sdxl) with random weights."""
    networks = abstract_networks({**architecture_configs(architecture), **refiner_configs(architecture)}, precision)
    return RefinerModels("random-refiner", cast(Any, random_fill(networks["unet"], seed=30)),
                         cast(Any, random_fill(networks["text_encoder_2"], seed=31)),
                         force_zeros_for_empty_prompt=False)


def random_models(configs: dict[str, Any], precision: Precision, seed: int = 0) -> Models:
    """An architecture's networks with random weights, made on the device (nothing read or written)."""
    return fill_randomly(abstract_networks(configs, precision), seed)


def fill_randomly(networks: dict[str, nnx.Module], seed: int = 0) -> Models:
    """Abstract networks (text_encoder, text_encoder_2, unet, vae: seeds in that order) filled with
    random weights, in place."""
    return _models({name: random_fill(model, seed + i) for i, (name, model) in enumerate(networks.items())})


def _models(networks: dict[str, nnx.Module]) -> Models:
    """abstract_networks' four networks (each built by its component's name) as Models."""
    return Models(**cast(dict[str, Any], networks))


def random_tokenizers():
    """The tiny checkpoint's two CLIP tokenizers (a small BPE vocabulary), written and read back."""
    from transformers import CLIPTokenizer

    from ..weights.tiny_tokenizers import write_tokenizers

    with tempfile.TemporaryDirectory(prefix="sdxl-bench-tokenizer-") as directory:
        write_tokenizers(directory)
        return tuple(CLIPTokenizer.from_pretrained(os.path.join(directory, name))
                     for name in ("tokenizer", "tokenizer_2"))
