"""Upscaler models (models/esrgan.py) from the files A1111 reads: `.pth` (a torch zip, read by torch_zip.py
without torch and without running its pickle) or `.safetensors`. Wrappers (Real-ESRGAN's `params_ema`,
`params`; `state_dict`, ...) and shared prefixes (`module.`) are dropped, and the old ESRGAN key layout
(`model.0`, `model.1.sub.N.RDB1.conv1.0`, ...) and BSRGAN's (`RRDB_trunk`, `trunk_conv`, `upconvN`,
`HRconv`) renamed to BasicSR's, as spandrel does. A folder of them is named as A1111 names its upscalers:
a file by its stem, Real-ESRGAN's own files by A1111's names for them; a file that is not one is skipped,
with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flax import nnx

from ..models.esrgan import UpscalerConfig, UpscalerNet, build_upscaler, config_from_shapes
from ..models.layers import Precision
from .errors import CheckpointError
from .tensors import _SAFETENSORS_DTYPES, TensorSource, Tensors, load_into
from .torch_zip import read_torch_zip

log = logging.getLogger("sdxl_tpu")

SUFFIXES = (".pth", ".safetensors")
MAX_FILE_BYTES = 1 << 30  # RealESRGAN_x4plus is 64 MB; ESRGAN's largest some 70
MAX_FILES = 1000
# What files wrap their weights in (Real-ESRGAN's: params_ema, params), first found first, and the prefixes all
# their names may share (a DataParallel's, a GAN's generator's): spandrel's, which A1111 loads with.
WRAPPERS = ("model_state_dict", "state_dict", "params_ema", "params-ema", "params", "model", "net")
PREFIXES = ("module.", "netG.")
# A1111's names for Real-ESRGAN's files (its Real-ESRGAN upscaler's list); any other file is named by its stem.
A1111_NAMES = {
    "RealESRGAN_x4plus": "R-ESRGAN 4x+",
    "RealESRGAN_x4plus_anime_6B": "R-ESRGAN 4x+ Anime6B",
    "RealESRGAN_x2plus": "R-ESRGAN 2x+",
    "realesr-general-x4v3": "R-ESRGAN General 4xV3",
    "realesr-general-wdn-x4v3": "R-ESRGAN General WDN 4xV3",
    "realesr-animevideov3": "R-ESRGAN AnimeVideo",
}


class UpscalerFileError(CheckpointError):
    """A file that is not an upscaler this package runs (the message names it and says why)."""


def a1111_name(path: str | os.PathLike) -> str:
    stem = Path(path).stem
    return A1111_NAMES.get(stem, stem)


class _Arrays:
    """Tensors (tensors.py's protocol) held in memory: a .pth file's."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self.arrays = dict(arrays)

    def keys(self) -> list[str]:
        return list(self.arrays)

    def label(self, key: str) -> str:
        return key

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.arrays[key].shape)

    def get(self, key: str) -> np.ndarray:
        return self.arrays[key]


def _unwrap(obj: object) -> dict[str, np.ndarray]:
    if isinstance(obj, dict):
        wrapped = [obj[key] for key in WRAPPERS if isinstance(obj.get(key), dict)]
        obj = wrapped[0] if wrapped else obj
    if isinstance(obj, dict) and len(obj) == 1 and isinstance(next(iter(obj.values())), dict):
        obj = next(iter(obj.values()))
    for prefix in PREFIXES:
        if isinstance(obj, dict) and obj and all(isinstance(k, str) and k.startswith(prefix) for k in obj):
            obj = {k[len(prefix):]: v for k, v in obj.items()}
    if not isinstance(obj, dict) or not obj:
        raise UpscalerFileError(f"holds a {type(obj).__name__}, not a state dict of tensors")
    bad = [str(k)[:60] for k, v in obj.items() if not (isinstance(k, str) and isinstance(v, np.ndarray))]
    if bad:
        raise UpscalerFileError(f"holds entries that are not named tensors: {', '.join(bad[:5])}")
    return obj


