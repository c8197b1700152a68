"""Samplers: host-side tables driving one jit-able update.

Every sampler here (Euler, Euler ancestral, DPM++ 2M with or without Karras sigmas) makes, at
step i, a linear combination of the latents x, the model's noise prediction eps, the previous
step's data prediction m (the current estimate of the clean latents, which previews show), and
fresh unit noise z:

    x' = a x + b eps + c m + n z        m' = p x + q eps

The coefficients depend only on the noise schedule and the step count. So a sampler is nothing
but its tables, computed on the host in float64 from diffusers' float32 schedules: timesteps,
the model-input scale, and (a, b, c, n, p, q) per step, padded to MAX_STEPS. One compiled
program runs every sampler at every step count: choosing either per request never recompiles,
and the denoising loop knows no method's details.
"""

from __future__ import annotations

import abc
import functools
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .configs import check_supported

MAX_STEPS = 50


class Tables(NamedTuple):
    timesteps: Any    # (steps,) model timesteps; zero padded to MAX_STEPS in the compiled loop
    input_scale: Any  # (steps,) the model sees input_scale[i] * x
    update: Any       # (steps, 6): a, b, c, n, p, q of step i (see the module docstring)
    init_sigma: Any   # () the initial latents are init_sigma * unit noise


class State(NamedTuple):
    x: jax.Array           # (B, h, w, C) float32 latents
    prediction: jax.Array  # the previous step's data prediction m (zeros before the first step)
    seeds: jax.Array       # (B,) uint32: each image's seed, for the noise an ancestral step adds


# -- the device half: the same for every sampler ------------------------------------------------

def init(noise: jax.Array, seeds: jax.Array, tables: Tables) -> State:
    """The state before step 0, from unit normal noise and the images' seeds."""
    return State(noise * tables.init_sigma, jnp.zeros_like(noise), seeds)


def model_input(state: State, i: jax.Array, tables: Tables) -> tuple[jax.Array, jax.Array]:
    """What the model sees at step i: the scaled latents and the timestep."""
    return state.x * jnp.asarray(tables.input_scale)[i], jnp.asarray(tables.timesteps)[i]


