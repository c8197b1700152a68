"""The images a server hands out, as files on its disk for a while: each call's in a folder of its
own, named by the store, deleted when too old or when the store is over its size, so disk use stays
bounded however long the server runs. And what the page shows of them: a gallery of (path, caption)
and the line that sums a run up."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..a1111.images import FORMATS, encode_preview
from ..request.values import format_size
from .engine import Generated
from .events import Done

Gallery = list[tuple[str, str]]  # (path, caption) of each image, as Gradio's gallery takes them


class ImageStore:
    """Generated images as files under `root`. Folders older than `keep_seconds`, and the oldest
    beyond `max_bytes` in all, are deleted as new ones arrive; each listener added with `on_delete`
    is told which files went (e.g. to forget them in Gradio's file sets)."""

    def __init__(self, root: str | os.PathLike, *, keep_seconds: float = 3600.0, max_bytes: int = 1 << 30):
        self.root, self.keep_seconds, self.max_bytes = Path(root), keep_seconds, max_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._calls: deque[tuple[float, Path, list[str], int]] = deque()  # (time, folder, files, bytes), oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[list[str]], None]] = []

    @staticmethod
    def under(folder: str | os.PathLike, keep_seconds: float, max_bytes: int) -> ImageStore:
        """A store in a folder of its own under `folder` (several servers may share it)."""
        return ImageStore(Path(folder) / f"sdxl-{uuid.uuid4().hex[:12]}", keep_seconds=keep_seconds,
                          max_bytes=max_bytes)

    def on_delete(self, listener: Callable[[list[str]], None]) -> None:
        self._listeners.append(listener)

    def write(self, data: Sequence[bytes], seeds: Sequence[int], extension: str, *, name: str = "sdxl") -> list[str]:
        """Write one call's files (encoded already; `extension` says as what); returns their paths.
        The names are this store's own (folder, `name` and seed), never a caller's."""
        folder = self.root / uuid.uuid4().hex
        folder.mkdir()
        paths = []
        for seed, blob in zip(seeds, data, strict=True):
            path = folder / f"{name}-{int(seed)}.{extension}"
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
        if removed:
            for listener in self._listeners:
                listener(removed)

    def holds(self, paths: Any) -> bool:
        """Whether `paths` (any value a client sent) are files this store wrote and still keeps:
        compared as strings with what it wrote, never looked up on the disk."""
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            return False
        with self._lock:
            held = {path for _, _, files, _ in self._calls for path in files}
        return all(p in held for p in paths)

    @property
    def bytes_on_disk(self) -> int:
        return self._bytes

    def close(self) -> None:
        """Delete everything this store wrote."""
        shutil.rmtree(self.root, ignore_errors=True)


def temporary_store() -> ImageStore:
    """A store in the system's temporary folder (for a server whose page does not say where)."""
    return ImageStore.under(tempfile.gettempdir(), keep_seconds=3600.0, max_bytes=1 << 30)


def previews_gallery(store: ImageStore, step: int, steps: int, images: Sequence[Any]) -> Gallery:
    """Live previews (uint8 arrays, or JPEG files from a back end) as small files in the store."""
    files = [image if isinstance(image, bytes) else encode_preview(image) for image in images]
    paths = store.write(files, range(len(files)), "jpg", name="preview")
    return [(path, f"preview · step {step} / {steps}") for path in paths]


def final_gallery(store: ImageStore, made: Generated) -> tuple[Gallery, float]:
    """A run's images, written once as they were encoded (parameters embedded), where the page
    serves them from (no copy); and the seconds it took to encode and write them."""
    start = time.perf_counter()
    paths = store.write(made.files, made.seeds, FORMATS[made.format])
    saving = made.timings.get("encoding", 0.0) + time.perf_counter() - start
    return [(path, f"seed {seed}") for path, seed in zip(paths, made.seeds)], saving


def summary(made: Generated, size: tuple[int, int], steps: int, saving: float, hires: Any = None) -> str:
    """The line under the gallery that sums a run up: what ran, how long each stage took, the seeds
    (`hires`: the hires fix that followed the run at `size`)."""
    t = made.timings
    made_as = format_size(size) if hires is None else (
        f"{format_size(hires.size)} (hires fix {hires.scale:g}x, {hires.upscaler}, from {format_size(size)})")
    steps_run = str(steps) if hires is None else f"{steps} + {hires.steps or steps} (at strength {hires.strength:g})"
    return (f"Generated {len(made.files)} images of {made_as} in {t['total']:.2f} s "
            f"(text {t['text_encoding']:.2f} s, denoising {t['denoising']:.2f} s for {steps_run} steps of "
            f"{made.sampler} (Schedule type {made.schedule}, RNG {made.rng}), "
            f"decoding {t['decoding']:.2f} s; {saving:.2f} s to save). "
            f"Seeds: {', '.join(str(s) for s in made.seeds)}.")


def batch_done(made: list[Done]) -> Done:
    """A run of several calls (A1111's Batch count) as one Done: their images and seeds in order,
    the line saying how many calls, then the last call's."""
    gallery = [image for done in made for image in done.gallery]
    seeds = [seed for done in made for seed in done.seeds]
    return Done(gallery, seeds, f"{len(made)} calls, {len(gallery)} images. The last call: {made[-1].summary}",
                made[-1].ran)
