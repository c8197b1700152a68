"""How long one pipeline program takes to trace, lower and compile, cold, per attention setting: the
quick way to work on a new replica's start (each program's compile is what its first image waits
for) without compiling everything. Random weights of an architecture, nothing read.

    python benchmarks/program_compile.py --programs decode --attention xla,auto          # SDXL, 1024x1024
    python benchmarks/program_compile.py --architecture tiny --size 64x64 --programs decode,encode

One line each: program, attention, seconds lowering (tracing included) and compiling; --json: one
JSON line at the end. Each compile is XLA's (the persistent cache is not set here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="sdxl")
    parser.add_argument("--size", default="1024x1024")
    parser.add_argument("--images", type=int, default=1, help="images a call")
    parser.add_argument("--programs", default="decode", help="comma-separated: encode, denoise, decode, ...")
    parser.add_argument("--attention", default="auto", help="comma-separated attention settings: auto, xla")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax

    from sdxl_tpu.bench.random_weights import random_pipeline
    from sdxl_tpu.models.layers import Precision
    from sdxl_tpu.request.values import parse_size

    size = parse_size(args.size)
    dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    rows = []
    for attention in args.attention.split(","):
        pipe = random_pipeline(args.architecture, Precision.of(dtype, dtype, attention=attention), sizes=[size],
                               images_per_call=args.images)
        for name in args.programs.split(","):
            start = time.perf_counter()
            lowered = pipe.trace(name, size).lower()
            lowering = time.perf_counter() - start
            start = time.perf_counter()
            lowered.compile()
            rows.append({"program": name, "attention": attention, "lower_s": round(lowering, 2),
                         "compile_s": round(time.perf_counter() - start, 2)})
            print(f"{name:<18} attention {attention:<5} lowered in {rows[-1]['lower_s']:6.1f} s, "
                  f"compiled in {rows[-1]['compile_s']:6.1f} s", file=sys.stderr, flush=True)
        del pipe
    if args.json:
        print(json.dumps({"size": args.size, "images": args.images, "platform": jax.devices()[0].device_kind,
                          "programs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
