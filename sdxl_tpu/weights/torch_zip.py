"""A PyTorch checkpoint (torch.save's zip: `<name>/data.pkl` and a `<name>/data/<key>` entry a storage) read
without torch, and without running anything it holds: its pickle is read by an unpickler that knows only
what a plain state dict needs (OrderedDict, a tensor's rebuild, the storage types) and refuses every other
name, so a hostile file raises, naming what it asked for, and runs nothing. Each tensor is checked against
its storage (offset, sizes and strides inside it) before it is read. The pre-1.6 format (not a zip) is not read.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import re
import zipfile
from typing import Any

import ml_dtypes
import numpy as np

from .errors import CheckpointError

MAX_PICKLE_BYTES = 64 << 20
MAX_DIMS = 8
_STORAGES = {"FloatStorage": np.float32, "HalfStorage": np.float16, "BFloat16Storage": ml_dtypes.bfloat16,
             "DoubleStorage": np.float64, "LongStorage": np.int64, "IntStorage": np.int32,
             "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_}


class TorchFileError(CheckpointError):
    """A .pth file that is not a torch zip checkpoint holding plain tensors (the message says what it is)."""


# What find_class and persistent_load hand the pickle are tuples and fresh functions: a BUILD opcode cannot
# change a tuple, and changes to a function made for this read only (its defaults are never used) die with it.
def _storage_type(name: str) -> tuple[str, str]:
    return ("torch storage type", name)


def _is_int(x: Any) -> bool:
    return type(x) is int


def _tensor(data: np.ndarray, offset: Any, size: Any, stride: Any) -> np.ndarray:
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= MAX_DIMS
            and all(map(_is_int, (offset, *size, *stride)))):
        raise TorchFileError(f"a tensor of size {size!r}, stride {stride!r}, offset {offset!r}: not a tensor's")
    if offset < 0 or min((*size, *stride), default=0) < 0:
        raise TorchFileError(f"a tensor with a negative offset, size or stride ({offset}, {size}, {stride})")
    numel, length = math.prod(size), len(data)
    if numel and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= length:
        raise TorchFileError(f"a tensor (offset {offset}, size {size}, stride {stride}) reaches past its "
                             f"storage of {length} elements")
    if not numel:
        return np.zeros(size, data.dtype)
    if not size:  # (a 0-d tensor: as_strided would give it one dimension)
        return np.array(data[offset])
    view = np.lib.stride_tricks.as_strided(data[offset:], shape=size, writeable=False,
                                           strides=tuple(s * data.itemsize for s in stride))
    return np.ascontiguousarray(view)


class _Unpickler(pickle.Unpickler):
    """Knows OrderedDict, the tensor rebuilds and the storage types; refuses every other global."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, max_bytes: int):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.left = archive, prefix, max_bytes
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_parameter"):
            return lambda *args: self._rebuild(name, args)
        if module == "torch" and name in _STORAGES:
            return _storage_type(name)
        raise TorchFileError(f"its pickle asks for {module}.{name}, which a state dict of tensors does not hold "
                             "(refused: only plain tensors are read)")

    def _rebuild(self, name: str, args: tuple) -> np.ndarray:
        if name == "_rebuild_parameter":  # (data, requires_grad, backward_hooks)
            if not args or not isinstance(args[0], np.ndarray):
                raise TorchFileError("a parameter that is not a tensor")
            return args[0]
        if not 4 <= len(args) <= 7:
            raise TorchFileError(f"a tensor rebuilt from {len(args)} arguments")
        storage = args[0]
        if not (isinstance(storage, tuple) and len(storage) == 2 and storage[0] == "torch storage"
                and storage[1] in self.storages):
            raise TorchFileError("a tensor whose storage is not one of the file's")
        return _tensor(self.storages[storage[1]], *args[1:4])

    def persistent_load(self, pid: Any) -> tuple[str, str]:
        kinds = {_storage_type(name): np.dtype(dtype) for name, dtype in _STORAGES.items()}
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in kinds
                and isinstance(pid[2], str) and isinstance(pid[3], str) and _is_int(pid[4])):
            raise TorchFileError(f"a storage reference that is not torch's: {str(pid)[:100]}")
        _, kind, key, _, numel = pid
        if key not in self.storages:
            self.storages[key] = self._read(key, kinds[kind], kind[1], numel)
        elif self.storages[key].dtype != kinds[kind] or len(self.storages[key]) != numel:
            raise TorchFileError(f"storage {key} is read as two different storages")
        return ("torch storage", key)

    def _read(self, key: str, dtype: np.dtype, kind: str, numel: int) -> np.ndarray:
        if not re.fullmatch(r"\w{1,64}", key):
            raise TorchFileError(f"a storage named {key[:80]!r}")
        try:
            info = self.archive.getinfo(f"{self.prefix}data/{key}")
        except KeyError:
            raise TorchFileError(f"storage {key} is not in the archive") from None
        nbytes = numel * dtype.itemsize
        if numel < 0 or info.file_size != nbytes:
            raise TorchFileError(f"storage {key} holds {info.file_size} bytes, not {numel} {kind} elements")
        if nbytes > self.left:
            raise TorchFileError("its storages hold more bytes than an upscaler's")
        self.left -= nbytes
        return np.frombuffer(self.archive.read(info), dtype)


def read_torch_zip(path: str, max_bytes: int) -> Any:
    """The object a torch.save zip holds, its tensors as numpy arrays (of storages of `max_bytes` in all
    at most): pickle's own containers, numbers and strings, OrderedDicts and arrays, nothing else made.
    Raises TorchFileError saying what is wrong."""
    try:
        with zipfile.ZipFile(path) as archive:
            return _load(archive, max_bytes)
    except TorchFileError:
        raise
    except zipfile.BadZipFile as e:
        raise TorchFileError(f"not a torch zip checkpoint ({e}; pre-1.6 PyTorch pickles are not read)") from None
    except (OSError, EOFError, ValueError, zipfile.LargeZipFile) as e:
        raise TorchFileError(f"unreadable as a zip archive ({type(e).__name__}: {str(e)[:200]})") from None


def _load(archive: zipfile.ZipFile, max_bytes: int) -> Any:
    pickles = [i for i in archive.infolist() if re.fullmatch(r"[^/]+/data\.pkl", i.filename)]
    if len(pickles) != 1:
        raise TorchFileError("a zip archive, but not a torch checkpoint (no <name>/data.pkl)")
    prefix = pickles[0].filename[:-len("data.pkl")]
    if f"{prefix}byteorder" in archive.namelist() and archive.read(f"{prefix}byteorder") != b"little":
        raise TorchFileError("a big-endian torch checkpoint (not read here)")
    if pickles[0].file_size > MAX_PICKLE_BYTES:
        raise TorchFileError(f"its pickle is {pickles[0].file_size} bytes: too large for a state dict")
    unpickler = _Unpickler(archive.read(pickles[0]), archive, prefix, max_bytes)
    try:
        return unpickler.load()
    except (TorchFileError, zipfile.BadZipFile):
        raise
    except Exception as e:  # (whatever a malformed pickle raises)
        raise TorchFileError(f"its pickle is not a state dict's ({type(e).__name__}: {str(e)[:200]})") from None
