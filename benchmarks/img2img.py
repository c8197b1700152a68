"""What starting from an image costs: img2img at a denoising strength against text to image, and a
hires fix (A1111's, Latent upscaler, its default strength 0.7) against text to image at the size and
at the upscaled size; one pipeline (random weights), the cases interleaved in each round so drift on
a noisy machine hits each alike.

    python benchmarks/img2img.py --architecture small --steps 20 --runs 5 --hires 1.5 --json

At strength s a call runs int(s * steps) of the steps (diffusers' count, the checkpoint's
schedule) and encodes the image once with the VAE: expect the denoising time times s, plus the
encode, against text to image. A hires fix runs the steps at the size, then int(0.7 * steps) at
the upscaled size (no decode, no encode between: the latents are upscaled).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdxl_tpu.bench.random_weights import random_pipeline  # noqa: E402
from sdxl_tpu.generate.loading import compute_dtype_for  # noqa: E402
from sdxl_tpu.models.layers import Precision  # noqa: E402
from sdxl_tpu.imaging.hires import upscaled_size  # noqa: E402
from sdxl_tpu.weights.architectures import architecture_configs  # noqa: E402

PROMPT, NEGATIVE = "a lighthouse in a storm", "blurry"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--architecture", default="small", choices=["tiny", "small", "sdxl"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--strengths", default="0.5,1.0", help="comma-separated denoising strengths")
    parser.add_argument("--hires", type=float, default=None, help="also a hires fix by this upscale (e.g. 1.5)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    size = architecture_configs(args.architecture)["size"]
    larger = upscaled_size(size, args.hires) if args.hires else None
    precision = Precision.of(compute_dtype_for(args.dtype), args.dtype)
    pipe = random_pipeline(args.architecture, precision, sizes=[size] + ([larger] if larger else []),
                           images_per_call=4, step_progress=False)
    pipe.warmup()
    image = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), np.uint8)
    # None: text to image; a number: img2img at that strength; "hires": the hires fix; "larger":
    # text to image at the upscaled size.
    cases = [None, *(float(s) for s in args.strengths.split(","))] + (["hires", "larger"] if larger else [])

    def call(case):
        common = dict(seed=1, steps=args.steps, sampler="Euler")
        if case == "hires":
            request = pipe.request(PROMPT, NEGATIVE, size=size, hires=True, hires_scale=args.hires, **common)
        elif case == "larger":
            request = pipe.request(PROMPT, NEGATIVE, size=larger, **common)
        else:
            request = pipe.request(PROMPT, NEGATIVE, size=size, image=None if case is None else image, strength=case,
                                   **common)
        return pipe.run(request).timings

    for case in cases:  # a first call of each: allocations, caches
        call(case)
    measured = {case: [] for case in cases}
    for _ in range(args.runs):
        for case in cases:
            measured[case].append(call(case))
    median = {case: {key: statistics.median(t[key] for t in runs) for key in runs[0]}
              for case, runs in measured.items()}
    base = median[None]
    name = lambda case: ("text to image" if case is None else f"hires fix {args.hires:g}x" if case == "hires" else
                         f"text to image at {larger[0]}x{larger[1]}" if case == "larger" else f"img2img {case:g}")
    report = {
        "architecture": args.architecture, "size": f"{size[0]}x{size[1]}", "steps": args.steps, "runs": args.runs,
        "dtype": args.dtype, "device": str(pipe.mesh.devices.flat[0].device_kind),
        "median_s": {name(c): m for c, m in median.items()},
        "denoising_ratio_vs_text_to_image": {name(c): m["denoising"] / base["denoising"] for c, m in median.items()},
        "total_ratio_vs_text_to_image": {name(c): m["total"] / base["total"] for c, m in median.items()},
        "steps_run": {name(c): args.steps if c in (None, "larger") else args.steps + int(0.7 * args.steps)
                      if c == "hires" else max(1, int(c * args.steps)) for c in cases},
    }
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
