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
from ..request.names import SDXL_BASE
from .hub import COMPONENTS, resolve, resolve_file
from .lora import LoRA, combined_deltas, read_loras
from .single_file import PREFIXES, SingleFileView, check_single_file, in_single_file_layout
from .tensors import (CheckpointError, TensorSource, Tensors, check_tensors, load_into, normalize_clip_name,
                      normalize_vae_name, read_json, torch_shapes, weight_files)

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

    @property
    def pooled_dim(self) -> int:
        """The pooled prompt's width: the second text encoder's projection."""
        if (dim := self.text_encoder_2.config.projection_dim) is None:
            raise ValueError("text_encoder_2 has no text projection (projection_dim): not an SDXL text encoder")
        return dim


def _fill(model: M, path: Path, raw_config: dict[str, Any], *, weights: TensorSource | None = None,
          rename: Callable[[str], str] = lambda k: k, loras: Sequence[LoRA] = ()) -> M:
    """Load the weights of an abstract model: the component directory's own, or those of
    `weights` (a file in diffusers names, or in the single-file layout: then its part of it);
    with `loras` fused in."""
    source, rename, label = _source(model, path, raw_config, weights, rename)
    deltas = combined_deltas(list(loras), path.name, torch_shapes(model), raw_config) if loras else None
    return load_into(model, source, rename=rename, component=label, deltas=deltas)


def _source(model: nnx.Module, path: Path, raw_config: dict[str, Any], weights: TensorSource | None,
            rename: Callable[[str], str]) -> tuple[Tensors, Callable[[str], str], str]:
    """Where a network's weights are (see _fill), the names' mapping, and its name in messages."""
    component = path.name
    label = component if weights is None else f"{component} ({Path(weights.files[0]).name})"
    if weights is None:
        return TensorSource(weight_files(path)), rename, label
    if in_single_file_layout(weights, component):
        return SingleFileView(weights, component, torch_shapes(model), raw_config), lambda k: k, label
    return weights, rename, label


def _text_encoder_config(path: Path, with_projection: bool) -> tuple[dict[str, Any], CLIPTextConfig]:
    raw = _config(path)
    config = CLIPTextConfig.from_dict(raw, with_projection=with_projection)
    if with_projection and not config.projection_dim:
        raise CheckpointError(f"{path}/config.json: projection_dim is required for text_encoder_2")
    return raw, config


def load_text_encoder(path: Path, precision: Precision, *, with_projection: bool,
                      weights: TensorSource | None = None, loras: Sequence[LoRA] = ()) -> CLIPTextModel:
    raw, config = _text_encoder_config(path, with_projection)
    model = nnx.eval_shape(lambda: CLIPTextModel(config, precision))
    return _fill(model, path, raw, weights=weights, rename=normalize_clip_name, loras=loras)


def _unet_config(path: Path, weights: TensorSource | None) -> dict[str, Any]:
    raw = _config(path)
    if weights is not None:  # a single file has no config: its first convolution says what it takes
        key = "conv_in.weight"
        if in_single_file_layout(weights, "unet"):
            key = PREFIXES["unet"] + "input_blocks.0.0.weight"
        if key in weights.keys() and (channels := weights.shape(key)[1]) != raw.get("in_channels", 4):
            raw["in_channels"] = channels  # (an inpainting UNet's 9, as diffusers' from_single_file infers it)
    return raw


def load_unet(path: Path, precision: Precision, weights: TensorSource | None = None,
              loras: Sequence[LoRA] = ()) -> UNet2DConditionModel:
    """The UNet of `path` (config.json and weights), or with `weights` another UNet of the same
    architecture: in diffusers names (as SDXL-Lightning's UNets are published) or the single-file
    layout (a whole single-file checkpoint's UNet included)."""
    raw = _unet_config(path, weights)
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
    checkpoint = Checkpoint.open(model, dtype=dtype, param_dtype=param_dtype, attention=attention, unet=unet,
                                 config=config, loras=loras)
    return checkpoint.fill(checkpoint.abstract())


_RENAMES = {"text_encoder": normalize_clip_name, "text_encoder_2": normalize_clip_name, "unet": lambda k: k,
            "vae": normalize_vae_name}


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint opened (configs read, its files found and checked, LoRAs read) and no weight
    read yet: `abstract()` gives its networks' shapes at once (all that compiling for them needs),
    `fill()` reads their weights in; load_models does both, a server compiles between them."""
    root: Path
    precision: Precision
    configs: dict[str, dict[str, Any]]  # each network's config.json (the UNet's inputs as its weights say)
    weights: dict[str, TensorSource | None]  # each network's weights other than its directory's own
    loras: tuple[LoRA, ...]

    @classmethod
    def open(cls, model: str | os.PathLike, *, dtype: str = "bfloat16", param_dtype: str | None = None,
             attention: str = "auto", unet: str | os.PathLike | None = None, config: str | os.PathLike | None = None,
             loras: Sequence[str | tuple] | None = None) -> Checkpoint:
        """load_models' arguments, checked: a missing file, config or LoRA is refused here."""
        root = config_root(model, config)
        file = None
        if is_single_file(model):
            path = resolve_file(model)
            file = TensorSource([path])
            check_single_file(file, path, COMPONENTS)
        adapters = tuple(read_loras(loras))  # read (and refused) before any network is loaded
        weights = {name: file for name in _RENAMES}
        if unet is not None:
            weights["unet"] = TensorSource([resolve_file(unet)])
        configs = {"text_encoder": _text_encoder_config(root / "text_encoder", False)[0],
                   "text_encoder_2": _text_encoder_config(root / "text_encoder_2", True)[0],
                   "unet": _unet_config(root / "unet", weights["unet"]), "vae": _config(root / "vae")}
        return cls(root, Precision.of(dtype, param_dtype, attention=attention), configs, weights, adapters)

    def abstract(self) -> Models:
        """The four networks, shapes and dtypes only (nnx.eval_shape): nothing read, nothing on a device."""
        p, c = self.precision, self.configs
        models = Models(
            text_encoder=nnx.eval_shape(lambda: CLIPTextModel(
                CLIPTextConfig.from_dict(c["text_encoder"], with_projection=False), p)),
            text_encoder_2=nnx.eval_shape(lambda: CLIPTextModel(
                CLIPTextConfig.from_dict(c["text_encoder_2"], with_projection=True), p)),
            unet=nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(c["unet"]), p)),
            vae=nnx.eval_shape(lambda: AutoencoderKL(VAEConfig.from_dict(c["vae"]), p)))
        models.condition_channels  # noqa: B018 (refuses a UNet whose inputs are not supported, by name)
        return models

    def check(self, models: Models) -> None:
        """Whether the weights hold exactly `models`' (from abstract()) tensors in their shapes,
        from the files' headers alone: a mismatch is refused (CheckpointError, naming them) before
        anything is read or compiled."""
        for name, rename in _RENAMES.items():
            source, rename, label = _source(getattr(models, name), self.root / name, self.configs[name],
                                            self.weights[name], rename)
            check_tensors(getattr(models, name), source, rename=rename, component=label)

    def fill(self, models: Models) -> Models:
        """`models` (from abstract()) with their weights read in, in place, LoRAs fused."""
        for name, rename in _RENAMES.items():
            _fill(getattr(models, name), self.root / name, self.configs[name], weights=self.weights[name],
                  rename=rename, loras=self.loras)
        return models
