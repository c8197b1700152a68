"""Compiled programs kept on disk and loaded without tracing, so a restarted server or a new
replica is ready in the time it takes to read them: JAX's persistent cache alone still traces
every program in Python before it is asked (about 2.6 s a size on the tiny model on a CPU).

They live beside JAX's cache (`<compile cache>/programs/`), one file per program, named by a hash
of everything that would make a stored program wrong for this process: the program and its size,
the pipeline's layout, the abstract arguments (shapes, dtypes, shardings), the networks' graphs
with their static attributes (configs, dtypes, the attention kernel), this package's source, the
jax, jaxlib and flax versions, the platform, the devices (kind and ids) and XLA's flags. Weights
are arguments, not part of a program: checkpoints of one architecture share the programs.
Anything wrong with an entry (absent, truncated, corrupt, made for other devices) is a miss:
the program is compiled as before and stored again. Entries are pickles (as JAX's cache holds
executables): the directory must be as trusted as the code, like the cache it sits in.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import jax
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from ...request.values import format_size
from .compilation import compile_side_by_side
from .layout import Device, Layout, Size
from .programs import (IMAGE_PROMPT, IP_NETWORKS, REFINER, Args, Graphs, Params, Program, controlnet_key, program,
                       slowest_first)

FORMAT = 1  # of an entry's pickle: {"format", "key", "executable", "in_tree", "out_tree"}
SUBDIRECTORY = "programs"
_PACKAGE = Path(__file__).resolve().parents[1]
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # (object addresses differ from process to process)
log = logging.getLogger("sdxl_tpu")


def _digest(*parts: object) -> str:
    return hashlib.sha256(_ADDRESS.sub("", repr(parts)).encode()).hexdigest()


@functools.cache
def _process_fingerprint() -> str:
    """What every program of this process depends on besides its pipeline: code, versions, flags."""
    import flax
    import jaxlib.version

    source = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        source.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    client = jax.devices()[0].client
    return _digest(source.hexdigest(), jax.__version__, jaxlib.version.__version__, flax.__version__, client.platform,
                   client.platform_version, os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
                   jax.config.values["jax_enable_x64"], str(jax.config.values["jax_default_matmul_precision"]))


def graphs_fingerprint(graphs: Graphs) -> str:
    """The networks' graphs, static attributes included (nnx GraphDefs: nodes and attributes)."""
    return _digest(sorted((name, repr(g.nodes), repr(g.attributes)) for name, g in graphs.items()))


SIZELESS = ("encode", "image_prompt", REFINER + "encode")  # (programs the image's size does not change)


def _extras(name: str) -> tuple[bool, bool]:
    """Whether program `name` takes an IP-Adapter's image prompt, and whether it is a refiner's."""
    base = name.split("+")[0]
    return base == "image_prompt" or base.endswith(IMAGE_PROMPT), base.startswith(REFINER)


def used_graphs(graphs: Graphs, name: str) -> Graphs:
    """The graphs program `name` may use: the pipeline's networks, of its ControlNets only those the
    name carries (programs.controlled), an IP-Adapter's and a refiner's only in their programs, so
    that loading another ControlNet, IP-Adapter or refiner keeps every stored program that does not
    use it."""
    named = {controlnet_key(c) for c in name.split("+")[1:]}
    image_prompt, refiner = _extras(name)
    used = lambda k: (k in named if k.startswith(controlnet_key("")) else image_prompt if k in IP_NETWORKS  # noqa: E731
                      else refiner if k.startswith("refiner/") else True)
    return {k: g for k, g in graphs.items() if used(k)}


def used_layout(layout: Layout, name: str) -> Layout:
    """`layout` as program `name` depends on it: an IP-Adapter's and a refiner's sizes only in their programs."""
    image_prompt, refiner = _extras(name)
    return dataclasses.replace(layout, image_prompt_size=layout.image_prompt_size * image_prompt,
                               refiner_pooled_dim=layout.refiner_pooled_dim * refiner)


