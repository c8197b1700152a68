"""Samplers: host-side tables plus a pure, jit-able step.

A sampler has two halves:
  - `tables(steps)`: the timesteps and sigmas of a step count, computed on the host in float32
    (diffusers' arithmetic, so they equal its scheduler's). The compiled loop receives them
    padded to MAX_STEPS, so changing the step count never recompiles.
  - `step(state, model_output, i, tables) -> state`: step i on the device. The state carries the
    latents and whatever a method needs between steps (a multistep method its previous
    prediction, an ancestral one its noise key), so the denoising loop knows no method's details.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np

from .configs import check_supported

MAX_STEPS = 50


class Tables(NamedTuple):
    timesteps: Any   # (steps,) model timesteps; zero padded to MAX_STEPS in the compiled loop
    sigmas: Any      # (steps + 1,) noise levels ending in 0; zero padded to MAX_STEPS + 1
    init_sigma: Any  # () the scale of the initial noise


class State(NamedTuple):
    x: jax.Array     # the latents, float32
    memory: Any = ()  # what a sampler carries from one step to the next (nothing for Euler)


class Sampler(abc.ABC):
    """The interface of every sampler; `name` is what image parameters call it (A1111's names)."""

    name: str

    @abc.abstractmethod
    def tables(self, steps: int) -> Tables:
        """Tables for `steps` steps (host, float32, unpadded)."""

    def padded_tables(self, steps: int) -> Tables:
        """The tables padded with zeros to MAX_STEPS, as the compiled loop takes them."""
        t = self.tables(steps)
        timesteps, sigmas = np.zeros(MAX_STEPS, np.float32), np.zeros(MAX_STEPS + 1, np.float32)
        timesteps[:steps], sigmas[:steps + 1] = t.timesteps, t.sigmas
        return Tables(timesteps, sigmas, np.float32(t.init_sigma))

    def init(self, noise: jax.Array, tables: Tables) -> State:
        """The state before step 0, from unit normal noise."""
        return State(noise * tables.init_sigma)

    def model_input(self, state: State, i: jax.Array, tables: Tables) -> tuple[jax.Array, jax.Array]:
        """What the model sees at step i: the scaled latents and the timestep."""
        sigma = tables.sigmas[i]
        return state.x / (sigma ** 2 + 1) ** 0.5, tables.timesteps[i]

    @abc.abstractmethod
    def step(self, state: State, model_output: jax.Array, i: jax.Array, tables: Tables) -> State:
        """Step i: from the state at sigmas[i] to the state at sigmas[i + 1] (pure, float32)."""


# Scheduler config keys whose value must be one of these (diffusers' defaults among them).
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
class EulerDiscrete(Sampler):
    """diffusers' EulerDiscreteScheduler (s_churn = 0) for epsilon-prediction models."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    timestep_spacing: str = "leading"
    steps_offset: int = 1
    name = "Euler"

    @staticmethod
    def from_config(cfg: dict[str, Any]) -> "EulerDiscrete":
        check_supported("scheduler", cfg, _SUPPORTED)
        return EulerDiscrete(num_train_timesteps=cfg.get("num_train_timesteps", 1000),
                             beta_start=cfg.get("beta_start", 0.00085), beta_end=cfg.get("beta_end", 0.012),
                             beta_schedule=cfg.get("beta_schedule", "scaled_linear"),
                             timestep_spacing=cfg.get("timestep_spacing", "leading"),
                             steps_offset=cfg.get("steps_offset", 0))

    def train_sigmas(self) -> np.ndarray:
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

    def tables(self, steps: int) -> Tables:
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be between 1 and {MAX_STEPS}, got {steps}")
        timesteps = self.timesteps(steps)
        train = self.train_sigmas()
        sigmas = np.interp(timesteps, np.arange(len(train)), train)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        top = float(sigmas.max())
        init = top if self.timestep_spacing in ("linspace", "trailing") else (top ** 2 + 1) ** 0.5
        return Tables(timesteps, sigmas, float(np.float32(init)))

    def step(self, state: State, model_output: jax.Array, i: jax.Array, tables: Tables) -> State:
        # One Euler step of the probability-flow ODE: dx/dsigma = eps.
        return State(state.x + model_output * (tables.sigmas[i + 1] - tables.sigmas[i]), state.memory)
