"""What an upscaler model costs (issue 54, item 6): A1111's published networks' shapes with random
weights (R-ESRGAN 4x+: RRDBNet, 23 blocks; R-ESRGAN General 4xV3: the compact SRVGG net), one image
upscaled 4x in tiles (generate/upscaling.py), for each number of tiles a batch: the compile, then
the median of a few runs.

    python benchmarks/upscaler.py --size 1024 --batches 4,8 --json          # on the chip: tpu.sh upscale
    python benchmarks/upscaler.py --size 64 --batches 2 --blocks 1 --json   # a quick check on a CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdxl_tpu.bench.random_weights import random_fill  # noqa: E402
from sdxl_tpu.generate.upscaling import TiledUpscaler  # noqa: E402
from sdxl_tpu.models.esrgan import RRDBConfig, SRVGGConfig, build_upscaler  # noqa: E402
from sdxl_tpu.models.layers import Precision  # noqa: E402


def measure(config, name: str, size: int, batch: int, precision: Precision, runs: int) -> dict:
    model = random_fill(nnx.eval_shape(lambda: build_upscaler(config, precision)), seed=1)
    upscaler = TiledUpscaler(model, name, batch=batch)
    began = time.perf_counter()
    upscaler.warm()
    compile_s = time.perf_counter() - began
    image = np.random.default_rng(0).integers(0, 256, (size, size, 3), np.uint8)
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        out = upscaler.run(image)
        seconds.append(time.perf_counter() - began)
    return {"model": name, "size": size, "out": list(out.shape[:2]), "tiles_a_batch": batch, "compile_s": compile_s,
            "s_an_image": statistics.median(seconds), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1024, help="the square image's side, in pixels")
    parser.add_argument("--batches", default="4,8", help="tiles a batch, comma-separated")
    parser.add_argument("--blocks", type=int, default=23, help="RRDBNet's blocks (23: R-ESRGAN 4x+)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    precision = Precision.of(args.dtype, args.dtype)
    models = [(RRDBConfig(num_blocks=args.blocks), "R-ESRGAN 4x+"),
              (SRVGGConfig(num_conv=32), "R-ESRGAN General 4xV3")]
    rows = [measure(config, name, args.size, int(batch), precision, args.runs)
            for config, name in models for batch in args.batches.split(",")]
    report = {"device_kind": jax.devices()[0].device_kind, "dtype": args.dtype, "rows": rows}
    if args.json:
        print(json.dumps(report))
    else:
        for r in rows:
            print(f"{r['model']}: {r['size']}px -> {r['out'][1]}px, {r['tiles_a_batch']} tiles a batch: "
                  f"{r['s_an_image']:.3f} s an image (compile {r['compile_s']:.1f} s)")


if __name__ == "__main__":
    main()
