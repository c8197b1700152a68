"""Model FLOPs, counted from the traced program (a jaxpr), not from a hand-kept formula.

Only matrix products count, as is usual for model FLOPs (element-wise work such as norms,
activations, softmax and bias additions is left out):
    dot_general:          2 * (elements of the output) * (size of the contracted dimensions)
    conv_general_dilated: 2 * (elements of the output) * kh * kw * (input channels / groups)
Sub-programs (jit, custom_jvp/vjp, shard_map, ...) count once per call, a `scan` body `length`
times, and a `cond` its most expensive branch: the attention kernel is chosen per platform by
a `cond` whose branches compute the same product (XLA's branch has the full count; a Pallas
kernel's body is one block of its grid).

For SDXL base at 1024x1024 this gives 6.76 TFLOP per UNet evaluation per image and 10.47 TFLOP
per VAE decode (tests/models/test_flops.py checks both against PyTorch's FLOP counter over diffusers'
own models); a call with classifier-free guidance does 2 * steps UNet evaluations per image.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from ..models.controlnet import ControlNetConfig, ControlNetModel
from ..models.unet import UNet2DConditionModel, UNetConfig
from ..models.vae import AutoencoderKL, VAEConfig


def jaxpr_flops(jaxpr: Any) -> int:
    """FLOPs of the matrix products in `jaxpr` (a Jaxpr or a ClosedJaxpr), sub-programs included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract_lhs, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract_lhs)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            spec = eqn.params["dimension_numbers"].rhs_spec  # (out, in, spatial...)
            window = math.prod(rhs[d] for d in spec[2:]) * rhs[spec[1]]  # the kernel's in-dim is per group
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * window
        elif name == "cond":  # one branch runs
            total += max(jaxpr_flops(b) for b in eqn.params["branches"])
        elif name == "scan":
            total += eqn.params["length"] * jaxpr_flops(eqn.params["jaxpr"])
        else:
            total += sum(jaxpr_flops(sub) for sub in _sub_jaxprs(eqn))
    return total


def _sub_jaxprs(eqn) -> Iterator[Any]:
    for value in eqn.params.values():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
                yield v.jaxpr
            elif hasattr(v, "eqns"):
                yield v


def function_flops(fn: Callable, *args: Any) -> int:
    """FLOPs of one call of `fn` on `args` (arrays or jax.ShapeDtypeStruct); nothing is computed."""
    return jaxpr_flops(jax.make_jaxpr(fn)(*args))


def _abstract(x: Any) -> Any:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def module_flops(model: nnx.Module, method: str, *args: Any) -> int:
    """FLOPs of `model.method(*args)`, for concrete and abstract (nnx.eval_shape) models alike."""
    graph, state = nnx.split(model)
    return function_flops(lambda st, *a: getattr(nnx.merge(graph, st), method)(*a),
                          jax.tree.map(_abstract, state), *args)


def model_flops(unet_config: dict[str, Any], vae_config: dict[str, Any], size: tuple[int, int]) -> dict[str, int]:
    """FLOPs of one UNet evaluation, of the part of it a call does once for all its steps (the
    cross-attention's keys and values of the text: "unet_cross_kv") and of one VAE decode, for one
    image of `size` (width, height), from the components' config.json contents (the models are
    built abstractly: no weights)."""
    unet = nnx.eval_shape(lambda: UNet2DConditionModel(UNetConfig.from_dict(unet_config)))
    vae = nnx.eval_shape(lambda: AutoencoderKL(VAEConfig.from_dict(vae_config)))
    w, h = size
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    c = unet.config
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    latent = f32(1, h // factor, w // factor, c.in_channels)
    context = f32(1, 77, c.cross_attention_dim[0])
    pooled = f32(1, c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim)
    return {"unet": module_flops(unet, "__call__", latent, f32(1), context, pooled, f32(1, 6)),
            "unet_cross_kv": module_flops(unet, "cross_kv", context),
            "vae_decode": module_flops(vae, "decode", latent)}


def controlnet_flops(config: ControlNetConfig, size: tuple[int, int], vae_factor: int) -> int:
    """FLOPs of one ControlNet evaluation for one image of `size` (width, height)."""
    net = nnx.eval_shape(lambda: ControlNetModel(config))
    c, (w, h) = config.unet, size
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    pooled = f32(1, c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim)
    return module_flops(net, "__call__", f32(1, h // vae_factor, w // vae_factor, c.in_channels), f32(1),
                        f32(1, 77, c.cross_attention_dim[0]), pooled, f32(1, 6),
                        f32(1, h, w, config.conditioning_channels), f32(1, config.residuals))


# Dense bf16 peak per device, TFLOP/s (datasheets), for utilisation.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0,
               "TPU v4": 275.0, "TPU v5p": 459.0, "TPU v6 lite": 918.0}


def peak_tflops(device: Any) -> float | None:
    kind = getattr(device, "device_kind", "")
    for name, tflops in PEAK_TFLOPS.items():
        if name.lower() in kind.lower():
            return tflops
    return None