def _safetensors(path: Path, size: int) -> TensorSource:
    """A TensorSource once the header is checked: JSON, and every tensor's bytes inside the file and
    of its shape's length (TensorSource itself trusts them)."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if size < 8 or not 2 <= header_len <= min(size - 8, 100 << 20):
            raise UpscalerFileError("not a safetensors file (no header of its length)")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise UpscalerFileError(f"not a safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise UpscalerFileError("not a safetensors file (its header is not a JSON object)")
    data_len = size - 8 - header_len
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            shape, (start, end) = list(info["shape"]), info["data_offsets"]
            itemsize = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]]).itemsize
            ints = all(type(n) is int for n in (*shape, start, end))
            fits = ints and min(shape, default=0) >= 0 and 0 <= start <= end <= data_len
        except (KeyError, TypeError, ValueError):
            raise UpscalerFileError(f"tensor {str(key)[:80]} is not described as safetensors describes one") from None
        if not fits or end - start != int(np.prod(shape, dtype=object)) * itemsize:
            raise UpscalerFileError(f"tensor {str(key)[:80]} lies outside the file or is not its shape's length")
    return TensorSource([path])


def read_tensors(path: str | os.PathLike) -> Tensors:
    """The upscaler weights a .pth or .safetensors file holds, unwrapped, in the file's key layout."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise UpscalerFileError("an empty file")
    if size > MAX_FILE_BYTES:
        raise UpscalerFileError(f"{size} bytes: too large for an upscaler")
    if path.suffix.lower() == ".safetensors":
        source = _safetensors(path, size)
        if not source.keys():
            raise UpscalerFileError("holds no tensors")
        return source
    if path.suffix.lower() != ".pth":
        raise UpscalerFileError("neither .pth nor .safetensors")
    return _Arrays(_unwrap(read_torch_zip(str(path), MAX_FILE_BYTES)))


