"""Find a diffusers-format SDXL checkpoint (local directory or Hub repo) and load its parts."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flax import nnx

from .clip import CLIPTextConfig, CLIPTextModel
from .layers import Precision
from .unet import UNet2DConditionModel, UNetConfig
from .vae import AutoencoderKL, VAEConfig
from .weights import (CheckpointError, TensorSource, load_into, normalize_clip_name, normalize_vae_name, read_json,
                      weight_files)

COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")
_SMALL_FILES = ["model_index.json", "*/config.json", "scheduler/scheduler_config.json", "tokenizer/*",
                "tokenizer_2/*"]


def tiny_checkpoint_dir() -> Path:
    """The built-in tiny checkpoint ("tiny"), written once to the user cache ($SDXL_TPU_TINY_DIR)."""
    from .tiny import TINY_VERSION, write_tiny_checkpoint

    default = Path.home() / ".cache" / "sdxl_tpu" / f"tiny-v{TINY_VERSION}"
    directory = Path(os.environ.get("SDXL_TPU_TINY_DIR", default))
    if not (directory / "model_index.json").is_file():
        # Write beside it and rename, so concurrent first runs never see half a checkpoint.
        staging = directory.with_name(f"{directory.name}.{os.getpid()}.tmp")
        write_tiny_checkpoint(staging)
        try:
            staging.rename(directory)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not (directory / "model_index.json").is_file():
                raise
    return directory


def resolve(model: str | os.PathLike, *, variant: str | None = "fp16") -> Path:
    """"tiny" (the built-in tiny checkpoint), a local directory as is, or a Hub repo id,
    downloaded (or taken from the HF cache).

    Only the files SDXL needs are fetched, and each component's `variant` weights (fp16) when the
    repo has them. HF_HUB_OFFLINE=1 makes this use the cache only.
    """
    if str(model) == "tiny":
        return tiny_checkpoint_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file() and not (path / "unet").is_dir():
            raise CheckpointError(f"{path} is not a diffusers-format SDXL directory (no model_index.json)")
        return path
    if str(model).startswith((".", "/", "~")) or str(model).count("/") != 1:
        raise CheckpointError(f"model {str(model)!r} is neither an existing directory nor a Hub repo id (owner/name)")
    from huggingface_hub import snapshot_download  # only needed for Hub ids

    repo = str(model)
    patterns = list(_SMALL_FILES)
    if variant:
        patterns += [f"{c}/*.{variant}.safetensors" for c in COMPONENTS]
        patterns += [f"{c}/*.{variant}-*.safetensors" for c in COMPONENTS]
        patterns += [f"{c}/*.safetensors.index.{variant}.json" for c in COMPONENTS]
    local = Path(snapshot_download(repo, allow_patterns=patterns))
    missing = [c for c in COMPONENTS if not any((local / c).glob("*.safetensors"))]
    if missing:  # no variant for these: take the plain weights
        local = Path(snapshot_download(repo, allow_patterns=list(_SMALL_FILES) + [f"{c}/*.safetensors*" for c in missing],
                                       ignore_patterns=[f"*.{variant}.*", f"*.{variant}-*"] if variant else None))
    return local


def resolve_file(spec: str | os.PathLike) -> Path:
    """A weights file: a local path, or `owner/repo/path/in/repo.safetensors` on the Hub
    (downloaded, or taken from the HF cache; HF_HUB_OFFLINE=1 uses the cache only)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    parts = str(spec).split("/")
    if str(spec).startswith((".", "/", "~")) or len(parts) < 3 or not str(spec).endswith(".safetensors"):
        raise CheckpointError(f"weights file {str(spec)!r} is neither an existing file nor a Hub file "
                              "(owner/repo/file.safetensors)")
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download("/".join(parts[:2]), "/".join(parts[2:])))


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


def load_text_encoder(path: Path, precision: Precision, *, with_projection: bool) -> CLIPTextModel:
    config = CLIPTextConfig.from_dict(_config(path), with_projection=with_projection)
    if with_projection and not config.projection_dim:
        raise CheckpointError(f"{path}/config.json: projection_dim is required for text_encoder_2")
    model = nnx.eval_shape(lambda: CLIPTextModel(config, precision))
    return load_into(model, TensorSource(weight_files(path)), rename=normalize_clip_name, component=path.name)


def load_unet(path: Path, precision: Precision, weights: Path | None = None) -> UNet2DConditionModel:
    """The UNet of `path` (config.json and weights), or with `weights` another UNet of the same
    architecture in diffusers' names (one .safetensors file, as SDXL-Lightning's are published)."""
    config = UNetConfig.from_dict(_config(path))
    model = nnx.eval_shape(lambda: UNet2DConditionModel(config, precision))
    files = [weights] if weights is not None else weight_files(path)
    return load_into(model, TensorSource(files), component=f"unet ({weights.name})" if weights else "unet")


def load_vae(path: Path, precision: Precision) -> AutoencoderKL:
    config = VAEConfig.from_dict(_config(path))
    model = nnx.eval_shape(lambda: AutoencoderKL(config, precision))
    return load_into(model, TensorSource(weight_files(path)), rename=normalize_vae_name, component="vae")


def load_models(model: str | os.PathLike, *, dtype: str = "bfloat16", param_dtype: str | None = None,
                attention: str = "auto", unet: str | os.PathLike | None = None) -> Models:
    """All four networks of an SDXL checkpoint, weights cast to `param_dtype` (default: `dtype`),
    computing in `dtype` with the `attention` kernel ("auto" or "xla"). `unet`: a UNet weights file
    to use instead of the checkpoint's (see `load_unet` and `resolve_file`)."""
    root = resolve(model)
    p = Precision.of(dtype, param_dtype, attention=attention)
    return Models(text_encoder=load_text_encoder(root / "text_encoder", p, with_projection=False),
                  text_encoder_2=load_text_encoder(root / "text_encoder_2", p, with_projection=True),
                  unet=load_unet(root / "unet", p, resolve_file(unet) if unet is not None else None),
                  vae=load_vae(root / "vae", p))


def load_tokenizer(model: str | os.PathLike):
    """The first CLIPTokenizer of `model` alone (a front end's token counts): "tiny", a local
    directory, or a Hub repo's tokenizer/ files (a few MB, not the weights)."""
    from transformers import CLIPTokenizer

    path = Path(str(model)).expanduser()
    if str(model) == "tiny" or path.is_dir():
        root = resolve(model)
    elif str(model).count("/") == 1 and not str(model).startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(str(model), allow_patterns=["tokenizer/*"]))
    else:
        raise CheckpointError(f"no tokenizer for {str(model)!r} here (neither a local directory nor a Hub repo id)")
    return CLIPTokenizer.from_pretrained(str(root / "tokenizer"))


def load_tokenizers(model: str | os.PathLike):
    """transformers CLIPTokenizers from tokenizer/ and tokenizer_2/."""
    from transformers import CLIPTokenizer

    root = resolve(model)
    return (CLIPTokenizer.from_pretrained(str(root / "tokenizer")),
            CLIPTokenizer.from_pretrained(str(root / "tokenizer_2")))
