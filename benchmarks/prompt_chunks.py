"""What room for long prompts costs: the same architecture (random weights) compiled with room for
one chunk of 75 tokens and for three (the default), side by side in one process.

    python benchmarks/prompt_chunks.py --architecture small --steps 20 --runs 3 --json

Reports each pipeline's compile time (every program of one size, cold) and, per call, text encoding
and seconds per denoising step for prompts of 1, 2 and 3 chunks (prompt and negative prompt alike),
interleaved so drift on a noisy machine hits each alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdxl_tpu.bench.random_weights import random_models, random_tokenizers  # noqa: E402
from sdxl_tpu.generate.loading import compute_dtype_for  # noqa: E402
from sdxl_tpu.generate.pipeline import Pipeline  # noqa: E402
from sdxl_tpu.models.layers import Precision  # noqa: E402
from sdxl_tpu.sampler.from_config import SCHEDULER_CONFIG, samplers_for  # noqa: E402
from sdxl_tpu.a1111.prompts import chunk_prompt  # noqa: E402
from sdxl_tpu.weights.architectures import architecture_configs  # noqa: E402

WORDS = "a photo of an astronaut riding a horse on the moon, detailed, "


def prompt_of(tokenizer, chunks: int) -> str:
    """A prompt that takes exactly `chunks` chunks."""
    text = "a photo of an astronaut"
    while chunk_prompt(tokenizer, text + WORDS, 8).count <= chunks:
        text += WORDS
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--architecture", "--preset", dest="architecture", default="small",
                        choices=["tiny", "small", "sdxl"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    configs = architecture_configs(args.architecture)
    size = configs["size"]
    precision = Precision.of(compute_dtype_for(args.dtype), args.dtype)
    models, tokenizers = random_models(configs, precision), random_tokenizers()
    samplers = samplers_for(SCHEDULER_CONFIG)[0]
    pipes, compile_s = {}, {}
    for room in (1, 3):
        pipe = Pipeline(models, tokenizers, samplers, sizes=[size], images_per_call=4, step_progress=False,
                        max_prompt_chunks=room)
        start = time.perf_counter()
        pipe.warmup()
        compile_s[room] = time.perf_counter() - start
        pipes[room] = pipe
    prompts = {n: prompt_of(tokenizers[0], n) for n in (1, 2, 3)}
    cases = [(1, 1), (3, 1), (3, 2), (3, 3)]  # (room, chunks used)
    measured = {case: {"text_encoding": [], "s_per_step": []} for case in cases}
    for case in cases:  # a first call of each: allocations, caches
        pipes[case[0]].generate(prompts[case[1]], prompts[case[1]], seed=0, steps=args.steps, size=size)
    for _ in range(args.runs):
        for room, used in cases:
            t = pipes[room].generate(prompts[used], prompts[used], seed=0, steps=args.steps, size=size).timings
            measured[(room, used)]["text_encoding"].append(t["text_encoding"])
            measured[(room, used)]["s_per_step"].append(t["denoising"] / args.steps)
    medians = {f"room {room}, {used} chunk{'s' * (used > 1)}": {k: statistics.median(v) for k, v in m.items()}
               for (room, used), m in measured.items()}
    base = measured[(1, 1)]
    report = {"architecture": args.architecture, "size": f"{size[0]}x{size[1]}", "steps": args.steps, "runs": args.runs,
              "compile_s": {"room 1": compile_s[1], "room 3": compile_s[3]},
              "compile_ratio": compile_s[3] / compile_s[1], "per_call": medians,
              "step_ratio_vs_room_1": {name: m["s_per_step"] / statistics.median(base["s_per_step"])
                                       for name, m in medians.items()},
              "text_encoding_ratio_vs_room_1": {name: m["text_encoding"] / statistics.median(base["text_encoding"])
                                                for name, m in medians.items()}}
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