class ProgramStore:
    """Compiled programs in `directory`, by key (see the module's docstring); `loaded` counts the
    programs loaded from it (by `programs`) since it was made."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.loaded = 0
        self._lock = threading.Lock()  # (sizes may load from several threads)
        self._graphs: dict[tuple[int, str], str] = {}  # graphs_fingerprint by id of the graphs and program

    @classmethod
    def beside(cls, compile_cache: str | os.PathLike | None) -> ProgramStore | None:
        """The store kept in a persistent compilation cache's directory (None: no cache, no store;
        '' too, as `--compile-cache ''` says)."""
        return None if compile_cache in (None, "") else cls(Path(compile_cache) / SUBDIRECTORY)

    def key(self, name: str, size: Size | None, layout: Layout, args: Args, graphs: str) -> str:
        """The key of program `name` for `size` (None: one for every size), built for `layout` (a
        programs.Layout), lowered with `args` from graphs with fingerprint `graphs`."""
        devices = [(d.platform, d.device_kind, d.id, d.process_index) for d in layout.mesh.devices.flat]
        used = used_layout(layout, name)
        fields = {f.name: getattr(used, f.name) for f in dataclasses.fields(used) if f.name != "mesh"}
        shapes = [f"{a.shape} {a.dtype} {getattr(a.sharding, 'spec', a.sharding)}" for a in jax.tree.leaves(args)]
        return _digest(FORMAT, _process_fingerprint(), graphs, name, size, fields, devices, layout.mesh.axis_names,
                       jax.tree.structure(args), shapes)

    def _made(self, name: str, size: Size, layout: Layout, graphs: Graphs,
              params: Params) -> tuple[jax.stages.Wrapped, Args, str]:
        """Program `name` for `size` (programs.program), its abstract arguments and its key."""
        if (id(graphs), name) not in self._graphs:
            self._graphs[id(graphs), name] = graphs_fingerprint(used_graphs(graphs, name))
        fn, args = program(name, layout, size, graphs, params)
        # The text encoders (and the image encoder) do not depend on the size: one entry for every size.
        return fn, args, self.key(name, None if name in SIZELESS else size, layout, args,
                                  self._graphs[id(graphs), name])

    def load_side_by_side(self, jobs: Sequence[tuple[str, Size]], layout: Layout, graphs: Graphs,
                          params: Params,
                          loaded: Callable[[str, Size, Program], None] = lambda *a: None
                          ) -> dict[tuple[str, Size], Program]:
        """The stored programs of `jobs` ((name, size) pairs), loaded one a core (XLA reads an
        executable on one core, in time that grows faster than its size: a tiled VAE decode of
        10.8 MB 4.3 s, a denoising loop of 3.5 MB 0.5 s); `loaded(name, size, program)` as each is.
        Nothing is compiled: what the store lacks is left out."""
        devices = list(layout.mesh.devices.flat)
        made = {job: self._made(*job, layout, graphs, params) for job in jobs}
        found = {}
        with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            futures = {pool.submit(self.load, made[job][2], made[job][1], devices): job for job in jobs}
            for future in as_completed(futures):
                if (compiled := future.result()) is not None:
                    found[futures[future]] = compiled
                    loaded(*futures[future], compiled)
        with self._lock:
            self.loaded += len(found)
        return found

    def programs(self, names: Sequence[str], layout: Layout, size: Size, graphs: Graphs,
                 params: Params) -> dict[str, Program]:
        """Programs `names` for `size` (programs.program's arguments): loaded untraced where stored,
        else compiled and stored; one log line says which."""
        start = time.perf_counter()
        found = self.load_side_by_side([(name, size) for name in names], layout, graphs, params)
        out = {name: found.get((name, size)) for name in names}
        sources = ["stored"] * sum(program is not None for program in out.values())
        keys = {}

        def lower(name: str) -> jax.stages.Lowered:
            fn, args, keys[name] = self._made(name, size, layout, graphs, params)
            return fn.lower(*args)

        def store(name: str, compiled: Program, by_xla: bool) -> None:
            # One that JAX's persistent cache gave is not stored: XLA's CPU client cannot serialize a
            # program it deserialized whole (its kernels would be missing when loaded: "Function ...
            # not found"). It is stored once it really compiles (a changed program, a new JAX).
            if by_xla:
                self.save(keys[name], compiled)

        missing = [name for name in slowest_first(names) if out[name] is None]
        # Traced one after another (slowest first), each compiled as soon as traced, side by side.
        made = compile_side_by_side({name: functools.partial(lower, name) for name in missing}, then=store)
        for name, (compiled, by_xla) in made.items():
            out[name] = compiled
            sources.append("compiled" if by_xla else "jax cache")
        log.info("%s: %d programs loaded from %s, %d compiled and stored, %d from JAX's cache (not stored), in %.1f s",
                 format_size(size), sources.count("stored"), self.directory, sources.count("compiled"),
                 sources.count("jax cache"), time.perf_counter() - start)
        return {name: compiled for name, compiled in out.items() if compiled is not None}  # (every one, now)

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.pkl"

    def load(self, key: str, args: Args, devices: Sequence[Device]) -> Program | None:
        """The stored program of `key`, loaded onto `devices`; None (a miss) if there is none or it
        cannot be used, which is logged."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("stored program %s unreadable (%s): compiling it afresh", path, e)
            return None
        try:
            entry = pickle.loads(data)  # noqa: S301 (a directory as trusted as the code: see above)
            if not (isinstance(entry, dict) and entry.get("format") == FORMAT and entry.get("key") == key):
                raise ValueError("not an entry of this format and key")
            if entry["in_tree"] != jax.tree.structure((tuple(args), {})):
                raise ValueError("made for other arguments")
            return deserialize_and_load(entry["executable"], entry["in_tree"], entry["out_tree"],
                                        backend=devices[0].client, execution_devices=list(devices))
        except Exception as e:  # noqa: BLE001 (truncated, corrupt, other devices: all a miss)
            log.warning("stored program %s cannot be used (%s: %s): compiling it afresh", path.name,
                        type(e).__name__, str(e)[:200])
            return None

    def save(self, key: str, compiled: Program) -> None:
        """Store `compiled` under `key` (atomically: a reader sees a whole entry or none); a failure
        is logged, never raised: the program is in memory either way."""
        try:
            executable, in_tree, out_tree = serialize(compiled)
            data = pickle.dumps({"format": FORMAT, "key": key, "executable": executable, "in_tree": in_tree,
                                 "out_tree": out_tree}, protocol=pickle.HIGHEST_PROTOCOL)
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".writing-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self._path(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except Exception as e:  # noqa: BLE001 (a full disk, a backend without serialization)
            log.warning("could not store a compiled program in %s (%s: %s)", self.directory, type(e).__name__, e)
