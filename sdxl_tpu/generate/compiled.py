"""Each size's compiled programs (programs.py), made once, when first needed: compiled, or loaded
untraced from a program store (stored_programs.py). A warmed-up pipeline has them all; otherwise
a call compiles only what it runs (a text-to-image call no image encoder, a guided one no
unguided loop)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..spec.values import format_size
from .compilation import compile_side_by_side
from .programs import Layout, program
from .stored_programs import ProgramStore

log = logging.getLogger("sdxl_tpu")


class CompiledPrograms:
    def __init__(self, layout: Layout, graphs: Mapping[str, Any], params: Mapping[str, Any],
                 store: ProgramStore | None = None):
        self.layout, self.graphs, self.params, self.store = layout, graphs, params, store
        self.by_size: dict[tuple[int, int], dict[str, Any]] = {}

    def get(self, size: tuple[int, int], names: Sequence[str]) -> dict[str, Any]:
        """The programs of `size` (at least those of `names`), making the missing ones."""
        programs = self.by_size.setdefault(size, {})
        missing = [name for name in names if name not in programs]
        encode = self._shared_encode()
        if "encode" in missing and encode is not None:
            programs["encode"] = encode
            missing.remove("encode")
        if missing and self.store is not None:  # loaded untraced where stored, else compiled (and stored)
            programs |= self.store.programs(missing, self.layout, size, self.graphs, self.params)
        elif missing:  # traced one after another, compiled side by side
            lowered = {}
            for name in missing:
                fn, args = program(name, self.layout, size, self.graphs, self.params)
                lowered[name] = fn.lower(*args)
            programs |= {name: compiled for name, (compiled, _) in compile_side_by_side(lowered).items()}
        return programs

    def load_stored(self, sizes: Sequence[tuple[int, int]], names: Sequence[str]) -> None:
        """What the store holds of `sizes`' programs `names`, loaded side by side across the sizes
        (a restart's), each size complete once its last program is in; nothing is compiled."""
        if self.store is None:
            return
        have_encode = self._shared_encode() is not None
        jobs = [(name, size) for size in sizes for name in names
                if name not in self.by_size.get(size, {}) and not (name == "encode" and have_encode)]
        start = time.perf_counter()
        found = self.store.load_side_by_side(jobs, self.layout, self.graphs, self.params,
                                             lambda name, size, compiled: self._add(size, name, compiled))
        if found:
            loaded_sizes = ", ".join(format_size(size) for size in sizes if any(s == size for _, s in found))
            log.info("%s: %d programs loaded from %s side by side, in %.1f s", loaded_sizes, len(found),
                     self.store.directory, time.perf_counter() - start)

    def _shared_encode(self) -> Any:
        """The text encoders' program, which does not depend on the size: made once, for every size."""
        return next((p["encode"] for p in self.by_size.values() if "encode" in p), None)

    def _add(self, size: tuple[int, int], name: str, compiled: Any) -> None:
        programs = self.by_size.setdefault(size, {})
        programs[name] = compiled
        if (shared := self._shared_encode()) is not None:
            programs.setdefault("encode", shared)

    def has(self, size: tuple[int, int], names: Sequence[str]) -> bool:
        return all(name in self.by_size.get(size, ()) for name in names)
