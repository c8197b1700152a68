"""JAX set-up: which platforms to start, the persistent cache, and a counter that proves nothing
recompiles."""

from __future__ import annotations

import functools
import glob
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.monitoring
from jax.experimental.compilation_cache import compilation_cache


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_CACHE_HITS = "/jax/compilation_cache/cache_hits"
_CACHE_MISSES = "/jax/compilation_cache/cache_misses"


def quiet_platforms(environ: MutableMapping[str, str] | None = None) -> str | None:
    """On a machine without TPU chips, start JAX without its TPU platform.

    jax[tpu] (requirements.txt) installs libtpu, which on a machine without TPU chips logs its
    failed search for them as errors ("could not determine TPU accelerator type", "unexpected
    worker hostname ...") before JAX falls back to the CPU: harmless, but alarming at start-up.
    Where JAX_PLATFORMS is unset, libtpu is installed and no TPU device exists (/dev/accel*,
    /dev/vfio/N), this sets JAX_PLATFORMS to the CPU (with CUDA first where a CUDA plugin is
    installed) and returns it; otherwise it changes nothing and returns None. Call it before JAX
    starts its backends (the first computation or jax.devices()).
    """
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    if (env.get("JAX_PLATFORMS") or env.get("TPU_ACCELERATOR_TYPE")
            or importlib.util.find_spec("libtpu") is None):
        return None
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return None
    cuda = any(importlib.util.find_spec(name) is not None for name in ("jax_cuda13_plugin", "jax_cuda12_plugin"))
    platforms = "cuda,cpu" if cuda else "cpu"
    env["JAX_PLATFORMS"] = platforms
    jax.config.update("jax_platforms", platforms)
    logging.getLogger("sdxl_tpu").info("no TPU chips here: JAX runs on %s (set JAX_PLATFORMS to choose)", platforms)
    return platforms


# The TPU runtime pins this much host memory for transfers when it starts: its default, 4 GiB, took
# 11.0 s to pin on a v5e host without transparent huge pages, 1 GiB 4.9 s (2026-12-06), while 5 GB
# of weights in 25 MB tensors went to the chip in 1.8 s against 0.4 s (256 MiB: 3.6 s, but 8.9 s).
TPU_HOST_BUFFER_BYTES = 1 << 30


def size_tpu_host_buffer(environ: MutableMapping[str, str] | None = None) -> None:
    """Before JAX starts: the TPU runtime's pinned host buffer at TPU_HOST_BUFFER_BYTES unless
    TPU_PREMAPPED_BUFFER_SIZE is set already (a new replica's start is 6 s shorter; see above)."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    env.setdefault("TPU_PREMAPPED_BUFFER_SIZE", str(TPU_HOST_BUFFER_BYTES))


def before_jax_starts() -> None:
    """What every entry point sets before JAX starts its backends: the platforms (quiet_platforms)
    and the TPU runtime's host buffer (size_tpu_host_buffer)."""
    quiet_platforms()
    size_tpu_host_buffer()


# What README says to install on an NVIDIA GPU (jax[tpu] runs there on the CPU without a word).
GPU_UNUSED = ("An NVIDIA GPU is present but JAX runs on the CPU: install jax[cuda13] in place of jax[tpu] "
              "(README, Deploy) to use it.")


def nvidia_gpu_present(root: str = "/") -> bool:
    """Whether an NVIDIA driver and device are on this machine (its device files or the driver's
    /proc entry), whatever JAX sees."""
    return bool(glob.glob(os.path.join(root, "dev/nvidia[0-9]*"))
                or os.path.exists(os.path.join(root, "proc/driver/nvidia/version")))


def gpu_unused(backend: str | None = None, root: str = "/") -> str | None:
    """GPU_UNUSED where JAX computes on the CPU (`backend`: jax.default_backend()) although an
    NVIDIA GPU is present (a GPU Space given requirements.txt's jax[tpu]); else None."""
    backend = jax.default_backend() if backend is None else backend
    return GPU_UNUSED if backend == "cpu" and nvidia_gpu_present(root) else None


def enable_compile_cache(directory: str | os.PathLike | None) -> None:
    """JAX's persistent compilation cache: a restarted server reuses compiled programs."""
    if directory is None:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX decides once per process, at its first compile, whether and where to cache: without a
    # reset, anything compiled before this call (or an earlier directory) would win.
    compilation_cache.reset_cache()


_this_thread = threading.local()


@functools.cache
def _listen_for_cache_hits() -> None:
    def hit(event: str, **kwargs) -> None:
        if event == _CACHE_HITS:  # (recorded in the thread that compiles)
            _this_thread.cache_hits = getattr(_this_thread, "cache_hits", 0) + 1

    jax.monitoring.register_event_listener(hit)


