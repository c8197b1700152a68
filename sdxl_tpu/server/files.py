"""The images a server hands out, as files on its disk for a while: each call's in a folder of
its own, deleted when too old or when the store is over its size, so disk use stays bounded."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from ..spec.images import FORMATS


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
