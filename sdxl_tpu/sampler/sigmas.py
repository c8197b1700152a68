"""Noise levels, each rule written once: the model's training sigmas, diffusers' timestep spacings,
and the sigma schedules (Karras, exponential, A1111's uniform ones). Where diffusers and
AUTOMATIC1111 compute the same thing in other precisions, the precision is a parameter, so both
come out bit for bit as each computes them.

A sigma is a noise level in Karras' (variance exploding) terms: x = x0 + sigma eps.
"""

from __future__ import annotations

import numpy as np

RHO = 7.0  # Karras et al.'s rho, as diffusers and k-diffusion use it


def alphas_cumprod(num_train_timesteps: int, beta_start: float, beta_end: float, beta_schedule: str,
                   betas_dtype: type = np.float32) -> np.ndarray:
    """alpha-bar of each training timestep, float32. diffusers makes the betas in float32
    (`betas_dtype`), A1111 (sgm's LegacyDDPMDiscretization) in float64; both accumulate the
    product in float64."""
    n = num_train_timesteps
    if beta_schedule == "scaled_linear":
        betas = np.linspace(beta_start ** 0.5, beta_end ** 0.5, n).astype(betas_dtype) ** 2
    else:
        betas = np.linspace(beta_start, beta_end, n).astype(betas_dtype)
    return np.cumprod((1.0 - betas).astype(np.float64)).astype(np.float32)


def train_sigmas(alphas_cumprod: np.ndarray) -> np.ndarray:
    """The noise level of each training timestep (ascending), float32."""
    return (((1 - alphas_cumprod) / alphas_cumprod) ** 0.5).astype(np.float32)


def spaced_timesteps(spacing: str, steps: int, num_train_timesteps: int, offset: int = 0, *,
                     one_more: bool = False, rounded: bool = True) -> np.ndarray:
    """`steps` training timesteps, descending, as diffusers' schedulers space them ("linspace",
    "leading", "trailing"). `one_more`: spaced over steps + 1 points and the last dropped (DPM-Solver's
    schedulers); `rounded`: False keeps linspace's fractions, in float32 (Euler's)."""
    n = num_train_timesteps
    points = steps + 1 if one_more else steps
    if spacing == "linspace":
        t = np.linspace(0, n - 1, points, dtype=np.float64 if rounded else np.float32)
        t = t.round() if rounded else t
    elif spacing == "leading":
        t = np.arange(0, points) * (n // points) + offset
    elif spacing == "trailing":
        return np.arange(n, 0, -n / steps).round() - 1
    else:
        raise ValueError(f"no timestep spacing {spacing!r}; spacings: leading, trailing, linspace")
    return t[::-1][:steps].copy()


def karras_sigmas(sigma_min: float, sigma_max: float, steps: int, ramp_dtype: type = np.float64) -> np.ndarray:
    """Karras et al.'s sigmas from sigma_max down to sigma_min, rho 7 (diffusers ramps in float64,
    k-diffusion's get_sigmas_karras in torch's float32: `ramp_dtype`)."""
    ramp = np.linspace(0, 1, steps, dtype=ramp_dtype)
    low, high = sigma_min ** (1 / RHO), sigma_max ** (1 / RHO)
    return (high + ramp * (low - high)) ** RHO


def sigma_to_t(sigmas: np.ndarray, train: np.ndarray) -> np.ndarray:
    """The fractional training timestep of each sigma, interpolated in log sigma (k-diffusion's
    DiscreteSchedule.sigma_to_t; diffusers' _sigma_to_t is the same). Both take the log of the
    float32 training sigmas in float32."""
    log_train = np.log(train).astype(np.float64)
    log_sigma = np.log(np.maximum(np.asarray(sigmas, np.float64), 1e-10))
    dists = log_sigma - log_train[:, np.newaxis]
    low = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=len(log_train) - 2)
    w = np.clip((log_train[low] - log_sigma) / (log_train[low] - log_train[low + 1]), 0, 1)
    return (1 - w) * low + w * (low + 1)


def t_to_sigma(t: np.ndarray, train: np.ndarray) -> np.ndarray:
    """k-diffusion's DiscreteSchedule.t_to_sigma: log sigma interpolated between timesteps."""
    log_train = np.log(train.astype(np.float64))
    t = np.asarray(t, np.float64)
    low, high, w = np.floor(t).astype(int), np.ceil(t).astype(int), t - np.floor(t)
    return np.exp((1 - w) * log_train[low] + w * log_train[high])


def schedule_sigmas(schedule: str, steps: int, train: np.ndarray) -> np.ndarray:
    """A1111's Schedule type `schedule` for `steps` steps, on the model's training sigmas as A1111
    holds them: steps + 1 sigmas ending in 0 (float32)."""
    sigma_min, sigma_max = float(train[0]), float(train[-1])
    if schedule == "Uniform":  # DiscreteSchedule.get_sigmas(n)
        sigmas = t_to_sigma(np.linspace(len(train) - 1, 0, steps, dtype=np.float32), train)
    elif schedule == "SGM Uniform":  # A1111's sgm_uniform: uniform in t over steps + 1 points, the last dropped
        start, end = sigma_to_t(np.array([sigma_max, sigma_min]), train)
        sigmas = t_to_sigma(np.linspace(start, end, steps + 1, dtype=np.float32)[:-1], train)
    elif schedule == "Karras":  # get_sigmas_karras
        sigmas = karras_sigmas(sigma_min, sigma_max, steps, ramp_dtype=np.float32)
    elif schedule == "Exponential":  # get_sigmas_exponential
        sigmas = np.exp(np.linspace(np.log(sigma_max), np.log(sigma_min), steps, dtype=np.float32))
    else:
        raise ValueError(f"no schedule type {schedule!r}")
    return np.concatenate([np.asarray(sigmas, np.float32), [np.float32(0)]])
