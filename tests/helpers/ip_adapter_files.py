"""Random IP-Adapters and image encoders written as the published files are: the adapter in the
original IP-Adapter's names and numbering (.safetensors or torch's .bin), the encoder as a
transformers CLIPVisionModelWithProjection folder (test_ip_adapter.py, test_ip_adapter_pipeline.py)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

# ViT-H/14 and ViT-bigG/14 at a small width: 4 x 4 patches and the class token (image_size 56); a
# pipeline's at the published 224 (CLIPImageProcessor's crop).
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=56,
              patch_size=14, projection_dim=24)
# The plus adapter's resampler as diffusers builds it from a file: heads of 64, 4 layers, feed-forward 4x.
PLUS = dict(hidden=128, heads=2, queries=6, depth=4)


def randn(gen, *shape, scale=None):
    return torch.randn(shape, generator=gen) * (scale if scale is not None else shape[-1] ** -0.5)


def norm(gen, prefix: str, dim: int) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": 1 + randn(gen, dim, scale=0.1), f"{prefix}.bias": randn(gen, dim, scale=0.1)}


def adapter_state(unet, plus: bool, embed_dim: int, seed: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    """A random IP-Adapter for diffusers' `unet`, in the original IP-Adapter's names and numbering
    (attention processors counted in diffusers' attn_processors order, the cross-attentions 1, 3, 5...)."""
    gen = torch.Generator().manual_seed(seed)
    width = unet.config.cross_attention_dim
    if plus:
        h, inner = PLUS["hidden"], PLUS["heads"] * 64
        proj = {"latents": randn(gen, 1, PLUS["queries"], h), "proj_in.weight": randn(gen, h, embed_dim),
                "proj_in.bias": randn(gen, h, scale=0.1), "proj_out.weight": randn(gen, width, h),
                "proj_out.bias": randn(gen, width, scale=0.1), **norm(gen, "norm_out", width)}
        for i in range(PLUS["depth"]):
            proj.update({**norm(gen, f"layers.{i}.0.norm1", h), **norm(gen, f"layers.{i}.0.norm2", h),
                         f"layers.{i}.0.to_q.weight": randn(gen, inner, h),
                         f"layers.{i}.0.to_kv.weight": randn(gen, 2 * inner, h),
                         f"layers.{i}.0.to_out.weight": randn(gen, h, inner), **norm(gen, f"layers.{i}.1.0", h),
                         f"layers.{i}.1.1.weight": randn(gen, 4 * h, h),
                         f"layers.{i}.1.3.weight": randn(gen, h, 4 * h)})
    else:
        proj = {"proj.weight": randn(gen, 4 * width, embed_dim), "proj.bias": randn(gen, 4 * width, scale=0.1),
                **norm(gen, "norm", width)}
    layers = {}
    cross = [name[:-len(".processor")] for name in unet.attn_processors if name.endswith("attn2.processor")]
    for j, name in enumerate(cross):
        inner = unet.get_submodule(name).to_k.out_features
        for part in ("to_k_ip", "to_v_ip"):
            layers[f"{2 * j + 1}.{part}.weight"] = randn(gen, inner, width)
    return {"image_proj": proj, "ip_adapter": layers}


def write_adapter(state, path):
    if path.suffix == ".bin":
        torch.save(state, path)
    else:
        save_file({f"{part}.{k}": v.contiguous() for part, d in state.items() for k, v in d.items()}, str(path))
    return path




def write_image_encoder(path, seed: int = 0, **config):
    """A random transformers CLIPVisionModelWithProjection (VISION's sizes, `config` changing them)
    saved at `path` (norms perturbed: not the identity they start as); returns it."""
    import transformers
    from reference import perturb_norms

    torch.manual_seed(seed)
    model = perturb_norms(transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(
        **{**VISION, **config})))
    model.save_pretrained(path)
    return model
