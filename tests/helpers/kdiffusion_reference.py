"""k-diffusion's samplers and denoiser wrappers as the reference, imported on their own.

The package's __init__ imports its training and evaluation code (clean-fid, CLIP, wandb), and
k_diffusion.utils imports torchvision for image helpers the samplers never call; neither is
installed here (PyPI offers torchvision only as a CUDA build). So the parent package is made an
empty namespace and torchvision a placeholder for the duration of the import: what runs is
k-diffusion's own sampling.py and external.py, unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import numpy as np


def load():
    """(k_diffusion.sampling, k_diffusion.external)."""
    if "k_diffusion.sampling" not in sys.modules:
        spec = importlib.util.find_spec("k_diffusion")
        assert spec is not None, "k-diffusion is not installed (README's test command installs it)"
        package = types.ModuleType("k_diffusion")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["k_diffusion"] = package
        placeholders = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
        added = [name for name in placeholders if name not in sys.modules]
        for name in added:
            sys.modules[name] = types.ModuleType(name)
        sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
        sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]
        try:
            importlib.import_module("k_diffusion.sampling")
            importlib.import_module("k_diffusion.external")
        finally:  # nothing else may see the placeholder (diffusers and transformers probe for torchvision)
            for name in added:
                del sys.modules[name]
    return sys.modules["k_diffusion.sampling"], sys.modules["k_diffusion.external"]


def a1111_alphas_cumprod():
    """SDXL's alphas_cumprod as A1111 gives them to k-diffusion (sgm's LegacyDDPMDiscretization:
    float64 betas and product, then a float32 tensor)."""
    import torch

    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    return torch.tensor(np.cumprod(1.0 - betas.numpy()), dtype=torch.float32)


def a1111_sigmas(schedule: str, steps: int, denoiser):
    """A1111's schedule type (modules/sd_schedulers.py) on a k-diffusion denoiser."""
    import torch

    sampling, _ = load()
    sigma_min, sigma_max = denoiser.sigmas[0].item(), denoiser.sigmas[-1].item()
    if schedule == "Uniform":
        return denoiser.get_sigmas(steps)
    if schedule == "Karras":
        return sampling.get_sigmas_karras(steps, sigma_min, sigma_max)
    if schedule == "Exponential":
        return sampling.get_sigmas_exponential(steps, sigma_min, sigma_max)
    if schedule == "SGM Uniform":  # A1111's sgm_uniform
        start, end = denoiser.sigma_to_t(torch.tensor(sigma_max)), denoiser.sigma_to_t(torch.tensor(sigma_min))
        sigmas = [denoiser.t_to_sigma(t) for t in torch.linspace(start, end, steps + 1)[:-1]]
        return torch.FloatTensor([*sigmas, 0.0])
    raise ValueError(schedule)
