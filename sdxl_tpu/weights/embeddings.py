"""Textual inversion embeddings for SDXL, as AUTOMATIC1111 and diffusers load them: a folder of
.safetensors files, each a few vectors for each text encoder (`clip_l` (n, 768) for the first,
`clip_g` (n, 1280) for the second), named in a prompt by the file's name (its stem, as A1111 names
it; subfolders are searched too). Read without torch. A file that is not one for this model (other
keys, other widths, a pickle, too many vectors) is skipped and listed with the reason, as A1111
lists it, and the rest load."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..a1111.infotext import file_hash
from ..a1111.prompts import CHUNK_TOKENS, EmbeddingNames, chunk_prompt
from .checkpoint import Models
from .errors import CheckpointError
from .tensors import TensorSource

log = logging.getLogger("sdxl_tpu")

KEYS = ("clip_l", "clip_g")  # the first encoder's vectors, the second's
MAX_VECTORS = CHUNK_TOKENS  # an embedding is placed whole in one chunk of 75 tokens
MAX_FILE_BYTES = 16 << 20  # 75 vectors of 2048 float32 are 0.6 MB: a larger file is not an embedding
MAX_FILES = 10_000


@dataclass(frozen=True)
class Embedding:
    name: str
    vectors: tuple[np.ndarray, np.ndarray]  # (n, D1) and (n, D2), float32
    hash: str  # A1111's short hash ("TI hashes"): the first 12 hex digits of the file's SHA-256

    @property
    def count(self) -> int:
        return len(self.vectors[0])


@dataclass(frozen=True)
class Embeddings:
    """The embeddings a pipeline's prompts may name, and what its text program's inputs hold of them."""
    dims: tuple[int, int] = (0, 0)  # the text encoders' widths
    dtype: np.dtype = np.dtype(np.float32)  # their token embeddings' (A1111 casts the vectors to the model's)
    loaded: dict[str, Embedding] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why
    names: tuple[EmbeddingNames, ...] = (EmbeddingNames(), EmbeddingNames())  # as each tokenizer reads them

    @staticmethod
    def none_for(models: Models) -> Embeddings:
        """No embeddings, for these text encoders."""
        token = models.text_encoder.text_model.embeddings.token_embedding.embedding.get_value()
        return Embeddings((models.text_encoder.config.hidden_size, models.text_encoder_2.config.hidden_size),
                          np.dtype(token.dtype))

    def vectors(self, encoder: int) -> dict[str, np.ndarray]:
        return {name: e.vectors[encoder] for name, e in self.loaded.items()}

    def used(self, tokenizer, texts: Sequence[str], chunks: int) -> tuple[tuple[str, str], ...]:
        """(name, short hash) of each embedding the texts name within their first `chunks` chunks (as
        the first tokenizer reads them: what is encoded), once each."""
        if not self.loaded:
            return ()
        named = [name for text in texts for name in chunk_prompt(tokenizer, text, chunks, self.names[0]).embeddings]
        return tuple((name, self.loaded[name].hash) for name in dict.fromkeys(named))


def load_embeddings(folder: str | os.PathLike | None, tokenizers: Sequence, models: Models) -> Embeddings:
    """Every embedding under `folder` that fits these text encoders (`models`'; their `tokenizers`
    read the names; None: no folder, none)."""
    none = Embeddings.none_for(models)
    if folder is None:
        return none
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointError(f"embeddings: {folder} is not a folder")
    loaded: dict[str, Embedding] = {}
    skipped: dict[str, str] = {}
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in (".safetensors", ".pt", ".bin"))
    for path in files[:MAX_FILES]:
        name = path.stem
        try:
            if name in loaded:
                raise CheckpointError(f"another file is named {name} too")
            loaded[name] = _read(path, none.dims)
        except Exception as e:  # (whatever a broken or hostile file raises: it is skipped, the rest load)
            skipped[name] = str(e) or f"unreadable ({type(e).__name__})"
            log.warning("embedding %s skipped: %s", path, e)
    counts = {name: e.count for name, e in loaded.items()}
    names = tuple(EmbeddingNames.of(t, counts) for t in tokenizers[:2])
    return Embeddings(none.dims, none.dtype, loaded, skipped, names)


def _read(path: Path, dims: tuple[int, int]) -> Embedding:
    if path.suffix.lower() != ".safetensors":
        raise CheckpointError("only .safetensors embeddings are read here (a .pt or .bin file is a pickle)")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise CheckpointError(f"{size} bytes: too large for an embedding")
    with open(path, "rb") as f:  # (a header's length past the file's end: not one, read no further)
        header = int.from_bytes(f.read(8), "little")
    if size < 8 or not 2 <= header <= size - 8:
        raise CheckpointError("not a safetensors file (no header of its length)")
    try:
        source = TensorSource([path])
    except ValueError as e:  # (the header is not JSON)
        raise CheckpointError(f"not a safetensors file ({e})") from None
    if sorted(source.keys()) != sorted(KEYS):
        raise CheckpointError(f"holds {', '.join(sorted(source.keys())[:5]) or 'nothing'}, not an SDXL embedding's "
                              f"{' and '.join(KEYS)}")
    vectors = []
    for key, dim in zip(KEYS, dims):
        shape = source.shape(key)
        if len(shape) != 2 or shape[1] != dim:
            raise CheckpointError(f"{key} has shape {tuple(shape)}; this model's needs (n, {dim})")
        array = np.asarray(source.get(key), np.float32)
        if not np.isfinite(array).all():
            raise CheckpointError(f"{key} holds values that are not finite")
        vectors.append(array)
    if vectors[0].shape[0] != vectors[1].shape[0]:
        raise CheckpointError(f"{KEYS[0]} has {vectors[0].shape[0]} vectors and {KEYS[1]} {vectors[1].shape[0]}")
    if not 1 <= vectors[0].shape[0] <= MAX_VECTORS:
        raise CheckpointError(f"{vectors[0].shape[0]} vectors; from 1 to {MAX_VECTORS} fit a chunk")
    return Embedding(path.stem, (vectors[0], vectors[1]), file_hash(path, 12))
