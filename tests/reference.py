"""Helpers that build PyTorch reference models (diffusers / transformers) with random weights."""

from __future__ import annotations

import numpy as np
import torch


def perturb_norms(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Random init leaves norm weights at 1 and biases at 0; perturb every 1-D tensor so a
    mis-mapped norm or bias cannot go unnoticed."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(scale * torch.randn(p.shape, generator=gen))
    return model.eval()


def nchw_to_nhwc(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy().transpose(0, 2, 3, 1)


def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def random_model(factory, seed: int = 0) -> torch.nn.Module:
    """Build a PyTorch model without its (slow) default init and fill it with random weights that
    are exactly representable in float16, so a float16 checkpoint of it equals it.

    Weights ~ N(0, 1/fan_in); 1-D weights near one and biases near zero, perturbed.
    """
    with torch.device("meta"):
        model = factory()
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("position_ids"):
                b.copy_(torch.arange(b.shape[-1]).expand_as(b))
    return model.eval()
