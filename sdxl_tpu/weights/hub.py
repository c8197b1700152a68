"""Where a checkpoint's files are: "tiny" (written once to the user cache), a local directory or
file, or the Hugging Face Hub (downloaded, or taken from its cache). No JAX here: a front end
names models and reports their errors without loading any."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .errors import CheckpointError
from .tiny_tokenizers import TINY_VERSION, write_tokenizers  # (no JAX: a front end writes these)

TAESD_REPO = "madebyollin/taesdxl"  # TAESD for SDXL, the live previews' decoder
COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")
_SMALL_FILES = ["model_index.json", "*/config.json", "scheduler/scheduler_config.json", "tokenizer/*",
                "tokenizer_2/*"]


def _tiny_dir() -> Path:
    default = Path.home() / ".cache" / "sdxl_tpu" / f"tiny-v{TINY_VERSION}"
    return Path(os.environ.get("SDXL_TPU_TINY_DIR", default))


def _written_once(directory: Path, marker: str, write: Callable[[Path], object]) -> Path:
    """`directory`, written by `write(path)` unless `marker` is in it already."""
    if not (directory / marker).is_file():
        # Write beside it and rename, so concurrent first runs never see half of it.
        staging = directory.with_name(f"{directory.name}.{os.getpid()}.tmp")
        write(staging)
        try:
            staging.rename(directory)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not (directory / marker).is_file():
                raise
    return directory


def tiny_checkpoint_dir() -> Path:
    """The built-in tiny checkpoint ("tiny"), written once to the user cache ($SDXL_TPU_TINY_DIR)."""
    from .tiny import write_tiny_checkpoint

    return _written_once(_tiny_dir(), "model_index.json", write_tiny_checkpoint)


def tiny_tokenizers_dir() -> Path:
    """The tiny checkpoint's tokenizer/ and tokenizer_2/ without its weights (writing those needs
    JAX): the checkpoint's own where it is written, else written once beside it."""
    checkpoint = _tiny_dir()
    if (checkpoint / "model_index.json").is_file():
        return checkpoint
    return _written_once(checkpoint.with_name(f"{checkpoint.name}-tokenizers"), "tokenizer_2/tokenizer_config.json",
                         write_tokenizers)


def resolve(model: str | os.PathLike, *, variant: str | None = "fp16", weights: bool = True) -> Path:
    """"tiny" (the built-in tiny checkpoint), a local directory as is, or a Hub repo id,
    downloaded (or taken from the HF cache).

    Only the files SDXL needs are fetched, and each component's `variant` weights (fp16) when the
    repo has them; with `weights=False` only configs, tokenizers and the scheduler config (what a
    single-file checkpoint lacks). HF_HUB_OFFLINE=1 makes this use the cache only.
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
    if not weights:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    if variant:
        patterns += [f"{c}/*.{variant}.safetensors" for c in COMPONENTS]
        patterns += [f"{c}/*.{variant}-*.safetensors" for c in COMPONENTS]
        patterns += [f"{c}/*.safetensors.index.{variant}.json" for c in COMPONENTS]
    local = Path(snapshot_download(repo, allow_patterns=patterns))
    missing = [c for c in COMPONENTS if not any((local / c).glob("*.safetensors"))]
    if missing:  # no variant for these: take the plain weights
        local = Path(snapshot_download(repo,
                                       allow_patterns=list(_SMALL_FILES) + [f"{c}/*.safetensors*" for c in missing],
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


def load_tokenizer(model: str | os.PathLike):
    """The first CLIPTokenizer of `model` alone (a front end's token counts): "tiny", a local
    directory, or a Hub repo's small files (configs and tokenizers, not the weights)."""
    from transformers import CLIPTokenizer

    root = tiny_tokenizers_dir() if str(model) == "tiny" else resolve(model, weights=False)
    return CLIPTokenizer.from_pretrained(str(root / "tokenizer"))


def load_tokenizers(model: str | os.PathLike):
    """transformers CLIPTokenizers from tokenizer/ and tokenizer_2/."""
    from transformers import CLIPTokenizer

    root = resolve(model)
    return (CLIPTokenizer.from_pretrained(str(root / "tokenizer")),
            CLIPTokenizer.from_pretrained(str(root / "tokenizer_2")))


__all__ = ["COMPONENTS", "TAESD_REPO", "load_tokenizer", "load_tokenizers", "resolve", "resolve_file",
           "tiny_checkpoint_dir", "tiny_tokenizers_dir"]
