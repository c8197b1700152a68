"""Textual inversion embedding files for the tiny model, as A1111 users keep them in a folder, and
files beside them that are not embeddings for it (each to be skipped with its reason)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# name -> vectors of the embeddings that load
GOOD = {"myemb": 3, "onevec": 1}
# name -> a word of the reason it is skipped for
SKIPPED = {"wide": "shape", "lonely": "holds", "garbage": "not a safetensors file", "pickled": "pickle",
           "long": "vectors", "unequal": "vectors", "nans": "finite", "empty": "not a safetensors file",
           "bomb": "not a safetensors file", "lies": "not a safetensors file"}


def widths(checkpoint: Path) -> tuple[int, int]:
    return tuple(json.loads((checkpoint / part / "config.json").read_text())["hidden_size"]
                 for part in ("text_encoder", "text_encoder_2"))


def vectors(n: int, width: int, seed: int) -> np.ndarray:
    # (the scale of CLIP's token embeddings: vectors that change the image, not swamp it)
    return (np.random.default_rng(seed).standard_normal((n, width)) * 0.5).astype(np.float32)


def write_embeddings_folder(folder: Path, checkpoint: Path) -> Path:
    d1, d2 = widths(checkpoint)
    save_file({"clip_l": vectors(3, d1, 1), "clip_g": vectors(3, d2, 2)}, folder / "myemb.safetensors")
    (folder / "sub").mkdir()
    save_file({"clip_l": vectors(1, d1, 3), "clip_g": vectors(1, d2, 4)}, folder / "sub" / "onevec.safetensors")
    save_file({"clip_l": vectors(2, d1 + 1, 5), "clip_g": vectors(2, d2, 6)}, folder / "wide.safetensors")
    save_file({"clip_l": vectors(2, d1, 7)}, folder / "lonely.safetensors")
    save_file({"clip_l": vectors(76, d1, 8), "clip_g": vectors(76, d2, 9)}, folder / "long.safetensors")
    save_file({"clip_l": vectors(2, d1, 10), "clip_g": vectors(3, d2, 11)}, folder / "unequal.safetensors")
    nans = vectors(1, d1, 12)
    nans[0, 0] = np.nan
    save_file({"clip_l": nans, "clip_g": vectors(1, d2, 13)}, folder / "nans.safetensors")
    (folder / "garbage.safetensors").write_bytes(np.random.default_rng(14).bytes(4096))
    (folder / "pickled.pt").write_bytes(b"\x80\x04\x95 not to be unpickled")
    (folder / "empty.safetensors").write_bytes(b"")
    (folder / "bomb.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{")
    (folder / "lies.safetensors").write_bytes((3).to_bytes(8, "little") + b"{x}")  # (a header, not JSON)
    (folder / "notes.txt").write_text("not an embedding: not read at all")
    return folder
