"""Helpers that build PyTorch reference models (diffusers / transformers) with random weights, and
measure how far our outputs are from theirs (rel_l2, psnr)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def perturb_norms(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Random init leaves norm weights at 1 and biases at 0; perturb every 1-D tensor so a
    mis-mapped norm or bias cannot go unnoticed."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(scale * torch.randn(p.shape, generator=gen))
    return model.eval()


def fill_zeros(model: torch.nn.Module, seed: int, scale: float) -> torch.nn.Module:
    """A ControlNet starts with zero convolutions: every all-zero parameter given N(0, scale^2)
    values, so that each residual (and each name's mapping) counts."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return model.eval()


def write_controlnet(unet: torch.nn.Module, path, seed: int, scale: float = 0.3):
    """A random ControlNet of `unet`'s shape (diffusers' ControlNetModel.from_unet, its zero
    convolutions filled: fill_zeros) written as diffusers does to `path`; returns the model."""
    from diffusers import ControlNetModel

    torch.manual_seed(seed)
    model = fill_zeros(ControlNetModel.from_unet(unet), seed, scale)
    model.save_pretrained(path)
    return model


def nchw_to_nhwc(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy().transpose(0, 2, 3, 1)


def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


# img2img's and inpainting's parity with diffusers (test_img2img.py, test_inpaint.py): the seed both
# generate with, and the diffusers scheduler each sampler they run is compared with.
SEED = 40

SCHEDULERS = {"Euler": "EulerDiscreteScheduler", "Euler a": "EulerAncestralDiscreteScheduler",
              "DPM++ 2M Karras": "DPMSolverMultistepScheduler"}


def random_model(factory, seed: int = 0, views: bool = False) -> torch.nn.Module:
    """Build a PyTorch model without its (slow) default init and fill it with random weights that
    are exactly representable in float16, so a float16 checkpoint of it equals it.

    Weights ~ N(0, ~1/fan_in); 1-D weights near one and biases near zero, perturbed. Values are
    slices, at random offsets, of one pool of 2^24 normal draws (views: 2^25): drawing SDXL's 2.6 G
    parameters one by one took half a minute, copying takes seconds; each tensor's values are
    still i.i.d. The pool holds float16 values of magnitude 2^-6 or more (smaller draws are zero),
    and a weight matrix is the pool times the power of two nearest 1/sqrt(fan_in): exact in
    float16 without a rounding pass over the model.

    views=True: each weight matrix *is* its slice of the pool (scaled once per power of two), a
    view, not a copy: SDXL's UNet then holds some 0.6 GB, not 10 GB, which on a 2-core VM took 40 s
    just to page in (2026-12-04). For a forward pass and a state dict read tensor by tensor; not for
    save_pretrained, which refuses tensors that share memory.
    """
    with torch.device("meta"):
        model = factory()
    model = model.to_empty(device="cpu")  # (allocated, not touched: views=True replaces the weights)
    gen = torch.Generator().manual_seed(seed)
    # (views: a pool longer than the largest tensor, an up block's 3x3 convolution of 29.5 M)
    pool = torch.randn(1 << (25 if views else 24), generator=gen).half().float()
    pool[pool.abs() < 2.0 ** -6] = 0.0
    scaled: dict[float, torch.Tensor] = {}  # views=True: the pool times each scale, made once
    with torch.no_grad():
        for name, p in list(model.named_parameters()):
            fan_in = int(np.prod(p.shape[1:]))
            # Powers of two from 2^-8 keep every nonzero value at least 2^-14, float16's smallest normal.
            scale = 1.0 if p.ndim == 1 else 2.0 ** max(-8, round(-0.5 * np.log2(fan_in)))
            if views:
                assert p.numel() <= pool.numel(), name
                if scale not in scaled:
                    scaled[scale] = pool * scale
                offset = int(torch.randint(0, pool.numel() - p.numel() + 1, (), generator=gen))
                value = scaled[scale][offset:offset + p.numel()].view(p.shape)
                module, _, attr = name.rpartition(".")
                # (a 1-D tensor gets a copy of its own: it is shifted and scaled below)
                p = torch.nn.Parameter(value.clone() if p.ndim == 1 else value, requires_grad=False)
                setattr(model.get_submodule(module), attr, p)
            else:
                flat = p.view(-1)
                for start in range(0, flat.numel(), pool.numel()):
                    chunk = flat[start:start + pool.numel()]
                    offset = int(torch.randint(0, pool.numel() - chunk.numel() + 1, (), generator=gen))
                    torch.mul(pool[offset:offset + chunk.numel()], scale, out=chunk)
            if p.ndim == 1:  # small tensors: shifted and scaled, then rounded to float16
                p.mul_(0.1).add_(1.0 if name.endswith("weight") else 0.0)
                p.copy_(p.half())
        for name, b in model.named_buffers():
            if name.endswith("position_ids"):
                b.copy_(torch.arange(b.shape[-1]).expand_as(b))
    return model.eval()


def read_with_third_parties(data: bytes, tmp_path) -> dict:
    """What readers nobody here wrote see in an image file: sd-parsers, and for EXIF piexif's
    UserComment.load, A1111's own reading path (piexif.load, then UserComment.load)."""
    import piexif
    import piexif.helper
    from sd_parsers import ParserManager

    path = tmp_path / f"image-{len(data)}"
    path.write_bytes(data)
    info = ParserManager().parse(str(path))
    assert info is not None and info.generator.name == "AUTOMATIC1111", info
    (sampler,) = info.samplers
    out = {"prompt": " ".join(p.value for p in info.prompts),
           "negative": " ".join(p.value for p in info.negative_prompts),
           "sampler": sampler.name, **sampler.parameters, "size": info.metadata.get("Size"),
           "model": sampler.model.name if sampler.model else None,
           "model_hash": sampler.model.hash if sampler.model else None}
    image = Image.open(path)
    if image.format != "PNG":
        comment = piexif.load(image.info["exif"])["Exif"][piexif.ExifIFD.UserComment]
        assert isinstance(comment, bytes)  # (typed BYTE, piexif gives a tuple and A1111's reader fails)
        out["user_comment"] = piexif.helper.UserComment.load(comment)
    return out


# A small SDXL-shaped UNet's diffusers config (three levels, cross-attention at two, SDXL's
# text_time conditioning of a 32-wide pooled text): what the ControlNet's and the IP-Adapter's
# parity tests build both sides from.
SMALL_UNET = dict(down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                  up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                  block_out_channels=[32, 64, 64], layers_per_block=2, transformer_layers_per_block=[1, 1, 2],
                  attention_head_dim=[2, 4, 4], cross_attention_dim=48, norm_num_groups=16, use_linear_projection=True,
                  addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8)