def compile_lowered(lowered: jax.stages.Lowered) -> tuple[jax.stages.Compiled, bool]:
    """`lowered` compiled, and whether XLA compiled it (False: JAX's persistent cache had it)."""
    _listen_for_cache_hits()
    before = getattr(_this_thread, "cache_hits", 0)
    compiled = lowered.compile()
    return compiled, getattr(_this_thread, "cache_hits", 0) == before


def compile_program(name: str, lowered: jax.stages.Lowered) -> tuple[jax.stages.Compiled, bool]:
    """Program `name` compiled as compile_lowered does; its time in the log (what a new replica
    waits for, program by program)."""
    start = time.perf_counter()
    compiled, by_xla = compile_lowered(lowered)
    logging.getLogger("sdxl_tpu").info("%s compiled in %.1f s (%s)", name, time.perf_counter() - start,
                                       "XLA" if by_xla else "JAX's persistent cache")
    return compiled, by_xla


# Host memory one SDXL UNet program's compile takes on a TPU host (9 GiB measured, 2026-12-06: three at
# once peaked at 33.6 GiB of the v5e host's 40). A server with a ControlNet, an IP-Adapter and the
# refiner has eight such programs a size; one a core would ask for 70 GiB.
COMPILE_HOST_BYTES = 10 * 2**30


def compile_workers(available: int | None = None) -> int:
    """Programs compiled at once: one a core on an accelerator, as many as the host's free memory
    holds (`available` bytes: MemAvailable's), one after another on a CPU (see compile_side_by_side)."""
    if jax.default_backend() == "cpu":
        return 1
    available = host_memory_available() if available is None else available
    by_memory = (os.cpu_count() or 1) if available is None else available // COMPILE_HOST_BYTES
    return max(1, min(os.cpu_count() or 1, by_memory))


def host_memory_available() -> int | None:
    """The host's MemAvailable in bytes (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def compile_side_by_side(lowered: Mapping[str, jax.stages.Lowered | Callable[[], jax.stages.Lowered]],
                         workers: int | None = None,
                         then: Callable[[str, jax.stages.Compiled, bool], None] = lambda *a: None
                         ) -> dict[str, tuple[jax.stages.Compiled, bool]]:
    """Each of `lowered` (by name: a program lowered, or a function that lowers it) compiled as
    compile_program does, `workers` at a time (default: compile_workers()); `then(name, compiled,
    by_xla)` in the compiling thread as each is done (storing it, say). An accelerator's compiler
    releases the GIL and compiles a program on one host core, so a size's programs (text encoders,
    denoising loops, decoder) take about as long as the slowest of them; tracing holds the GIL, so the
    programs are lowered here in their order and each compile starts as soon as its program is
    lowered (the first's compile runs while the rest are traced: put the slowest first). XLA's CPU
    compiler is threaded itself: side by side it gained 1.1x on two cores and held every program's
    compile memory at once (a test suite on a 24 GiB machine ran out)."""
    workers = compile_workers() if workers is None else workers

    def lower(program: jax.stages.Lowered | Callable[[], jax.stages.Lowered]) -> jax.stages.Lowered:
        return program() if callable(program) else program

    def compile_one(name: str, program: jax.stages.Lowered) -> tuple[jax.stages.Compiled, bool]:
        compiled, by_xla = compile_program(name, program)
        then(name, compiled, by_xla)
        return compiled, by_xla

    if workers <= 1 or len(lowered) <= 1:
        return {name: compile_one(name, lower(program)) for name, program in lowered.items()}
    with ThreadPoolExecutor(min(len(lowered), workers)) as pool:
        futures = {name: pool.submit(compile_one, name, lower(program)) for name, program in lowered.items()}
        return {name: future.result() for name, future in futures.items()}


class CompileCounter:
    """Counts traces, XLA compilations and persistent-cache hits and misses while active. JAX
    reports a program read from its persistent cache as a backend compile too; `compiles` leaves
    those out (what XLA compiled).

        with CompileCounter() as c:
            ...
        assert c.compiles == 0
    """

    def __init__(self) -> None:
        self._backend = 0
        self.traces = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self._active = False

    def _event(self, event: str, **kwargs: str | int) -> None:
        if self._active and event == _CACHE_HITS:
            self.cache_hits += 1
        elif self._active and event == _CACHE_MISSES:
            self.cache_misses += 1

    def _listener(self, event: str, duration_secs: float, **kwargs: str | int) -> None:
        if not self._active:
            return
        if event == _BACKEND_COMPILE:
            self._backend += 1
        elif event == _TRACE:
            self.traces += 1

    @property
    def compiles(self) -> int:
        return self._backend - self.cache_hits

    def __enter__(self) -> CompileCounter:
        self._active = True
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        jax.monitoring.register_event_listener(self._event)
        return self

    def __exit__(self, *exc) -> None:
        self._active = False
        jax.monitoring.unregister_event_duration_listener(self._listener)
        jax.monitoring.unregister_event_listener(self._event)
