"""Images with their generation parameters, as AUTOMATIC1111 writes them (so "what made this?"
travels with the file), encoded once and kept on disk only for a while: one place for the CLI and
the app.

PNG carries the parameters in its "parameters" text chunk; JPEG and WebP in the EXIF UserComment
(type UNDEFINED, "UNICODE\\0" and UTF-16BE), as AUTOMATIC1111 writes it with piexif. JPEG at quality
95 is what the app serves by default: a 1024x1024 image encodes in about 10 ms, where PNG takes
140 ms at any compression level.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .names import schedule_used
from .version import VERSION

if TYPE_CHECKING:
    from PIL import Image

    from .request import ImageInfo

FORMATS = {"jpeg": "jpg", "png": "png", "webp": "webp"}  # format -> file extension
_EXIF_IFD, _USER_COMMENT = 0x8769, 0x9286
_UNICODE = b"UNICODE\0"
_LONG, _UNDEFINED = 4, 7  # TIFF field types


@dataclass(frozen=True)
class Stamp:
    """What made an image besides its own parameters, as A1111 names it: the model, its short
    hash where it is one file, and the LoRAs fused into it (name, scale, short hash)."""
    model: str
    model_hash: str | None = None
    loras: tuple[tuple[str, float, str], ...] = ()


def file_hash(path: str | os.PathLike, digits: int) -> str:
    """A1111's short hash of a weights file: the first `digits` hex digits of its SHA-256
    (10 for a checkpoint's "Model hash", 12 for a LoRA's)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()[:digits]


def parameters_text(info: "ImageInfo", stamp: Stamp | str) -> str:
    """AUTOMATIC1111's "parameters" text: prompt (with a `<lora:name:scale>` tag per LoRA, as A1111
    users apply them), negative prompt, then the settings line:

        Steps: 20, Sampler: Euler, Schedule type: Karras, CFG scale: 5, Seed: 7, Size: 1024x1024,
        Model: sd_xl_base_1.0, RNG: CPU, Version: sdxl-tpu 0.1.0
    """
    stamp = Stamp(stamp) if isinstance(stamp, str) else stamp
    lines = [info.prompt + "".join(f" <lora:{name}:{scale:g}>" for name, scale, _ in stamp.loras)]
    if info.negative_prompt:
        lines.append(f"Negative prompt: {info.negative_prompt}")
    # Where A1111 puts them: the schedule right after the sampler, the noise source after the model.
    # Both always, so the text says what ran ("Checkpoint" and "JAX" are this server's own).
    settings = [f"Steps: {info.steps}", f"Sampler: {info.sampler}",
                f"Schedule type: {schedule_used(info.sampler, info.schedule)}", f"CFG scale: {info.guidance_scale:g}",
                f"Seed: {info.seed}", f"Size: {info.size[0]}x{info.size[1]}"]
    if stamp.model_hash:
        settings.append(f"Model hash: {stamp.model_hash}")
    settings.append(f"Model: {stamp.model}")
    settings.append(f"RNG: {info.rng}")
    if stamp.loras:
        settings.append('Lora hashes: "' + ", ".join(f"{name}: {h}" for name, _, h in stamp.loras) + '"')
    settings.append(f"Version: sdxl-tpu {VERSION}")
    lines.append(", ".join(settings))
    return "\n".join(lines)


def encode(image: "Image.Image", parameters: str, fmt: str = "png") -> bytes:
    """The image as a file of format `fmt` (jpeg, png, webp) with `parameters` embedded."""
    from PIL.PngImagePlugin import PngInfo

    out = io.BytesIO()
    if fmt == "png":
        meta = PngInfo()
        meta.add_text("parameters", parameters)
        # Level 1: 1.2-1.35x faster than the default (6) at 1024x1024, about 10 % larger.
        image.save(out, "PNG", pnginfo=meta, compress_level=1)
    elif fmt in ("jpeg", "webp"):
        options = {"quality": 95} if fmt == "jpeg" else {"quality": 90, "method": 0}
        image.save(out, fmt.upper(), exif=user_comment_exif(parameters), **options)
    else:
        raise ValueError(f"image format {fmt!r}: use one of {', '.join(FORMATS)}")
    return out.getvalue()


def user_comment_exif(text: str) -> bytes:
    """An EXIF block holding `text` as its UserComment and nothing else, written by hand: Pillow
    would type the field BYTE, which piexif (A1111's reader) returns as a tuple, not the text.

    Little-endian TIFF: IFD0 with one pointer to the Exif IFD, which has one UNDEFINED field."""
    payload = _UNICODE + text.encode("utf-16-be")
    entry = lambda tag, kind, count, value: struct.pack("<HHII", tag, kind, count, value)
    ifd = lambda field: struct.pack("<H", 1) + field + struct.pack("<I", 0)  # one field, no next IFD
    exif_ifd_at = 8 + 18
    tiff = (b"II*\0" + struct.pack("<I", 8) + ifd(entry(_EXIF_IFD, _LONG, 1, exif_ifd_at))
            + ifd(entry(_USER_COMMENT, _UNDEFINED, len(payload), exif_ifd_at + 18)) + payload)
    return b"Exif\0\0" + tiff


