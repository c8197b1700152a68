"""The files people upload (the page's starting image), kept safe on a public server: the only files
read for a request are those Gradio's upload route wrote (or the images this server made), named
by the path the upload answered, never looked up by a client's say; served back only as fresh PNG
pixels, whatever the file held; deleted when older than the images are kept, and the oldest first
beyond a byte budget, so disk stays bounded however many are sent."""

from __future__ import annotations

import io
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, MutableSet
from typing import Any

from ..request.errors import RequestError
from ..imaging.image_input import MAX_BYTES, decode_image

log = logging.getLogger("sdxl_tpu.server.uploads")

GONE = ("{what}: the uploaded file is no longer on the server (uploads are kept {minutes} minutes); "
        "please drop the image in again.")


class Uploads:
    """Gradio's set of uploaded paths (`uploaded`: Blocks.upload_file_set, which its upload route
    fills), what else may be read as an image (`ours(path)`: the image store's files), and how
    long and how much of them are kept."""

    def __init__(self, uploaded: MutableSet[str], ours: Callable[[str], bool] = lambda path: False, *,
                 keep_seconds: float = 3600.0, max_bytes: int = 1 << 30):
        self.uploaded, self.ours = uploaded, ours
        self.keep_seconds, self.max_bytes = keep_seconds, max_bytes
        self._lock = threading.Lock()

    def holds(self, path: Any) -> bool:
        """Whether `path` (any value a client sent) is a file an upload wrote and still kept."""
        return isinstance(path, str) and path in self.uploaded

    def read(self, value: Any, what: str = "Image") -> bytes:
        """The bytes of the file a form value names: Gradio's file object ({"path": ...}) of an
        upload (or of one of this server's images); anything else is refused with a message."""
        path = value.get("path") if isinstance(value, dict) else None
        if not isinstance(path, str) or not (self.holds(path) or self.ours(path)):
            raise RequestError(f"{what} must be a file uploaded to this page (drop an image in the image box).")
        try:
            with open(path, "rb") as file:  # (a path the upload route or the store wrote, as it wrote it)
                data = file.read(MAX_BYTES + 1)
        except OSError:
            raise RequestError(GONE.format(what=what, minutes=round(self.keep_seconds / 60))) from None
        return data

    def add(self, image: Any, folder: str) -> str:
        """Keep a PNG the page made for a person (a mask painted over their image) as one of their
        uploads, in `folder` (Gradio's upload folder): read, served and swept as an upload is."""
        os.makedirs(folder, exist_ok=True)
        handle, path = tempfile.mkstemp(suffix=".png", prefix="painted-", dir=folder)
        with os.fdopen(handle, "wb") as file:
            image.save(file, "PNG", compress_level=1)
        self.uploaded.add(path)
        return path

    def png(self, path: str) -> bytes:
        """An uploaded file as the browser may show it: its pixels, decoded by content and encoded
        afresh as PNG (an HTML, SVG or polyglot upload is never served as itself)."""
        with open(path, "rb") as file:
            image = decode_image(file.read(MAX_BYTES + 1), "The upload")
        out = io.BytesIO()
        image.save(out, "PNG", compress_level=1)
        return out.getvalue()

    def sweep(self) -> None:
        """Delete uploads older than `keep_seconds`, then the oldest while they take more than
        `max_bytes` (and forget them)."""
        with self._lock:
            now, files = time.time(), []
            for path in list(self.uploaded):
                try:
                    stat = os.stat(path)
                except OSError:
                    self.uploaded.discard(path)
                    continue
                files.append((stat.st_mtime, stat.st_size, path))
            files.sort()
            total = sum(size for _, size, _ in files)
            for modified, size, path in files:
                if now - modified <= self.keep_seconds and total <= self.max_bytes:
                    break
                try:
                    os.remove(path)
                except OSError as e:
                    log.warning("could not delete the upload %s: %s", path, e)
                self.uploaded.discard(path)
                total -= size
