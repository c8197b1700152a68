"""A tiny, random, SDXL-architecture checkpoint in exact diffusers format, written without torch.

It is the offline fixture for tests and for running the app without a model hub: the same
file layout, config keys and tensor names as stabilityai/stable-diffusion-xl-base-1.0, with
small widths and a small byte-level BPE vocabulary. The architectures (tiny, small, sdxl) are
defined in architectures.py; this module writes them out as checkpoints.
"""

from __future__ import annotations

import json
import shutil
import os
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from ..models.clip import CLIPTextConfig, CLIPTextModel
from ..models.layers import Precision
from ..models.unet import UNet2DConditionModel, UNetConfig
from ..models.vae import AutoencoderKL, VAEConfig
from ..sampler.from_config import SCHEDULER_CONFIG
from .architectures import DIFFUSERS_VERSION, architecture_configs, model_index, refiner_configs, refiner_model_index
from .tensors import torch_shapes
from .tiny_tokenizers import write_tokenizers


def random_weights(model: nnx.Module, rng: np.random.Generator, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Random tensors (float32, or `dtype`) for every parameter, under PyTorch names and shapes.

    Scaled so activations stay of order one through the network: weights ~ N(0, 1/fan_in),
    norm scales near one, small biases.
    """
    out = {}
    for name, shape in torch_shapes(model).items():
        if len(shape) == 1:
            base = 1.0 if name.endswith("weight") else 0.0
            out[name] = (base + 0.05 * rng.standard_normal(shape)).astype(dtype)
        elif name.endswith("embedding.weight"):
            out[name] = (0.5 * rng.standard_normal(shape)).astype(dtype)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(dtype)
    return out


def _write_component(directory: Path, config: dict[str, Any], tensors: dict[str, np.ndarray], filename: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(directory / filename), metadata={"format": "pt"})


def abstract_networks(configs: dict[str, Any], precision: Precision = Precision()) -> dict[str, nnx.Module]:
    """The four networks of an architecture's configs (architecture_configs), built abstractly
    (nnx.eval_shape: shapes and dtypes, no weights), by the component names of a checkpoint."""
    builders = {
        "text_encoder": lambda c: CLIPTextModel(CLIPTextConfig.from_dict(c, with_projection=False), precision),
        "text_encoder_2": lambda c: CLIPTextModel(CLIPTextConfig.from_dict(c, with_projection=True), precision),
        "unet": lambda c: UNet2DConditionModel(UNetConfig.from_dict(c), precision),
        "vae": lambda c: AutoencoderKL(VAEConfig.from_dict(c), precision),
    }
    return {name: nnx.eval_shape(lambda: build(configs[name])) for name, build in builders.items()}  # noqa: B023


def write_checkpoint(directory: str | os.PathLike, architecture: str = "tiny", *, seed: int = 0,
                     overrides: dict[str, dict[str, Any]] | None = None, dtype: Any = np.float32) -> Path:
    """Write a random checkpoint of `architecture` in diffusers format to `directory`; its path.
    `overrides`: config entries to change per component, e.g. {"text_encoder_2": {"hidden_size": 48}};
    `dtype`: its tensors' (float16: as the published fp16 files)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    configs = architecture_configs(architecture, vocab_size=write_tokenizers(root))
    for component, changes in (overrides or {}).items():
        configs[component] = {**configs[component], **changes}
    for name, model in abstract_networks(configs).items():
        filename = "model.safetensors" if name.startswith("text") else "diffusion_pytorch_model.safetensors"
        _write_component(root / name, configs[name], random_weights(model, rng, dtype), filename)
    (root / "scheduler").mkdir(exist_ok=True)
    scheduler_config = {**SCHEDULER_CONFIG, "_diffusers_version": DIFFUSERS_VERSION}
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler_config, indent=2))
    (root / "model_index.json").write_text(json.dumps(model_index(), indent=2))
    return root


def write_refiner(directory: str | os.PathLike, architecture: str = "tiny", *, seed: int = 1) -> Path:
    """Write a random refiner of `architecture` (architectures.refiner_configs) in diffusers format
    to `directory`, as stabilityai/stable-diffusion-xl-refiner-1.0 lays it out; its path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = write_tokenizers(root)
    for name in ("tokenizer",):  # (the refiner has the second tokenizer alone)
        shutil.rmtree(root / name, ignore_errors=True)
    configs = refiner_configs(architecture, vocab_size=vocab)
    networks = abstract_networks({**architecture_configs(architecture, vocab_size=vocab), **configs})
    for name in configs:
        filename = "model.safetensors" if name.startswith("text") else "diffusion_pytorch_model.safetensors"
        _write_component(root / name, configs[name], random_weights(networks[name], rng), filename)
    (root / "scheduler").mkdir(exist_ok=True)
    scheduler_config = {**SCHEDULER_CONFIG, "_diffusers_version": DIFFUSERS_VERSION}
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler_config, indent=2))
    (root / "model_index.json").write_text(json.dumps(refiner_model_index(), indent=2))
    return root


def write_tiny_checkpoint(directory: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write the tiny SDXL checkpoint to `directory` (created if needed) and return its path."""
    return write_checkpoint(directory, "tiny", seed=seed)


def tiny_taesd_config() -> dict[str, Any]:
    """A small AutoencoderTiny config, as diffusers writes it, whose decoder upsamples by the tiny VAE's factor."""
    from .architectures import DIFFUSERS_VERSION

    stages = len(architecture_configs("tiny")["vae"]["block_out_channels"])  # the VAE scales by 2 ** (stages - 1)
    widths = [8] * stages
    return {
        "_class_name": "AutoencoderTiny", "_diffusers_version": DIFFUSERS_VERSION, "act_fn": "relu",
        "block_out_channels": widths, "decoder_block_out_channels": widths, "encoder_block_out_channels": widths,
        "force_upcast": False, "in_channels": 3, "latent_channels": 4, "latent_magnitude": 3, "latent_shift": 0.5,
        "num_decoder_blocks": [3] * (stages - 1) + [1], "num_encoder_blocks": [1] + [3] * (stages - 1),
        "out_channels": 3, "scaling_factor": 1.0, "shift_factor": 0.0, "upsample_fn": "nearest",
        "upsampling_scaling_factor": 2,
    }


def write_tiny_taesd(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny random TAESD (AutoencoderTiny) checkpoint in diffusers format to `directory`; return its path."""
    from ..models.taesd import AutoencoderTiny, TAESDConfig

    config = tiny_taesd_config()
    model = nnx.eval_shape(lambda: AutoencoderTiny(TAESDConfig.from_dict(config)))
    root = Path(directory)
    _write_component(root, config, random_weights(model, np.random.default_rng(seed)),
                     "diffusion_pytorch_model.safetensors")
    return root
