"""Each size's compiled programs (programs.py), made once, when first needed: compiled, or loaded
untraced from a program store (stored_programs.py). A warmed-up pipeline has them all; otherwise
a call compiles only what it runs (a text-to-image call no image encoder, a guided one no
unguided loop).

Several threads may ask at once (a call, and the background compile of what no call needed yet):
a program is made by the first that asks for it; the others wait for that one, never make it twice.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import jax

from ...request.values import format_size
from .compilation import compile_side_by_side
from .layout import Layout, Size
from .programs import Graphs, Params, Program, program, slowest_first
from .stored_programs import ProgramStore

log = logging.getLogger("sdxl_tpu")



def _key(name: str, size: Size) -> tuple[str, Size | None]:
    """What a program is made once for: the text encoders do not depend on the size."""
    return name, None if name == "encode" else size


class CompiledPrograms:
    def __init__(self, layout: Layout, graphs: Graphs, params: Params,
                 store: ProgramStore | None = None):
        self.layout, self.graphs, self.params, self.store = layout, graphs, params, store
        self.by_size: dict[Size, dict[str, Program]] = {}
        self._lock = threading.Lock()
        self._making: dict[tuple[str, Size | None], Future] = {}  # by _key: made now, by another thread

    def get(self, size: Size, names: Sequence[str]) -> dict[str, Program]:
        """The programs of `size` (at least those of `names`), making the missing ones (those
        another thread is making: waiting for it)."""
        while True:
            mine, theirs = self._claim([(name, size) for name in names])
            if mine:
                self._make(size, [name for name, _ in mine])
            for future in theirs:
                future.result()  # (their failure is this call's too)
            programs = self.by_size.get(size, {})
            if all(name in programs for name in names):
                return programs
            # (what another thread was to load from the store was not there: made here now)

    def _claim(self, jobs: Sequence[tuple[str, Size]]) -> tuple[list[tuple[str, Size]], list[Future]]:
        """Of `jobs` ((name, size)), those missing and made by no one (now this thread's to make),
        and the futures of those another thread is making."""
        mine, theirs, keys = [], [], set()
        with self._lock:
            shared = self._shared_encode()
            for name, size in jobs:
                key = _key(name, size)
                if name == "encode" and shared is not None:
                    self.by_size.setdefault(size, {}).setdefault("encode", shared)
                if key in keys or name in self.by_size.get(size, {}):
                    continue
                keys.add(key)
                if key in self._making:
                    theirs.append(self._making[key])
                else:
                    self._making[key] = Future()
                    mine.append((name, size))
        return mine, theirs

    def _settle(self, name: str, size: Size, compiled: Program | None = None,
                error: BaseException | None = None) -> None:
        """A claimed job ended: its program kept (None: not made, as a load the store could not
        serve), and whoever waits for it told."""
        with self._lock:
            if compiled is not None:
                self._add(size, name, compiled)
            future = self._making.pop(_key(name, size))
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(compiled)

    def _make(self, size: Size, names: list[str]) -> None:
        """Claimed programs `names` of `size`: loaded untraced where stored, else compiled."""
        try:
            if self.store is not None:  # loaded untraced where stored, else compiled (and stored)
                made = self.store.programs(names, self.layout, size, self.graphs, self.params)
            else:  # traced one after another, slowest first, each compiled once traced, side by side
                made = {name: compiled for name, (compiled, _) in compile_side_by_side(
                    {name: functools.partial(self._lower, name, size) for name in slowest_first(names)}).items()}
        except BaseException as e:
            for name in names:
                self._settle(name, size, error=e)
            raise
        for name in names:
            self._settle(name, size, made[name])

    def _lower(self, name: str, size: Size) -> jax.stages.Lowered:
        fn, args = program(name, self.layout, size, self.graphs, self.params)
        return fn.lower(*args)

    def load_stored(self, wanted: Sequence[tuple[str, Size]]) -> None:
        """What the store holds of the `wanted` programs ((name, size)), loaded side by side across
        the sizes (a restart's), each size complete once its last program is in; nothing is compiled."""
        if self.store is None:
            return
        sizes = list(dict.fromkeys(size for _, size in wanted))
        jobs, _ = self._claim(wanted)
        start, found = time.perf_counter(), set()

        def loaded(name: str, size: Size, compiled: Program) -> None:
            found.add((name, size))
            self._settle(name, size, compiled)

        try:
            self.store.load_side_by_side(jobs, self.layout, self.graphs, self.params, loaded)
        finally:
            for name, size in jobs:
                if (name, size) not in found:
                    self._settle(name, size)  # (not stored: whoever needs it compiles it)
        if found:
            loaded_sizes = ", ".join(format_size(size) for size in sizes if any(s == size for _, s in found))
            log.info("%s: %d programs loaded from %s side by side, in %.1f s", loaded_sizes, len(found),
                     self.store.directory, time.perf_counter() - start)

    def _shared_encode(self) -> Program | None:
        """The text encoders' program, which does not depend on the size: made once, for every size."""
        return next((p["encode"] for p in self.by_size.values() if "encode" in p), None)

    def _add(self, size: Size, name: str, compiled: Program) -> None:
        programs = self.by_size.setdefault(size, {})
        programs[name] = compiled
        if name == "encode":  # (every size made so far shares it)
            for other in self.by_size.values():
                other.setdefault("encode", compiled)
        elif (shared := self._shared_encode()) is not None:
            programs.setdefault("encode", shared)

    def has(self, size: Size, names: Sequence[str]) -> bool:
        return all(name in self.by_size.get(size, ()) for name in names)