def step_noise(seeds: jax.Array, i: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The unit noise of step i, per image from its own seed (a stream apart from the initial
    noise, which uses the seed's key itself): an image never depends on its slot or batch."""
    draw = lambda s: jax.random.normal(jax.random.fold_in(jax.random.key(s), i + 1), shape, jnp.float32)
    return jax.vmap(draw)(seeds)


def step(state: State, eps: jax.Array, i: jax.Array, tables: Tables, noise: jax.Array | None = None) -> State:
    """Step i (pure, float32). `noise` replaces the seeds' step noise (tests inject diffusers')."""
    a, b, c, n, p, q = jnp.asarray(tables.update)[i]
    if noise is None:  # only ancestral steps draw noise
        noise = jax.lax.cond(n != 0, lambda: step_noise(state.seeds, i, state.x.shape[1:]),
                             lambda: jnp.zeros_like(state.x))
    x = a * state.x + b * eps + c * state.prediction + n * noise
    return State(x, p * state.x + q * eps, state.seeds)


# -- the host half: one class per family of samplers ---------------------------------------------

# Scheduler config keys whose value must be one of these (diffusers' defaults among them).
_SUPPORTED = {
    "beta_schedule": ("scaled_linear", "linear"),
    "prediction_type": ("epsilon", "sample"),
    "timestep_spacing": ("leading", "trailing", "linspace"),
    "interpolation_type": ("linear",),
    "use_exponential_sigmas": (False, None),
    "use_beta_sigmas": (False, None),
    "use_lu_lambdas": (False, None),
    "use_flow_sigmas": (False, None),
    "final_sigmas_type": ("zero", None),
    "rescale_betas_zero_snr": (False, None),
    "trained_betas": (None,),
    "timestep_type": ("discrete", None),
    "algorithm_type": ("dpmsolver++",),
    "solver_order": (2,),
    "solver_type": ("midpoint",),
    "thresholding": (False,),
    "lower_order_final": (True,),
    "euler_at_final": (False,),
    "variance_type": (None,),
    "lambda_min_clipped": (-float("inf"),),
}


@dataclass(frozen=True)
class Sampler(abc.ABC):
    """A sampler is its tables, on a noise schedule (the fields, as in diffusers' scheduler
    configs). `prediction_type` is what the model predicts: "epsilon" (the noise, SDXL) or
    "sample" (the clean latents, as SDXL-Lightning's 1-step UNet does); the tables turn either
    into eps."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    timestep_spacing: str = "leading"
    steps_offset: int = 1
    prediction_type: str = "epsilon"

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """What image parameters call it (AUTOMATIC1111's name)."""

    @abc.abstractmethod
    def schedule(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(timesteps, sigmas ending in 0, init sigma) as diffusers' scheduler has them after
        set_timesteps(steps): float32, unpadded; sigmas in Karras' (variance exploding) terms."""

    @abc.abstractmethod
    def tables(self, steps: int) -> Tables:
        """Tables for `steps` steps (host, float32, unpadded)."""

    @functools.lru_cache(maxsize=4 * MAX_STEPS)  # asked for on every request; a few per sampler
    def padded_tables(self, steps: int) -> Tables:
        """The tables padded to MAX_STEPS, as the compiled loop takes them (read-only: shared)."""
        t = self.tables(steps)
        timesteps, scale = np.zeros(MAX_STEPS, np.float32), np.zeros(MAX_STEPS, np.float32)
        update = np.zeros((MAX_STEPS, 6), np.float32)
        timesteps[:steps], scale[:steps], update[:steps] = t.timesteps, t.input_scale, t.update
        for array in (timesteps, scale, update):
            array.setflags(write=False)
        return Tables(timesteps, scale, update, np.float32(t.init_sigma))

    def train_sigmas(self) -> np.ndarray:
        """The noise level of each training timestep, float32, as diffusers computes it."""
        n = self.num_train_timesteps
        # As diffusers: betas in float32, the cumulative product accumulated in float64.
        if self.beta_schedule == "scaled_linear":
            betas = np.linspace(self.beta_start ** 0.5, self.beta_end ** 0.5, n).astype(np.float32) ** 2
        else:
            betas = np.linspace(self.beta_start, self.beta_end, n).astype(np.float32)
        alphas_cumprod = np.cumprod((1.0 - betas).astype(np.float64)).astype(np.float32)
        return ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5

    def _predicting(self, update: np.ndarray, to_eps: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Update coefficients for this model's prediction: with eps = u x + v output for a
        sample-predicting model (`to_eps`: u, v per step), x' = a x + b eps + ... becomes
        (a + b u) x + (b v) output + ..., and m' = p x + q eps likewise."""
        if self.prediction_type == "epsilon":
            return update
        (u, v), out = to_eps, update.copy()
        a, b, p, q = update[:, 0], update[:, 1], update[:, 4], update[:, 5]
        out[:, 0], out[:, 1], out[:, 4], out[:, 5] = a + b * u, b * v, p + q * u, q * v
        return out

    def _check_steps(self, steps: int) -> None:
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be between 1 and {MAX_STEPS}, got {steps}")


def _schedule_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(num_train_timesteps=cfg.get("num_train_timesteps", 1000), beta_start=cfg.get("beta_start", 0.00085),
                beta_end=cfg.get("beta_end", 0.012), beta_schedule=cfg.get("beta_schedule", "scaled_linear"),
                timestep_spacing=cfg.get("timestep_spacing", "leading"),
                steps_offset=cfg.get("steps_offset", 0), prediction_type=cfg.get("prediction_type", "epsilon"))


@dataclass(frozen=True)
class EulerDiscrete(Sampler):
    """diffusers' EulerDiscreteScheduler (s_churn = 0), or with `ancestral` its
    EulerAncestralDiscreteScheduler: Euler steps of the probability-flow ODE, dx/dsigma = eps."""

    ancestral: bool = False

    @property
    def name(self) -> str:
        return "Euler a" if self.ancestral else "Euler"

    @staticmethod
    def from_config(cfg: dict[str, Any], ancestral: bool = False) -> "EulerDiscrete":
        check_supported("scheduler", cfg, {**_SUPPORTED, "use_karras_sigmas": (False, None)})
        if ancestral and cfg.get("prediction_type") == "sample":  # as diffusers: not implemented there
            raise ValueError("Euler a does not support prediction_type='sample' (diffusers' "
                             "EulerAncestralDiscreteScheduler does not either)")
        return EulerDiscrete(**_schedule_fields(cfg), ancestral=ancestral)

    def timesteps(self, steps: int) -> np.ndarray:
        n = self.num_train_timesteps
        if self.timestep_spacing == "linspace":
            return np.linspace(0, n - 1, steps, dtype=np.float32)[::-1].copy()
        if self.timestep_spacing == "leading":
            ratio = n // steps
            return (np.arange(0, steps) * ratio).round()[::-1].astype(np.float32) + self.steps_offset
        ratio = n / steps
        return np.arange(n, 0, -ratio).round().astype(np.float32) - 1

    def schedule(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        self._check_steps(steps)
        timesteps = self.timesteps(steps)
        train = self.train_sigmas()
        sigmas = np.interp(timesteps, np.arange(len(train)), train)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        top = float(sigmas.max())
        init = top if self.timestep_spacing in ("linspace", "trailing") else (top ** 2 + 1) ** 0.5
        return timesteps, sigmas, float(np.float32(init))

    def tables(self, steps: int) -> Tables:
        timesteps, sigmas, init = self.schedule(steps)
        s, t = sigmas[:-1].astype(np.float64), sigmas[1:].astype(np.float64)
        if self.ancestral:  # step to sigma_down, then add noise of sigma_up
            up = np.sqrt(t ** 2 * (s ** 2 - t ** 2) / s ** 2)
            down, noise = np.sqrt(t ** 2 - up ** 2), up
        else:
            down, noise = t, np.zeros_like(t)
        # m' = x0 = x - sigma eps: the data prediction, unused by the update but shown as a preview.
        update = np.stack([np.ones_like(s), down - s, 0 * s, noise, np.ones_like(s), -s], axis=1)
        update = self._predicting(update, (1 / s, -1 / s))  # x = x0 + sigma eps
        return Tables(timesteps, (1 / np.sqrt(s ** 2 + 1)).astype(np.float32), update.astype(np.float32), init)


@dataclass(frozen=True)
class DPMSolverMultistep(Sampler):
    """diffusers' DPMSolverMultistepScheduler as AUTOMATIC1111's "DPM++ 2M": algorithm
    dpmsolver++, solver_order 2 (midpoint), first order at the first and the last step,
    final_sigmas_type "zero"; with `karras`, Karras sigmas ("DPM++ 2M Karras").

    It works on variance-preserving latents (x = alpha x0 + sigma_vp eps, alpha = 1/sqrt(1 +
    sigma^2), sigma_vp = sigma alpha): the model sees x as is and the initial noise is unit."""

    timestep_spacing: str = "linspace"  # diffusers' defaults for this scheduler
    steps_offset: int = 0
    karras: bool = False

    @property
    def name(self) -> str:
        return "DPM++ 2M Karras" if self.karras else "DPM++ 2M"

    @staticmethod
    def from_config(cfg: dict[str, Any], karras: bool | None = None) -> "DPMSolverMultistep":
        check_supported("scheduler", cfg, {**_SUPPORTED, "use_karras_sigmas": (False, True, None)})
        karras = bool(cfg.get("use_karras_sigmas")) if karras is None else karras
        return DPMSolverMultistep(**_schedule_fields(cfg), karras=karras)

    def schedule(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        self._check_steps(steps)
        n = self.num_train_timesteps
        train = self.train_sigmas()
        if self.karras:  # the spacing does not apply: timesteps follow from the sigmas
            rho, ramp = 7.0, np.linspace(0, 1, steps)
            low, high = float(train[0]) ** (1 / rho), float(train[-1]) ** (1 / rho)
            sigmas = (high + ramp * (low - high)) ** rho
            timesteps = _sigma_to_t(sigmas, np.log(train)).round()
        else:
            if self.timestep_spacing == "linspace":
                timesteps = np.linspace(0, n - 1, steps + 1).round()[::-1][:-1].astype(np.int64)
            elif self.timestep_spacing == "leading":
                ratio = n // (steps + 1)
                timesteps = (np.arange(0, steps + 1) * ratio).round()[::-1][:-1].astype(np.int64) + self.steps_offset
            else:
                timesteps = np.arange(n, 0, -n / steps).round().astype(np.int64) - 1
            sigmas = np.interp(timesteps, np.arange(len(train)), train)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        return timesteps.astype(np.float32), sigmas, 1.0

    def tables(self, steps: int) -> Tables:
        timesteps, sigmas, init = self.schedule(steps)
        sig = sigmas.astype(np.float64)
        alpha = 1 / np.sqrt(sig ** 2 + 1)
        update = np.zeros((steps, 6))
        for i in range(steps):
            s, t = sig[i], sig[i + 1]
            # The data prediction: m0 = (x - sigma_vp eps) / alpha = p x + q eps.
            p, q = 1 / alpha[i], -s
            # x' = (sigma_vp,t / sigma_vp,s) x - E m0 (first order), with E = alpha_t (e^-h - 1), and
            # h = lambda_t - lambda_s = log(s / t) since lambda = -log(sigma); the final t is 0.
            ratio, e = t * alpha[i + 1] / (s * alpha[i]), alpha[i + 1] * (t / s - 1)
            k = 0.0
            if 0 < i < steps - 1:  # second order: - E/(2 r) (m0 - m1), r = h_prev / h
                k = 0.5 * np.log(s / t) / np.log(sig[i - 1] / s)
            update[i] = [ratio - e * (1 + k) * p, -e * (1 + k) * q, e * k, 0.0, p, q]
        s = sig[:-1]  # x = alpha x0 + sigma_vp eps, sigma_vp = sigma alpha
        update = self._predicting(update, (1 / (s * alpha[:-1]), -1 / s))
        return Tables(timesteps, np.ones(steps, np.float32), update.astype(np.float32), init)


def _sigma_to_t(sigmas: np.ndarray, log_train: np.ndarray) -> np.ndarray:
    """diffusers' _sigma_to_t: the (fractional) training timestep of each sigma, interpolated in
    log sigma."""
    log_sigma = np.log(np.maximum(sigmas, 1e-10))
    dists = log_sigma - log_train[:, np.newaxis]
    low = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=log_train.shape[0] - 2)
    w = np.clip((log_train[low] - log_sigma) / (log_train[low] - log_train[low + 1]), 0, 1)
    return (1 - w) * low + w * (low + 1)


# -- by name ---------------------------------------------------------------------------------------

# AUTOMATIC1111's names. "... Karras" is the old name of the sampler with Schedule type Karras
# (A1111 before 1.9); on the checkpoint's schedule it is diffusers' use_karras_sigmas.
SAMPLERS = ("Euler", "Euler a", "DPM++ 2M", "DPM++ 2M Karras", "DPM++ 2M SDE", "DPM++ 2M SDE Karras", "DDIM", "LCM")
_CLASSES = {"EulerDiscreteScheduler": "Euler", "EulerAncestralDiscreteScheduler": "Euler a",
            "DPMSolverMultistepScheduler": "DPM++ 2M", "DDIMScheduler": "DDIM", "LCMScheduler": "LCM"}

# Schedule types: "Checkpoint" is the checkpoint's own scheduler config as diffusers runs it (the
# default: diffusers' images, exactly); the others are A1111's (1.9 and later), on k-diffusion's
# conventions (kdiffusion.py), "Automatic" being each sampler's A1111 default.
SCHEDULES = ("Checkpoint", "Automatic", "Uniform", "Karras", "Exponential", "SGM Uniform")
DEFAULT_SCHEDULE = "Checkpoint"
# Where the noise comes from: JAX's generator on the device (fast, the default), or PyTorch's CPU
# generator as A1111's "CPU" source, ComfyUI and Fooocus draw it (torch_rng.py).
RNGS = ("JAX", "CPU")
DEFAULT_RNG = "JAX"

# Each sampler's schedule under "Automatic" (A1111's sampler options), and the k-diffusion update
# it runs; DDIM and LCM have only their own timesteps (diffusers').
_AUTOMATIC = {"Euler": "Uniform", "Euler a": "Uniform", "DPM++ 2M": "Karras", "DPM++ 2M Karras": "Karras",
              "DPM++ 2M SDE": "Exponential", "DPM++ 2M SDE Karras": "Karras", "DDIM": "Checkpoint",
              "LCM": "Checkpoint"}


def resolve_schedule(sampler: str, schedule: str) -> str:
    """The schedule `sampler` runs on under Schedule type `schedule` ("Automatic" resolved), or
    ValueError naming a combination that does not exist."""
    auto = _AUTOMATIC[sampler]
    if schedule == "Automatic" or schedule == "Checkpoint":
        return auto if schedule == "Automatic" else "Checkpoint"
    if auto == "Checkpoint":
        raise ValueError(f"{sampler} runs on its own timesteps: choose Schedule type Checkpoint or Automatic, "
                         f"not {schedule}.")
    if sampler.endswith(" Karras") and schedule != "Karras":
        raise ValueError(f"{sampler} names its schedule (Karras): for Schedule type {schedule} choose "
                         f"{sampler.removesuffix(' Karras')}.")
    return schedule


def sampler_named(name: str, cfg: dict[str, Any] | None = None) -> Sampler:
    """Sampler `name` (one of SAMPLERS) on the noise schedule of a scheduler config (a
    checkpoint's scheduler_config.json; default SDXL base's), as diffusers'
    `<Scheduler>.from_config(pipe.scheduler.config)` would make it."""
    from .presets import SCHEDULER_CONFIG

    cfg = dict(SCHEDULER_CONFIG if cfg is None else cfg)
    # The method's own settings come from the name, not from another method's config.
    cfg = {k: v for k, v in cfg.items() if k not in ("use_karras_sigmas", "_class_name")}
    if name in ("Euler", "Euler a"):
        return EulerDiscrete.from_config(cfg, ancestral=name == "Euler a")
    if name in ("DPM++ 2M", "DPM++ 2M Karras"):
        return DPMSolverMultistep.from_config(cfg, karras=name == "DPM++ 2M Karras")
    raise ValueError(f"no sampler {name!r}; samplers: {', '.join(SAMPLERS)}")


def samplers_for(cfg: dict[str, Any] | None = None) -> tuple[dict[str, Sampler], str]:
    """Every sampler on a scheduler config's noise schedule (those that support its prediction
    type), and the name of the config's own (its `_class_name`; Euler for classes not implemented
    here, with a warning)."""
    cfg = dict(cfg or {})
    check_supported("scheduler", cfg, {**_SUPPORTED, "use_karras_sigmas": (False, True, None)})
    default = _CLASSES.get(cfg.get("_class_name", "EulerDiscreteScheduler"))
    if default is None:
        warnings.warn(f"scheduler {cfg['_class_name']!r} is not implemented; the default sampler is Euler "
                      f"(available: {', '.join(SAMPLERS)})")
        default = "Euler"
    if cfg.get("use_karras_sigmas"):
        if default != "DPM++ 2M":
            raise ValueError(f"scheduler config: use_karras_sigmas=True is supported with DPMSolverMultistepScheduler "
                             f"only, not {cfg.get('_class_name')}")
        default = "DPM++ 2M Karras"
    names = [n for n in SAMPLERS if not (n == "Euler a" and cfg.get("prediction_type") == "sample")]
    if default not in names:
        raise ValueError(f"scheduler config: {default} does not support prediction_type={cfg.get('prediction_type')!r}")
    return {name: sampler_named(name, cfg) for name in names}, default


__all__ = ["DEFAULT_RNG", "DEFAULT_SCHEDULE", "MAX_STEPS", "RNGS", "SAMPLERS", "SCHEDULES", "DPMSolverMultistep", "EulerDiscrete", "Sampler", "State", "Tables", "init",
           "model_input", "resolve_schedule", "sampler_named", "samplers_for", "step", "step_noise"]
