"""Time to the first image of a new server, in its own process and in-process (a machine that
opens no TCP sockets measures it too): the app's engine loads the model, compiles what a first
call runs, serves one text-to-image call at the first size, and compiles the rest behind it.

    python benchmarks/first_image.py --architecture sdxl --sizes 1024x1024 --restart
    python benchmarks/first_image.py --model tiny --sizes 64x64,96x64 --restart --json

Seconds from the process's start: "imports", "loaded" (the weights in, while the first call's
programs compile), "ready" (those programs compiled), "first image" (that call's images made),
"everything" (every program of every size); with the seconds each program took to compile, and how
many XLA compiled. --architecture: random weights of that architecture (what `bench --random-weights`
runs); --model: the app's own loader.
--restart starts the same measurement again in a new process on the programs the first stored
(the compilation cache's directory, a temporary one unless --compile-cache names it).
"""

from __future__ import annotations

import time

START = time.perf_counter()  # (importing JAX and the package counts: a new replica pays for it)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdxl_tpu.server.settings import parse_sizes  # noqa: E402

PROGRAM_LINE = re.compile(r"^(\w+) compiled in ([\d.]+) s \((XLA|JAX's persistent cache)\)$")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.when: dict[str, Callable[[], Any]] = {}  # a message's start -> what to do as it is logged

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        for start, then in self.when.items():
            if record.getMessage().startswith(start):
                then()
        print(record.getMessage(), file=sys.stderr, flush=True)  # (kept in the log if the run fails later)


def measure(args: argparse.Namespace) -> dict:
    from sdxl_tpu.server.core import Server
    from sdxl_tpu.server.events import Done
    from sdxl_tpu.server.files import ImageStore
    from sdxl_tpu.generate.loading import load
    from sdxl_tpu.server.local_engine import compile_first, first_guided, prepare_process
    from sdxl_tpu.server.settings import Settings
    from sdxl_tpu.request.load import LoadOptions
    from sdxl_tpu.request.values import format_size

    sizes = parse_sizes(args.sizes)
    options = LoadOptions(model=args.model or args.architecture, sizes=sizes, images_per_call=args.images,
                          dtype=args.dtype)
    settings = Settings(load=options, compile_cache=args.compile_cache)
    prepare_process(settings)
    lines = Lines()
    logging.getLogger("sdxl_tpu").addHandler(lines)
    logging.getLogger("sdxl_tpu").setLevel(logging.INFO)
    seconds: dict[str, float] = {}
    lines.when["weights read in"] = lambda: seconds.setdefault("loaded", time.perf_counter() - START)
    guided = first_guided(settings)

    def loader(s):  # the app's load_and_compile_first, random weights allowed
        first = lambda pipe: compile_first(pipe, guided=guided)  # noqa: E731
        if args.architecture:
            return random_pipeline(args.architecture, s, first)
        return load(s.load, warmup=False, compile_cache=s.compile_cache, first=first)

    images = tempfile.mkdtemp(prefix="sdxl-first-image-")
    server = Server(settings, loader=loader, images=ImageStore(Path(images)))
    seconds["imports"] = time.perf_counter() - START
    server.warmup.load()
    if server.warmup.status != "ready":
        raise SystemExit(f"not ready: {server.warmup.message}")
    seconds["ready"] = time.perf_counter() - START
    form = dict(prompt="a photograph of an astronaut riding a horse", negative="", style="(No style)", seed=1,
                randomize=False, guidance=5.0, steps=args.steps, size=format_size(sizes[0]), sampler=None,
                schedule=None, rng=None)
    updates = list(server.stream(form, previews=False))
    if not isinstance(updates[-1], Done):
        raise SystemExit(f"the first call failed: {updates[-1]}")
    seconds["first_image"] = time.perf_counter() - START
    server.warmup.compiled_event.wait()
    seconds["everything"] = time.perf_counter() - START
    server.engine.batcher.close()
    programs = [m.groups() for m in map(PROGRAM_LINE.match, lines.lines) if m]
    return {"seconds": seconds, "compiles": server.engine.compiles(),
            "programs_loaded": server.engine.programs_loaded(),
            "programs": [{"name": name, "seconds": float(s), "by": by} for name, s, by in programs],
            "sizes": [format_size(s) for s in sizes], "platform": _platform()}


def random_pipeline(architecture: str, settings, first):
    """The app's pipeline with random weights of `architecture` (bench's), stored programs kept;
    `first(pipeline)` while the weights are made."""
    from sdxl_tpu.bench.random_weights import random_pipeline as random
    from sdxl_tpu.generate.loading import compute_dtype_for
    from sdxl_tpu.generate.compiling.stored_programs import ProgramStore
    from sdxl_tpu.models.layers import Precision

    o = settings.load
    precision = Precision.of(compute_dtype_for(o.dtype, o.compute_dtype), o.dtype, attention=o.attention)
    return random(architecture, precision, first, sizes=o.sizes, images_per_call=o.images_per_call,
                  step_progress=o.step_progress, program_store=ProgramStore.beside(settings.compile_cache))


def _platform() -> str:
    import jax

    return f"{jax.default_backend()} ({jax.devices()[0].device_kind} x{jax.device_count()})"


def format_report(name: str, r: dict) -> str:
    s = r["seconds"]
    out = [f"{name}: ready {s['ready']:.1f} s, first image {s['first_image']:.1f} s, everything "
           f"{s['everything']:.1f} s (imports {s['imports']:.1f} s, weights loaded at {s['loaded']:.1f} s); "
           f"{r['compiles']} compiled by XLA, "
           f"{r['programs_loaded']} loaded from the store; {r['platform']}, {', '.join(r['sizes'])}"]
    out += [f"    {p['name']:<18} {p['seconds']:7.1f} s  {p['by']}" for p in r["programs"]]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--model", help="a checkpoint, as the app's --model (tiny: the built-in one)")
    what.add_argument("--architecture", help="random weights of this architecture (default: sdxl, without --model)")
    parser.add_argument("--sizes", default="1024x1024", help="as the app's --sizes; the first call is at the first")
    parser.add_argument("--images", type=int, default=4, help="images a call (the app's default 4)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compile-cache", help="where programs are stored (default: a new temporary directory)")
    parser.add_argument("--restart", action="store_true", help="then again, in a new process, from what was stored")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args()
    args.architecture = args.architecture or (None if args.model else "sdxl")
    args.compile_cache = args.compile_cache or tempfile.mkdtemp(prefix="sdxl-first-image-cache-")
    if not args.restart:
        reports = {"this start": measure(args)}
    else:  # each start a process of its own: one process at a time can hold a TPU chip
        argv = [a for a in sys.argv[1:] if a != "--restart"]
        if "--compile-cache" not in argv:
            argv += ["--compile-cache", args.compile_cache]
        reports = {}
        for name in ("cold", "restart"):
            run = subprocess.run([sys.executable, __file__, *argv, "--json"], stdout=subprocess.PIPE, text=True)
            if run.returncode:
                raise SystemExit(f"the {name} start failed (its log is above)")
            reports[name] = json.loads(run.stdout.strip().splitlines()[-1])["this start"]
            print(f"{name}: {json.dumps(reports[name])}", file=sys.stderr, flush=True)
    print(json.dumps(reports) if args.json else "\n".join(format_report(k, r) for k, r in reports.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
