"""Benchmark workers for compare_reference.py: `workers.py ours|reference --checkpoint DIR ...`.

Each prints one JSON line when ready (compile and first-call times), then answers every `run`
line on stdin with one JSON line holding the latency of one call, until `quit`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

PROMPT, NEGATIVE, GUIDANCE = "a photo of an astronaut riding a horse on the moon", "blurry, low quality", 5.0


def _serve(call, ready: dict) -> None:
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        start = time.perf_counter()
        call()
        print(json.dumps({"latency_s": time.perf_counter() - start}), flush=True)


def ours(args) -> None:
    import jax
    import sdxl_tpu

    size = _size(args)
    began = time.perf_counter()
    pipe = sdxl_tpu.load_pipeline(args.checkpoint, dtype=args.dtype, sizes=[size],
                                  images_per_call=args.images or jax.device_count(),
                                  compile_cache=args.compile_cache, warmup=False, step_progress=False,
                                  compute_dtype=args.compute_dtype)
    loaded = time.perf_counter()
    pipe.warmup()
    compiled = time.perf_counter()
    call = lambda: pipe.generate(PROMPT, NEGATIVE, seed=0, guidance_scale=GUIDANCE, steps=args.steps, size=size)
    call()
    first = time.perf_counter()
    _serve(call, {"load_s": loaded - began, "compile_s": compiled - loaded, "first_call_s": first - loaded,
                  "images": pipe.images_per_call,
                  "size": f"{size[0]}x{size[1]}", "devices": jax.device_count(),
                  "device_kind": jax.devices()[0].device_kind, "versions": _versions("transformers")})


def reference(args) -> None:
    import jax
    import jax.numpy as jnp
    from flax.jax_utils import replicate
    from flax.training.common_utils import shard

    began = time.perf_counter()
    checkpoint = _bin_copy(args.checkpoint)
    from diffusers import FlaxStableDiffusionXLPipeline

    _shapes_only_init_when_converting()

    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    # split_head_dim as the reference recipe (diffusers' examples/research_projects/sdxl_flax) loads it.
    pipeline, params = FlaxStableDiffusionXLPipeline.from_pretrained(checkpoint, from_pt=True, dtype=dtype,
                                                                     split_head_dim=True)
    scheduler_state = params.pop("scheduler")  # the scheduler state stays float32, as the reference does
    # As the reference recipe casts them, but on the host: one eager device cast per parameter
    # shape would compile a program each (minutes before the first call, outside any timing).
    params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), params)
    params["scheduler"] = scheduler_state
    n = args.images or jax.device_count()  # shard() splits them over the devices
    width, height = _size(args)
    prompt_ids = shard(pipeline.prepare_inputs([PROMPT] * n))
    neg_ids = shard(pipeline.prepare_inputs([NEGATIVE] * n))
    p_params = replicate(params)
    rng = jax.random.split(jax.random.PRNGKey(0), jax.device_count())

    def call():
        images = pipeline(prompt_ids, p_params, rng, num_inference_steps=args.steps, height=height, width=width,
                          guidance_scale=GUIDANCE, neg_prompt_ids=neg_ids, jit=True).images
        np.asarray(images)  # wait for, and fetch, the images as ours does

    loaded = time.perf_counter()
    start = time.perf_counter()
    call()  # compiles, then runs
    first = time.perf_counter() - start
    start = time.perf_counter()
    call()
    steady = time.perf_counter() - start
    _serve(call, {"load_s": loaded - began, "compile_s": first - steady, "first_call_s": first, "images": n,
                  "size": f"{width}x{height}", "devices": jax.device_count(),
                  "device_kind": jax.devices()[0].device_kind,
                  "versions": _versions("diffusers", "transformers")})


def _shapes_only_init_when_converting() -> None:
    """diffusers' PyTorch-to-Flax conversion initialises each model op by op for its parameter
    names and shapes (hundreds of small compiles: 60 of 73 s loading the tiny checkpoint on a CPU);
    their abstract shapes say the same. Load time only: no timed figure changes."""
    import jax
    from diffusers.models import modeling_flax_utils as loading  # (it imported the function by name)

    convert = loading.convert_pytorch_state_dict_to_flax

    class ShapesOnly:
        def __init__(self, model):
            self.model = model

        def init_weights(self, rng):
            return jax.eval_shape(self.model.init_weights, rng)

    loading.convert_pytorch_state_dict_to_flax = lambda state, model, *a, **k: convert(state, ShapesOnly(model),
                                                                                       *a, **k)


def _size(args) -> tuple[int, int]:
    width, height = (int(v) for v in args.size.split("x"))
    return width, height


def _bin_copy(checkpoint: str) -> str:
    """diffusers 0.39's Flax from_pt=True reads diffusion_pytorch_model.bin: add it beside the safetensors."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    root = Path(checkpoint)
    for name in ("unet", "vae"):
        target = root / name / "diffusion_pytorch_model.bin"
        if not target.exists():
            torch.save(load_file(str(root / name / "diffusion_pytorch_model.safetensors")), target)
    return str(root)


def _versions(*packages: str) -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in (*packages, "jax", "flax")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["ours", "reference"])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--size", required=True, help="WIDTHxHEIGHT")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile-cache", default=None)
    parser.add_argument("--compute-dtype", default=None)
    parser.add_argument("--images", type=int, default=None, help="images a call (default: one a device)")
    args = parser.parse_args()
    (ours if args.which == "ours" else reference)(args)


if __name__ == "__main__":
    main()
