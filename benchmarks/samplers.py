"""What each sampler, schedule type and noise source costs per step: one pipeline (random
weights), every case interleaved in each round so drift on a noisy machine hits each alike.

    python benchmarks/samplers.py --architecture small --steps 20 --runs 3 --json

Samplers are tables for one compiled update, so every sampler on every schedule runs the same
program: their seconds per model evaluation should agree within noise (DPM++ SDE evaluates the
model twice a step, so its steps should cost twice). RNG CPU draws each image's noise on
the host with PyTorch's CPU generator (torch_rng.py) and, for a noisy sampler, hands it over
before each step; its cost per call is reported against JAX's noise on the same sampler, and the
host draw alone at SDXL's latent size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdxl_tpu.bench.random_weights import random_pipeline  # noqa: E402
from sdxl_tpu.generate.loading import compute_dtype_for  # noqa: E402
from sdxl_tpu.models.layers import Precision  # noqa: E402
from sdxl_tpu.sampler.torch_rng import TorchCPUGenerator  # noqa: E402
from sdxl_tpu.weights.architectures import architecture_configs  # noqa: E402

CASES = [  # (sampler, schedule type, RNG)
    ("Euler", "Checkpoint", "JAX"), ("Euler a", "Checkpoint", "JAX"), ("DPM++ 2M", "Checkpoint", "JAX"),
    ("DPM++ 2M SDE", "Checkpoint", "JAX"), ("DDIM", "Checkpoint", "JAX"), ("LCM", "Checkpoint", "JAX"),
    ("Euler", "Uniform", "JAX"), ("DPM++ 2M", "Karras", "JAX"), ("DPM++ 2M SDE", "Exponential", "JAX"),
    ("Euler", "Uniform", "CPU"), ("Euler a", "Uniform", "JAX"), ("Euler a", "Uniform", "CPU"),
    ("DPM++ 2M SDE", "Karras", "CPU"), ("DPM++ SDE", "Checkpoint", "JAX"), ("DPM++ SDE", "Karras", "JAX"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--architecture", "--preset", dest="architecture", default="small",
                        choices=["tiny", "small", "sdxl"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stepwise", action="store_true", help="one program per step (the playground's loop)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--sampler", action="append", help="only the cases of this sampler (repeatable); "
                        "Euler on the checkpoint's schedule, the reference, always runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.sampler or c[0] in args.sampler or c == ("Euler", "Checkpoint", "JAX")]

    size = architecture_configs(args.architecture)["size"]
    precision = Precision.of(compute_dtype_for(args.dtype), args.dtype)
    pipe = random_pipeline(args.architecture, precision, sizes=[size], images_per_call=4, step_progress=args.stepwise)
    pipe.warmup()
    call = lambda sampler, schedule, rng: pipe.generate("a lighthouse in a storm", "blurry", seed=1, steps=args.steps,
                                                        size=size, sampler=sampler, schedule=schedule, rng=rng).timings
    for case in cases:  # a first call of each: allocations, caches
        call(*case)
    measured = {case: {"denoising": [], "total": []} for case in cases}
    for _ in range(args.runs):
        for case in cases:
            timings = call(*case)
            for key, values in measured[case].items():
                values.append(timings[key])
    median = {case: statistics.median(v["denoising"]) for case, v in measured.items()}
    total = {case: statistics.median(v["total"]) for case, v in measured.items()}
    euler = median[("Euler", "Checkpoint", "JAX")]
    name = lambda case: f"{case[0]} / {case[1]} / {case[2]}"
    # The host's part alone: 4 images' noise at SDXL's 1024x1024 latents, initial + one per step.
    draws = []
    for _ in range(5):
        generators = [TorchCPUGenerator(s) for s in range(4)]
        start = time.perf_counter()
        for _ in range(1 + args.steps):
            for g in generators:
                g.randn((4, 128, 128))
        draws.append(time.perf_counter() - start)
    report = {
        "architecture": args.architecture, "size": f"{size[0]}x{size[1]}", "steps": args.steps, "runs": args.runs,
        "loop": "stepwise" if args.stepwise else "fused",
        "s_per_step": {name(c): m / args.steps for c, m in median.items()},
        "step_ratio_vs_euler": {name(c): m / euler for c, m in median.items()},
        # Per model evaluation (table row): DPM++ SDE evaluates the model twice a step but the last.
        "evaluation_ratio_vs_euler": {name(c): m / euler * args.steps / pipe.samplers[c[0]].step_ends(args.steps)[-1]
                                      for c, m in median.items()},
        "cpu_noise_s_per_call": {  # the whole call's time, RNG CPU minus JAX (the samplers measured)
            what: total[(sampler, "Uniform", "CPU")] - total[(sampler, "Uniform", "JAX")]
            for what, sampler in (("Euler (initial noise only)", "Euler"),
                                  ("Euler a (initial + every step)", "Euler a"))
            if (sampler, "Uniform", "CPU") in total},
        "total_s": {name(c): m for c, m in total.items()},
        "host_draw_s_sdxl_4_images": statistics.median(draws),
    }
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
