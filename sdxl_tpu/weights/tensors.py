"""Safetensors checkpoints <-> Flax modules.

The Flax modules mirror the PyTorch module trees, so a parameter's PyTorch name is its
Flax path joined with dots, with `kernel`/`scale`/`embedding` renamed to `weight`.
Linear kernels are transposed, conv kernels go from (out, in, kh, kw) to (kh, kw, in, out).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from .errors import CheckpointError

M = TypeVar("M", bound=nnx.Module)

_RENAMED_LEAVES = {"kernel": "weight", "scale": "weight", "embedding": "weight"}

# Buffers some checkpoints carry that are not parameters.
_IGNORED_TENSORS = re.compile(r"(^|\.)position_ids$")

# Pre-0.14 diffusers VAE attention names -> current names.
_LEGACY_RENAMES = ((".query.", ".to_q."), (".key.", ".to_k."), (".value.", ".to_v."),
                   (".proj_attn.", ".to_out.0."))


def torch_name(path: tuple) -> str:
    """Flax state path -> PyTorch parameter name."""
    parts = [str(p) for p in path]
    parts[-1] = _RENAMED_LEAVES.get(parts[-1], parts[-1])
    return ".".join(parts)


def _torch_shape(path: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
    if path[-1] == "kernel":
        return shape[::-1] if len(shape) == 2 else (shape[3], shape[2], shape[0], shape[1])
    return shape


def torch_shapes(model: nnx.Module) -> dict[str, tuple[int, ...]]:
    """The PyTorch name and shape of every parameter of `model` (abstract or concrete)."""
    return {torch_name(path): _torch_shape(path, tuple(var.get_value().shape))
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


_SAFETENSORS_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
                       "I8": np.int8, "U8": np.uint8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
                       "BOOL": np.bool_}


class Tensors(Protocol):
    """Where a network's weights are read from: a TensorSource, or a single file's view of one
    component (single_file.SingleFileView)."""

    def keys(self) -> list[str]: ...

    def label(self, key: str, /) -> str: ...

    def shape(self, key: str, /) -> tuple[int, ...]: ...

    def get(self, key: str, /) -> np.ndarray: ...


class TensorSource:
    """Named tensors of one or more .safetensors files, read without torch.

    Each file's header is parsed once and its data mapped into memory; a tensor is a view of the
    mapped bytes (bfloat16 included, via ml_dtypes, which safetensors' numpy backend lacks).
    """

    def __init__(self, files: Iterable[str | os.PathLike]):
        self.files = [str(f) for f in files]
        self._entries: dict[str, tuple[np.memmap, dict]] = {}
        for f in self.files:
            with open(f, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(header_len))
            data = np.memmap(f, dtype=np.uint8, mode="r", offset=8 + header_len)
            for key, info in header.items():
                if key != "__metadata__":
                    self._entries[key] = (data, info)

    def keys(self) -> list[str]:
        return list(self._entries)

    def label(self, key: str) -> str:
        """How errors name a tensor (views onto other layouts name it as their file does)."""
        return key

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entries[key][1]["shape"])

    def get(self, key: str) -> np.ndarray:
        data, info = self._entries[key]
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"tensor {key} has dtype {info['dtype']}, which this loader does not read")
        start, end = info["data_offsets"]
        return data[start:end].view(dtype).reshape(info["shape"])


def weight_files(component_dir: str | os.PathLike, prefer_variant: str | None = "fp16") -> list[Path]:
    """The safetensors files of one component; the `prefer_variant` set when present."""
    d = Path(component_dir)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no .safetensors weights in {d} (only safetensors checkpoints are supported)")
    variant = [f for f in files if prefer_variant and f".{prefer_variant}." in f.name or
               (prefer_variant and f.name.endswith(f".{prefer_variant}.safetensors"))]
    plain = [f for f in files if f.name.count(".") == 1 or re.search(r"-\d+-of-\d+\.safetensors$", f.name)]
    return variant or plain or files


def load_into(model: M, source: Tensors, *, rename: Callable[[str], str] = lambda k: k,
              component: str = "model", deltas: Mapping[str, Callable[[], np.ndarray]] | None = None) -> M:
    """Fill every parameter of `model` (abstract, e.g. from nnx.eval_shape) from `source`.

    Fails, naming the tensors, if any is missing, unexpected or of the wrong shape. `deltas`
    (by PyTorch name, in PyTorch layout: fused LoRA updates) are added in float32. Weights are
    placed on the default device as stored, then cast to each parameter's dtype there.
    """
    by_name, ckpt = check_tensors(model, source, rename=rename, component=component)
    with _Layouts() as layouts:
        group: list[tuple[nnx.Variable, np.ndarray, Callable[[jax.Array], jax.Array] | None]] = []
        group_bytes = 0
        for name, (path, var) in by_name.items():
            array = source.get(ckpt[name])
            if deltas and name in deltas:
                array = np.asarray(array, np.float32) + deltas[name]()
            dtype = np.dtype(var.get_value().dtype)
            if array.ndim == 1:  # (norms and biases: a few MB in all; a program each would cost more)
                group.append((var, np.asarray(array, dtype), None))
            else:
                group.append((var, array, layouts.program(array, dtype, kernel=path[-1] == "kernel")))
            group_bytes += group[-1][1].nbytes
            if group_bytes >= _GROUP_BYTES:
                _place(group)
                group, group_bytes = [], 0
        _place(group)
    return model


def check_tensors(model: nnx.Module, source: Tensors, *, rename: Callable[[str], str] = lambda k: k,
                  component: str = "model") -> tuple[dict[str, tuple[Any, nnx.Variable]], dict[str, str]]:
    """Whether `source` holds exactly `model`'s parameters in their shapes (names and shapes alone:
    nothing read); raises CheckpointError naming the tensors missing, unexpected or of the wrong
    shape. Returns the parameters by PyTorch name, and the checkpoint's key of each."""
    by_name = {torch_name(path): (path, var) for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    ckpt = {}
    for key in source.keys():
        if _IGNORED_TENSORS.search(key):
            continue
        ckpt[rename(key)] = key
    expected = {name: _torch_shape(path, tuple(var.get_value().shape)) for name, (path, var) in by_name.items()}
    missing = sorted(source.label(name) for name in set(expected) - set(ckpt))
    unexpected = sorted(source.label(ckpt[name]) for name in set(ckpt) - set(expected))
    wrong = sorted(f"{source.label(ckpt[name])} (checkpoint {source.shape(ckpt[name])}, model {expected[name]})"
                   for name in set(expected) & set(ckpt) if source.shape(ckpt[name]) != expected[name])
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if names:
            shown = ", ".join(names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise CheckpointError(f"{component} checkpoint does not match the model: " + "; ".join(problems))
    return by_name, ckpt


# Tensors travel to the device as the file holds them, in groups of about this many bytes (few
# large transfers; a group at a time, so the device never holds a whole network twice), and are
# cast and laid out there: on the host, a cast through a transposed view of the mapped file was
# 6x the time of reading its bytes (benchmarks/RESULTS.md, 2026-12-05).
_GROUP_BYTES = 256 << 20


def _place(group: list[tuple[nnx.Variable, np.ndarray, Callable[[jax.Array], jax.Array] | None]]) -> None:
    stored = jax.device_put([array for _, array, _ in group])
    for (var, _, program), raw in zip(group, stored):
        var.set_value(raw if program is None else program(raw))


class _Layouts:
    """The programs that lay out and cast each shape of tensor on the device, compiled in threads
    while the tensors are read (a program per shape: compiled one after another, they were half
    of SDXL's load on a CPU)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(os.cpu_count() or 1)
        self._compiling: dict[tuple, Future] = {}

    def program(self, array: np.ndarray, dtype: np.dtype, kernel: bool) -> Callable[[jax.Array], jax.Array]:
        key = (array.shape, array.dtype, dtype, kernel)
        if key not in self._compiling:
            shape = jax.ShapeDtypeStruct(array.shape, array.dtype)
            lowered = _flax_layout.lower(shape, dtype=dtype, kernel=kernel)
            self._compiling[key] = self._pool.submit(lowered.compile)
        return functools.partial(_run, self._compiling[key])

    def __enter__(self) -> _Layouts:
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(cancel_futures=True)


def _run(compiling: Future, raw: jax.Array) -> jax.Array:
    return compiling.result()(raw)


@functools.partial(jax.jit, static_argnames=("dtype", "kernel"))
def _flax_layout(x: jax.Array, dtype: np.dtype, kernel: bool) -> jax.Array:
    """A tensor in PyTorch's layout -> the Flax parameter: kernels transposed, cast to `dtype`."""
    if kernel:
        x = x.T if x.ndim == 2 else x.transpose(2, 3, 1, 0)
    return x.astype(dtype)


def normalize_clip_name(key: str) -> str:
    """transformers 5 saves CLIPTextModel without the `text_model.` prefix the hub checkpoints have."""
    if key.startswith("text_model.") or key.startswith("text_projection."):
        return key
    return "text_model." + key


def normalize_vae_name(key: str) -> str:
    for old, new in _LEGACY_RENAMES:
        if ".mid_block.attentions." in key and old in key:
            return key.replace(old, new)
    return key


def flax_params_as_torch(model: nnx.Module) -> dict[str, np.ndarray]:
    """Every parameter of a concrete model under its PyTorch name and layout (for writing checkpoints)."""
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        array = np.asarray(var.get_value())
        if path[-1] == "kernel":
            array = array.T if array.ndim == 2 else array.transpose(3, 2, 0, 1)
        out[torch_name(path)] = np.ascontiguousarray(array)
    return out


def read_json(path: str | os.PathLike) -> Mapping:
    with open(path) as f:
        return json.load(f)
