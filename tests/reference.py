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
