"""TAESD's weights (madebyollin/taesdxl, another Hub repo, or a local diffusers-format copy) loaded
into models/taesd.py's AutoencoderTiny, for live previews."""

from __future__ import annotations

import os
from pathlib import Path

from flax import nnx

from ..models.layers import Precision
from ..models.taesd import AutoencoderTiny, TAESDConfig
from .errors import CheckpointError, PreviewDecoderError
from .hub import TAESD_REPO
from .tensors import TensorSource, load_into, read_json, weight_files

_WEIGHTS = "diffusion_pytorch_model.safetensors"


def _download(repo: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, allow_patterns=["config.json", "*.safetensors"]))
    except LocalEntryNotFoundError:
        reason = "offline or not in the Hugging Face cache"
    except Exception as e:  # noqa: BLE001 -- the Hub client's errors, whatever their type, mean "not downloaded"
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise PreviewDecoderError(f"The TAESD preview decoder {repo} could not be downloaded ({reason}): use --preview "
                          "approx, or --preview DIR with a local copy in diffusers format.")


def load_taesd(spec: str | os.PathLike = "taesd", precision: Precision | None = None) -> AutoencoderTiny:
    """"taesd" (madebyollin/taesdxl on the Hub), another Hub repo id, or a local diffusers-format
    directory (config.json + diffusion_pytorch_model.safetensors); HF_HUB_OFFLINE=1 uses the cache only."""
    spec, path = str(spec), Path(spec).expanduser()
    if spec == "taesd":
        path = _download(TAESD_REPO)
    elif not path.is_dir():
        if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
            raise PreviewDecoderError(f"TAESD {spec!r} is neither an existing directory nor a Hub repo id (owner/name)")
        path = _download(spec)
    if not (path / "config.json").is_file():
        raise PreviewDecoderError(f"{path} is not a TAESD checkpoint in diffusers format (no config.json)")
    try:
        raw = dict(read_json(path / "config.json"))
        if raw.get("_class_name", "AutoencoderTiny") != "AutoencoderTiny":
            raise ValueError(f"a {raw['_class_name']} config, not a TAESD (AutoencoderTiny) one")
        config = TAESDConfig.from_dict(raw)
    except (TypeError, ValueError) as e:  # json's errors included
        raise PreviewDecoderError(f"{path}/config.json: {e}") from None
    files = [path / _WEIGHTS] if (path / _WEIGHTS).is_file() else weight_files(path)
    model = nnx.eval_shape(lambda: AutoencoderTiny(config, precision))
    try:
        return load_into(model, TensorSource(files), component=f"TAESD ({path})")
    except CheckpointError as e:
        raise PreviewDecoderError(str(e)) from None
