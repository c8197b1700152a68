"""What the compiler made of attention on this machine's backend, from the optimized HLO.

    python benchmarks/kernels_check.py [--tokens 4096] [--channels 640] [--heads 10]

One SDXL self-attention layer (by default the 64x64 level at 1024x1024: 4096 tokens, 640
channels, 10 heads of 64), bfloat16, batch 2 (classifier-free guidance). Prints one JSON object:
- projection_matmuls: matrix multiplications left for the q/k/v projections of the same tokens
  (3 = XLA kept them apart, 1 = it merged them, so fusing the weights by hand would buy nothing);
- attention_kernels: the fused attention kernels in the compiled layer (cuDNN flash attention on
  NVIDIA GPUs, Pallas splash attention on TPU; none = XLA's own attention).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from sdxl_tpu.models.layers import Attention, Precision  # noqa: E402

_MATMUL = re.compile(r"\bdot\(|custom_call_target=\"__cublas")
_KERNELS = {"cudnn flash attention": "__cudnn$fmha", "pallas (splash attention)": "tpu_custom_call"}


def optimized_hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def check(tokens: int, channels: int, heads: int) -> dict:
    layer = Attention(channels, heads, channels // heads, Precision.of("bfloat16"))
    graph, params = nnx.split(layer)
    x = jnp.ones((2, tokens, channels), jnp.bfloat16)

    def projections(params, x):
        m = nnx.merge(graph, params)
        return m.to_q(x), m.to_k(x), m.to_v(x)

    def whole_layer(params, x):
        return nnx.merge(graph, params)(x)

    layer_hlo = optimized_hlo(whole_layer, params, x)
    return {
        "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
        "tokens": tokens, "channels": channels, "heads": heads,
        "projection_matmuls": len(_MATMUL.findall(optimized_hlo(projections, params, x))),
        "attention_kernels": [name for name, marker in _KERNELS.items() if marker in layer_hlo],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--channels", type=int, default=640)
    parser.add_argument("--heads", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(check(args.tokens, args.channels, args.heads)))


if __name__ == "__main__":
    main()
