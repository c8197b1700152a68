"""How long pipeline programs take to trace, lower and compile, cold, per attention setting and size:
the quick way to work on a new replica's start (each program's compile is what its first image waits
for) without compiling everything. Random weights of an architecture, nothing read.

    python benchmarks/program_compile.py --programs decode --attention xla,auto          # SDXL, 1024x1024
    python benchmarks/program_compile.py --architecture tiny --size 64x64 --programs decode,encode
    python benchmarks/program_compile.py --programs denoise --sizes sdxl --workers 4 --store /tmp/p
    python benchmarks/program_compile.py --programs denoise --sizes sdxl --workers 4 --load /tmp/p

One line each: program, size, attention, seconds lowering (tracing included) and compiling, and the
program's device memory (XLA's memory analysis: arguments, outputs, temporaries); --json: one JSON
line at the end. Each compile is XLA's (the persistent cache is not set here). --workers: compile
that many programs at once (as a server compiles a size's programs); --store: serialize each into
that folder; --load: instead of compiling, read each from that folder (a restart's cost per program).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def device_memory(compiled) -> dict:
    analysis = compiled.memory_analysis()
    gib = lambda name: round(getattr(analysis, name, 0) / 2**30, 3) if analysis else None  # noqa: E731
    return {"arguments_gib": gib("argument_size_in_bytes"), "outputs_gib": gib("output_size_in_bytes"),
            "temporaries_gib": gib("temp_size_in_bytes")}


def first_loads() -> dict:
    """Seconds a process's first program takes apart from any of ours: a trivial one compiled and run
    (the runtime's start), then a trivial one and a small splash-kernel one serialized and read back
    (what a first load costs by itself: a restart's first stored UNet took ~17 s more than the rest)."""
    import jax
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    from sdxl_tpu.models.attention import attention

    seconds = {}

    def timed(name: str, fn) -> None:
        start = time.perf_counter()
        fn()
        seconds[name] = round(time.perf_counter() - start, 2)

    timed("first_program_s", lambda: jax.block_until_ready(jax.jit(lambda x: x + 1)(1.0)))
    trivial = jax.jit(lambda x: x * 2).lower(1.0).compile()
    timed("first_load_s", lambda: deserialize_and_load(*serialize(trivial)))
    q = jax.numpy.zeros((1, 1024, 1, 64), jax.numpy.bfloat16)
    kernel = jax.jit(lambda q: attention(q, q, q)).lower(q).compile()
    timed("first_kernel_load_s", lambda: deserialize_and_load(*serialize(kernel)))
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="sdxl")
    parser.add_argument("--size", default="1024x1024")
    parser.add_argument("--sizes", help="comma-separated sizes, or sdxl for its nine (instead of --size)")
    parser.add_argument("--images", type=int, default=1, help="images a call")
    parser.add_argument("--programs", default="decode", help="comma-separated: encode, denoise, decode, ...")
    parser.add_argument("--attention", default="auto", help="comma-separated attention settings: auto, xla")
    parser.add_argument("--workers", type=int, default=1, help="programs compiled (or loaded) at once")
    parser.add_argument("--store", help="serialize each compiled program into this folder")
    parser.add_argument("--load", help="read each program from this folder (written by --store) instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    from sdxl_tpu.bench.random_weights import random_pipeline
    from sdxl_tpu.models.layers import Precision
    from sdxl_tpu.request.values import format_size
    from sdxl_tpu.server.settings import parse_sizes

    sizes = parse_sizes(args.sizes or args.size)
    probes = first_loads()
    dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    rows = []
    start_all = time.perf_counter()
    for kernel in args.attention.split(","):
        pipe = random_pipeline(args.architecture, Precision.of(dtype, dtype, attention=kernel), sizes=sizes,
                               images_per_call=args.images)
        start = time.perf_counter()
        jax.block_until_ready(pipe.params)  # (the weights are made asynchronously: apart from any program's time)
        weights_wait_s = round(time.perf_counter() - start, 2)
        jobs = [(name, size) for size in sizes for name in args.programs.split(",")]

        def build(job: tuple[str, tuple[int, int]], lowered, lowering: float, kernel: str = kernel) -> dict:
            name, size = job
            row = {"program": name, "size": format_size(size), "attention": kernel, "lower_s": round(lowering, 2)}
            file = Path(args.store or args.load or ".") / f"{name}-{format_size(size)}-{kernel}.pickle"
            start = time.perf_counter()
            if args.load:
                executable, in_tree, out_tree = pickle.loads(file.read_bytes())
                compiled = deserialize_and_load(executable, in_tree, out_tree)
                row["load_s"] = round(time.perf_counter() - start, 2)
            else:
                compiled = lowered.compile()
                row["compile_s"] = round(time.perf_counter() - start, 2)
                if args.store:
                    start = time.perf_counter()
                    file.parent.mkdir(parents=True, exist_ok=True)
                    file.write_bytes(pickle.dumps(serialize(compiled)))
                    row["store_s"] = round(time.perf_counter() - start, 2)
            row.update(device_memory(compiled))
            print(json.dumps(row), file=sys.stderr, flush=True)
            return row

        with ThreadPoolExecutor(max(1, args.workers)) as pool:
            futures = []
            for job in jobs:  # traced here (tracing holds the GIL), compiled in the pool as each is ready
                start = time.perf_counter()
                lowered = None if args.load else pipe.trace(*job).lower()
                futures.append(pool.submit(build, job, lowered, time.perf_counter() - start))
            rows += [future.result() for future in futures]
        probes[f"weights_wait_s_{kernel}"] = weights_wait_s
        del pipe
    if args.json:
        print(json.dumps({"sizes": [format_size(s) for s in sizes], "images": args.images, "workers": args.workers,
                          **probes,
                          "platform": jax.devices()[0].device_kind, "wall_s": round(time.perf_counter() - start_all, 1),
                          "programs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
