"""Find a diffusers-format SDXL checkpoint (local directory or Hub repo) and load its parts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from flax import nnx

from ..models.clip import CLIPTextConfig, CLIPTextModel
from ..models.layers import Precision
from ..models.unet import UNet2DConditionModel, UNetConfig
from ..models.vae import AutoencoderKL, VAEConfig
from ..spec.names import SDXL_BASE
from .hub import COMPONENTS, resolve, resolve_file
from .lora import LoRA, combined_deltas, read_loras
from .single_file import PREFIXES, SingleFileView, check_single_file, in_single_file_layout
from .tensors import (CheckpointError, TensorSource, load_into, normalize_clip_name, normalize_vae_name, read_json,
                      torch_shapes, weight_files)

M = TypeVar("M", bound=nnx.Module)

def config_root(model: str | os.PathLike, config: str | os.PathLike | None = None) -> Path:
    """Where `model`'s configs, tokenizers and scheduler config are: its own directory, or for a
    single-file checkpoint `config`'s (default SDXL base 1.0's, without its weights)."""
    return resolve(config or SDXL_BASE, weights=False) if is_single_file(model) else resolve(model)


def _config(path: Path) -> dict[str, Any]:
    f = path / "config.json"
    if not f.is_file():
        raise CheckpointError(f"missing {f}")
    return dict(read_json(f))


@dataclass
class Models:
    text_encoder: CLIPTextModel
    text_encoder_2: CLIPTextModel
    unet: UNet2DConditionModel
    vae: AutoencoderKL

    @property
    def condition_channels(self) -> int:
        """The UNet's input channels beside the latents: 0 for a base UNet; the mask and the masked
        image's latents for an inpainting UNet (diffusers/stable-diffusion-xl-1.0-inpainting-0.1)."""
        unet, latent = self.unet.config.in_channels, self.vae.config.latent_channels
        if unet in (latent, 2 * latent + 1):
            return unet - latent
        raise CheckpointError(f"the UNet takes {unet} input channels: supported are {latent} (a base UNet) and "
                              f"{2 * latent + 1} (an inpainting UNet: latents, mask and masked image), not other "
                              "conditioning (e.g. InstructPix2Pix's 8)")


def _fill(model: M, path: Path, raw_config: dict[str, Any], *, weights: TensorSource | None = None,
          rename: Callable[[str], str] = lambda k: k, loras: Sequence[LoRA] = ()) -> M:
    """Load the weights of an abstract model: the component directory's own, or those of
    `weights` (a file in diffusers names, or in the single-file layout: then its part of it);
    with `loras` fused in."""
    component, shapes = path.name, torch_shapes(model)
    label = component if weights is None else f"{component} ({Path(weights.files[0]).name})"
    if weights is None:
        source = TensorSource(weight_files(path))
    elif in_single_file_layout(weights, component):
        source, rename = SingleFileView(weights, component, shapes, raw_config), lambda k: k
    else:
        source = weights
    deltas = combined_deltas(list(loras), component, shapes, raw_config) if loras else None
    return load_into(model, source, rename=rename, component=label, deltas=deltas)


def load_text_encoder(path: Path, precision: Precision, *, with_projection: bool,
                      weights: TensorSource | None = None, loras: Sequence[LoRA] = ()) -> CLIPTextModel:
    raw = _config(path)
    config = CLIPTextConfig.from_dict(raw, with_projection=with_projection)
    if with_projection and not config.projection_dim:
        raise CheckpointError(f"{path}/config.json: projection_dim is required for text_encoder_2")
    model = nnx.eval_shape(lambda: CLIPTextModel(config, precision))
    return _fill(model, path, raw, weights=weights, rename=normalize_clip_name, loras=loras)


def load_unet(path: Path, precision: Precision, weights: TensorSource | None = None,
              loras: Sequence[LoRA] = ()) -> UNet2DConditionModel:
    """The UNet of `path` (config.json and weights), or with `weights` another UNet of the same
    architecture: in diffusers names (as SDXL-Lightning's UNets are published) or the single-file
    layout (a whole single-file checkpoint's UNet included)."""
    raw = _config(path)
    if weights is not None:  # a single file has no config: its first convolution says what it takes
        key = "conv_in.weight"
        if in_single_file_layout(weights, "unet"):
            key = PREFIXES["unet"] + "input_blocks.0.0.weight"
        if key in weights.keys() and (channels := weights.shape(key)[1]) != raw.get("in_channels", 4):
            raw["in_channels"] = channels  # (an inpainting UNet's 9, as diffusers' from_single_file infers it)
    model = nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(raw), precision))
    return _fill(model, path, raw, weights=weights, loras=loras)


def load_vae(path: Path, precision: Precision, weights: TensorSource | None = None,
             loras: Sequence[LoRA] = ()) -> AutoencoderKL:
    raw = _config(path)
    model = nnx.eval_shape(lambda: AutoencoderKL(VAEConfig.from_dict(raw), precision))
    return _fill(model, path, raw, weights=weights, rename=normalize_vae_name, loras=loras)


def is_single_file(model: str | os.PathLike) -> bool:
    """Whether `model` names one .safetensors file (a single-file checkpoint) rather than a directory or repo."""
    return str(model).endswith(".safetensors")


def load_models(model: str | os.PathLike, *, dtype: str = "bfloat16", param_dtype: str | None = None,
                attention: str = "auto", unet: str | os.PathLike | None = None,
                config: str | os.PathLike | None = None, loras: Sequence[str | tuple] | None = None) -> Models:
    """All four networks of an SDXL checkpoint, weights cast to `param_dtype` (default: `dtype`),
    computing in `dtype` with the `attention` kernel ("auto" or "xla"). `model`: a diffusers
    checkpoint (see `resolve`) or a single-file one (see `single_file`), whose architecture comes
    from `config` (a diffusers checkpoint's configs; default SDXL base 1.0's). `unet`: a UNet
    weights file to use instead of the checkpoint's (see `load_unet` and `resolve_file`). `loras`:
    "file[:scale]" specs or (file, scale) pairs fused into the weights (see `lora`)."""
    root = config_root(model, config)
    p = Precision.of(dtype, param_dtype, attention=attention)
    file = None
    if is_single_file(model):
        path = resolve_file(model)
        file = TensorSource([path])
        check_single_file(file, path, COMPONENTS)
    adapters = read_loras(loras)  # read (and refused) before any network is loaded
    models = Models(text_encoder=load_text_encoder(root / "text_encoder", p, with_projection=False, weights=file,
                                                 loras=adapters),
                  text_encoder_2=load_text_encoder(root / "text_encoder_2", p, with_projection=True, weights=file,
                                                   loras=adapters),
                  unet=load_unet(root / "unet", p, TensorSource([resolve_file(unet)]) if unet is not None else file,
                                 loras=adapters),
                  vae=load_vae(root / "vae", p, weights=file, loras=adapters))
    models.condition_channels  # noqa: B018 (refuses a UNet whose inputs are not supported, by name)
    return models
