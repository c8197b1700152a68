"""The VAE's memory per image, whole against tiled (what the generator does above 1024x1024): the
compiled decode and encode of one image of SDXL's VAE, as XLA plans them (its memory analysis:
arguments, outputs and temporaries), without allocating the weights.

    python benchmarks/vae_tiling.py --sizes 1024,1536,2048 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdxl_tpu.models.layers import Precision  # noqa: E402
from sdxl_tpu.generate.sampling import TILED_ABOVE  # noqa: E402
from sdxl_tpu.models.vae import AutoencoderKL, VAEConfig  # noqa: E402
from sdxl_tpu.weights.architectures import architecture_configs  # noqa: E402


def planned_bytes(fn, *args) -> dict[str, float]:
    began = time.perf_counter()
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    temporaries = analysis.temp_size_in_bytes
    return {"temporaries_mb": temporaries / 2**20,
            "peak_mb": (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + temporaries
                        - getattr(analysis, "alias_size_in_bytes", 0)) / 2**20,
            "compile_s": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--architecture", default="sdxl", choices=["tiny", "small", "sdxl"])
    parser.add_argument("--sizes", default="1024,1536,2048", help="square image sides, comma-separated")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    dtype = jnp.dtype(args.dtype)
    config = VAEConfig.from_dict(architecture_configs(args.architecture)["vae"])
    precision = Precision.of(dtype, dtype)
    graph, state = nnx.split(nnx.eval_shape(lambda: AutoencoderKL(config, precision)))
    factor = 2 ** (len(config.block_out_channels) - 1)
    report = {"architecture": args.architecture, "dtype": args.dtype, "device": jax.devices()[0].device_kind,
              "tile": nnx.merge(graph, state).tile_sizes[0], "per_image": {}}
    for side in (int(s) for s in args.sizes.split(",")):
        latents = jax.ShapeDtypeStruct((1, side // factor, side // factor, config.latent_channels), jnp.float32)
        images = jax.ShapeDtypeStruct((1, side, side, 3), jnp.float32)
        call = lambda method: (lambda params, x: getattr(nnx.merge(graph, params), method)(x))
        report["per_image"][f"{side}x{side}"] = {
            "generator_tiles": side > TILED_ABOVE,
            "decode": planned_bytes(call("decode"), state, latents),
            "tiled_decode": planned_bytes(call("tiled_decode"), state, latents),
            "encode": planned_bytes(call("encode"), state, images),
            "tiled_encode": planned_bytes(call("tiled_encode"), state, images),
        }
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
