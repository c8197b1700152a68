"""Samplers, computed on the host in float32 and handed to the compiled loop as padded tables.

The number of steps changes per request without recompiling: the compiled program receives
`MAX_STEPS + 1` sigmas and `MAX_STEPS` timesteps (zero padded) and a step count. A sampler is
a host-side table builder plus a pure per-step update; more samplers (Euler ancestral,
DPM++ 2M Karras) add a table builder and an update function here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_STEPS = 50

_SUPPORTED = {
    "beta_schedule": ("scaled_linear", "linear"),
    "prediction_type": ("epsilon",),
    "timestep_spacing": ("leading", "trailing", "linspace"),
    "interpolation_type": ("linear",),
    "use_karras_sigmas": (False, None),
    "use_exponential_sigmas": (False, None),
    "use_beta_sigmas": (False, None),
    "final_sigmas_type": ("zero", None),
    "rescale_betas_zero_snr": (False, None),
    "trained_betas": (None,),
    "timestep_type": ("discrete", None),
}


@dataclass(frozen=True)
class EulerDiscrete:
    """diffusers' EulerDiscreteScheduler (s_churn = 0) for epsilon-prediction models."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    timestep_spacing: str = "leading"
    steps_offset: int = 1

    @staticmethod
    def from_config(cfg: dict[str, Any]) -> "EulerDiscrete":
        for key, allowed in _SUPPORTED.items():
            if key in cfg and cfg[key] not in allowed:
                raise ValueError(f"scheduler config: unsupported {key}={cfg[key]!r} (supported: {allowed})")
        return EulerDiscrete(num_train_timesteps=cfg.get("num_train_timesteps", 1000),
                             beta_start=cfg.get("beta_start", 0.00085), beta_end=cfg.get("beta_end", 0.012),
                             beta_schedule=cfg.get("beta_schedule", "scaled_linear"),
                             timestep_spacing=cfg.get("timestep_spacing", "leading"),
                             steps_offset=cfg.get("steps_offset", 0))

    def _train_sigmas(self) -> np.ndarray:
        n = self.num_train_timesteps
        # As diffusers: betas in float32, the cumulative product accumulated in float64.
        if self.beta_schedule == "scaled_linear":
            betas = np.linspace(self.beta_start ** 0.5, self.beta_end ** 0.5, n).astype(np.float32) ** 2
        else:
            betas = np.linspace(self.beta_start, self.beta_end, n).astype(np.float32)
        alphas_cumprod = np.cumprod((1.0 - betas).astype(np.float64)).astype(np.float32)
        return ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5

    def timesteps(self, steps: int) -> np.ndarray:
        n = self.num_train_timesteps
        if self.timestep_spacing == "linspace":
            return np.linspace(0, n - 1, steps, dtype=np.float32)[::-1].copy()
        if self.timestep_spacing == "leading":
            ratio = n // steps
            return (np.arange(0, steps) * ratio).round()[::-1].astype(np.float32) + self.steps_offset
        ratio = n / steps
        return np.arange(n, 0, -ratio).round().astype(np.float32) - 1

    def tables(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(timesteps[steps], sigmas[steps + 1] ending in 0, init_noise_sigma), float32."""
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be between 1 and {MAX_STEPS}, got {steps}")
        timesteps = self.timesteps(steps)
        train = self._train_sigmas()
        sigmas = np.interp(timesteps, np.arange(len(train)), train)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        top = float(sigmas.max())
        init = top if self.timestep_spacing in ("linspace", "trailing") else (top ** 2 + 1) ** 0.5
        return timesteps, sigmas, float(np.float32(init))

    def padded_tables(self, steps: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
        """The tables padded to MAX_STEPS, as the compiled loop takes them."""
        timesteps, sigmas, init = self.tables(steps)
        t = np.zeros(MAX_STEPS, np.float32)
        s = np.zeros(MAX_STEPS + 1, np.float32)
        t[:steps], s[:steps + 1] = timesteps, sigmas
        return t, s, np.float32(init)


def euler_step(sample, eps, sigma, sigma_next):
    """One Euler step of the probability-flow ODE (float32 throughout)."""
    return sample + eps * (sigma_next - sigma)


def scale_model_input(sample, sigma):
    return sample / (sigma ** 2 + 1) ** 0.5