def _old_esrgan_names(keys: list[str]) -> dict[str, str]:
    """ESRGAN's original layout: model.0 the first conv, model.1.sub the blocks then the trunk's conv,
    model.3, .6, ... the upsampling convs, then the HR conv and the last (two apart)."""
    top = sorted({int(m.group(1)) for k in keys if (m := re.match(r"model\.(\d+)\.(weight|bias)$", k))})
    if len(top) < 3 or top[:1] != [0]:
        raise UpscalerFileError(f"an ESRGAN state dict whose top-level convs model.N are {top}")
    hr, last = top[-2], top[-1]
    ups = top[1:-2]
    if last != hr + 2 or ups != [3 * n for n in range(1, len(ups) + 1)] or hr != 3 * len(ups) + 2:
        raise UpscalerFileError(f"an ESRGAN state dict whose top-level convs model.N are {top}")
    blocks = {int(m.group(1)) for k in keys if (m := re.match(r"model\.1\.sub\.(\d+)\.RDB", k))}
    trunk = max(blocks, default=-1) + 1
    names = {f"model.{hr}": "conv_hr", f"model.{last}": "conv_last", "model.0": "conv_first",
             f"model.1.sub.{trunk}": "conv_body", **{f"model.{n}": f"conv_up{n // 3}" for n in ups}}
    renamed = {}
    for key in keys:
        head, _, leaf = key.rpartition(".")
        if m := re.fullmatch(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0", head):
            renamed[key] = f"body.{m.group(1)}.rdb{m.group(2)}.conv{m.group(3)}.{leaf}"
        else:
            renamed[key] = f"{names.get(head, head)}.{leaf}"
    return renamed


_BSRGAN = ((r"RRDB_trunk\.(\d+)\.RDB(\d)\.", r"body.\1.rdb\2."), (r"trunk_conv\.", "conv_body."),
           (r"upconv(\d)\.", r"conv_up\1."), (r"HRconv\.", "conv_hr."))


def new_layout_names(keys: list[str]) -> dict[str, str]:
    """Each key's name in BasicSR's layout (old ESRGAN and BSRGAN/RealSR keys renamed; others kept)."""
    if any(".conv1x1." in k for k in keys):
        raise UpscalerFileError("an ESRGAN+ network (conv1x1 in its blocks), which is not run here")
    if "model.0.weight" in keys and any(k.startswith("model.1.sub.") for k in keys):
        return _old_esrgan_names(keys)
    renamed = {}
    for key in keys:
        name = key
        for old, new in _BSRGAN:
            name = re.sub(f"^{old}", new, name)
        renamed[key] = name
    return renamed


@dataclass(frozen=True)
class UpscalerFile:
    """One upscaler file, its network read off its shapes; `load` builds and fills it."""
    name: str
    path: Path
    config: UpscalerConfig

    @property
    def scale(self) -> int:
        return self.config.scale

    def load(self, precision: Precision | None = None) -> UpscalerNet:
        return load_upscaler(self.path, precision)


def inspect_upscaler(path: str | os.PathLike) -> tuple[Tensors, dict[str, str], UpscalerConfig]:
    """The file's tensors, their names in BasicSR's layout and the network they are for; raises
    UpscalerFileError naming the file and what is wrong."""
    path = Path(path)
    try:
        tensors = read_tensors(path)
        names = new_layout_names(tensors.keys())
        shapes = {names[k]: tensors.shape(k) for k in tensors.keys()}
        try:
            config = config_from_shapes(shapes)
        except ValueError as e:
            shown = ", ".join(sorted(shapes)[:4]) + (", ..." if len(shapes) > 4 else "")
            raise UpscalerFileError(f"not an upscaler this package runs: {e} (it holds {shown})") from None
        if config.out_channels != 3:
            raise UpscalerFileError(f"an upscaler of {config.out_channels}-channel images, not RGB")
    except OSError as e:
        raise UpscalerFileError(f"upscaler {path}: unreadable ({e.strerror or e})") from None
    except CheckpointError as e:
        raise UpscalerFileError(f"upscaler {path}: {e}") from None
    return tensors, names, config


def load_upscaler(path: str | os.PathLike, precision: Precision | None = None) -> UpscalerNet:
    """The network a .pth or .safetensors upscaler file holds, with its weights (ESRGAN's RRDBNet or
    Real-ESRGAN's compact network; scale 4, 2 or 1, as its tensors say)."""
    tensors, names, config = inspect_upscaler(path)
    model = nnx.eval_shape(lambda: build_upscaler(config, precision))
    try:
        return load_into(model, tensors, rename=names.__getitem__, component=f"upscaler {path}")
    except CheckpointError as e:
        raise UpscalerFileError(str(e)) from None


@dataclass(frozen=True)
class Upscalers:
    """The upscalers of a folder, by A1111's names, and the files skipped (name -> why)."""
    found: dict[str, UpscalerFile] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def _files(root: Path) -> list[Path]:
    """The .pth and .safetensors files under `root`, its subfolders included, links out of it left out."""
    found = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        found += [Path(folder) / n for n in sorted(names) if Path(n).suffix.lower() in SUFFIXES]
    return found


def find_upscalers(folder: str | os.PathLike) -> Upscalers:
    """Every upscaler under `folder`, each checked (its tensors' names and shapes read, the network it is
    for found) but not loaded: UpscalerFile.load does that when it is used."""
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointError(f"upscalers: {folder} is not a folder")
    inside = root.resolve()
    found: dict[str, UpscalerFile] = {}
    skipped: dict[str, str] = {}
    for path in _files(root)[:MAX_FILES]:
        name = a1111_name(path)
        try:
            if not path.resolve().is_relative_to(inside):
                raise UpscalerFileError("a link to a file outside the folder")
            if not path.is_file():
                raise UpscalerFileError("not a file")
            if name in found:
                raise UpscalerFileError(f"another file is named {name} too")
            found[name] = UpscalerFile(name, path, inspect_upscaler(path)[2])
        except Exception as e:  # (whatever a broken or hostile file raises: it is skipped, the rest are found)
            skipped[name] = str(e) or f"unreadable ({type(e).__name__})"
            log.warning("upscaler %s skipped: %s", path, e)
    return Upscalers(found, skipped)