def encode_preview(pixels) -> bytes:
    """A live preview ((h, w, 3) uint8) as a small JPEG: no parameters, it is not the image."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def read_parameters(image: "Image.Image") -> str | None:
    """The parameters an image file carries (PNG text chunk or EXIF UserComment), if any."""
    if "parameters" in image.info:
        return image.info["parameters"]
    comment = image.getexif().get_ifd(_EXIF_IFD).get(_USER_COMMENT)
    if isinstance(comment, bytes) and comment.startswith(_UNICODE):
        return comment[len(_UNICODE):].decode("utf-16-be")
    return None


_encoders: ThreadPoolExecutor | None = None
_encoders_lock = threading.Lock()


def encode_all(images: Sequence["Image.Image"], parameters: Sequence[str], fmt: str) -> list[bytes]:
    """One call's images as files of format `fmt`, each with its `parameters` text, encoded in
    parallel (Pillow's encoders release the GIL): what the playground writes and the back end sends."""
    global _encoders
    with _encoders_lock:
        if _encoders is None:
            _encoders = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sdxl-encode")
    return list(_encoders.map(lambda pair: encode(pair[0], pair[1], fmt), zip(images, parameters, strict=True)))


def save_png(image: "Image.Image", info: "ImageInfo", path: str | os.PathLike, *, model: Stamp | str) -> None:
    """Write a PNG with the parameters in its "parameters" text chunk."""
    Path(path).write_bytes(encode(image, parameters_text(info, model), "png"))


class ImageStore:
    """Generated images as files under `root`, each call's in its own folder. Folders older than
    `keep_seconds`, and the oldest beyond `max_bytes` in all, are deleted as new ones arrive, so a
    server's disk use stays bounded; `on_delete(paths)` is told which files went (e.g. to forget
    them in Gradio's file sets)."""

    def __init__(self, root: str | os.PathLike, *, fmt: str = "jpeg", keep_seconds: float = 3600.0,
                 max_bytes: int = 1 << 30, on_delete: Callable[[list[str]], None] | None = None):
        if fmt not in FORMATS:
            raise ValueError(f"image format {fmt!r}: use one of {', '.join(FORMATS)}")
        self.root, self.fmt = Path(root), fmt
        self.keep_seconds, self.max_bytes, self.on_delete = keep_seconds, max_bytes, on_delete
        self.root.mkdir(parents=True, exist_ok=True)
        self._calls: deque[tuple[float, Path, list[str], int]] = deque()  # (time, folder, files, bytes), oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    def save(self, images: Sequence["Image.Image"], infos: Sequence["ImageInfo"], model: Stamp | str) -> list[str]:
        """Encode and write one call's images; returns their paths."""
        return self.write(encode_all(images, [parameters_text(i, model) for i in infos], self.fmt),
                          [info.seed for info in infos])

    def write(self, data: Sequence[bytes], seeds: Sequence[int], *, name: str = "sdxl",
              extension: str | None = None) -> list[str]:
        """Write one call's images, already encoded in this store's format (see `encode_all`; or
        as `extension` says, e.g. previews); returns their paths. The names are this store's own
        (folder, `name` and seed), never a caller's."""
        folder = self.root / uuid.uuid4().hex
        folder.mkdir()
        paths = []
        for seed, blob in zip(seeds, data, strict=True):
            path = folder / f"{name}-{int(seed)}.{extension or FORMATS[self.fmt]}"
            path.write_bytes(blob)
            paths.append(str(path))
        with self._lock:
            self._calls.append((time.monotonic(), folder, paths, sum(len(b) for b in data)))
            self._bytes += self._calls[-1][3]
        self.sweep()
        return paths

    def sweep(self) -> None:
        """Delete what is too old, then the oldest while over `max_bytes` (never the newest call)."""
        gone: list[Path] = []
        removed: list[str] = []
        with self._lock:
            now = time.monotonic()
            while len(self._calls) > 1 and (now - self._calls[0][0] > self.keep_seconds
                                            or self._bytes > self.max_bytes):
                _, folder, paths, size = self._calls.popleft()
                self._bytes -= size
                gone.append(folder)
                removed += paths
        for folder in gone:
            shutil.rmtree(folder, ignore_errors=True)
        if removed and self.on_delete is not None:
            self.on_delete(removed)

    @property
    def bytes_on_disk(self) -> int:
        return self._bytes

    def close(self) -> None:
        """Delete everything this store wrote."""
        shutil.rmtree(self.root, ignore_errors=True)
