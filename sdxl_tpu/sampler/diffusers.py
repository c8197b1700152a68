"""The samplers on the checkpoint's scheduler config, as diffusers runs them.

Each class is one diffusers scheduler (or one family: Euler / Euler a, DPM++ 2M / 2M SDE with or
without Karras sigmas), reduced to its tables (tables.py); from_config.py makes them by name. Under
one of A1111's schedule types the same sampler runs its k-diffusion function instead
(Sampler.kdiffusion_tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .kdiffusion import update_table
from .sigmas import karras_sigmas, sigma_to_t, spaced_timesteps
from .tables import Sampler, Tables

_FIELDS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "timestep_spacing", "steps_offset",
           "prediction_type")


def init_sigma(top: float, spacing: str) -> float:
    """The initial noise's scale for the largest sigma `top`, as diffusers' init_noise_sigma."""
    return top if spacing in ("linspace", "trailing") else (top ** 2 + 1) ** 0.5


def schedule_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """A scheduler config's noise schedule, as every sampler's fields (diffusers' defaults)."""
    return dict(num_train_timesteps=cfg.get("num_train_timesteps", 1000), beta_start=cfg.get("beta_start", 0.00085),
                beta_end=cfg.get("beta_end", 0.012), beta_schedule=cfg.get("beta_schedule", "scaled_linear"),
                timestep_spacing=cfg.get("timestep_spacing", "leading"),
                steps_offset=cfg.get("steps_offset", 0), prediction_type=cfg.get("prediction_type", "epsilon"))


# Samplers whose diffusers scheduler has no prediction_type "sample" (a model predicting the clean latents).
NOISE_ONLY = ("Euler a", "DPM++ SDE", "DPM++ SDE Karras")


@dataclass(frozen=True)
class EulerDiscrete(Sampler):
    """diffusers' EulerDiscreteScheduler (s_churn = 0), or with `ancestral` its
    EulerAncestralDiscreteScheduler: Euler steps of the probability-flow ODE, dx/dsigma = eps."""

    ancestral: bool = False

    @property
    def name(self) -> str:
        return "Euler a" if self.ancestral else "Euler"

    @property
    def kdiffusion_method(self) -> str:
        return "euler_ancestral" if self.ancestral else "euler"

    def timesteps(self, steps: int) -> np.ndarray:
        return spaced_timesteps(self.timestep_spacing, steps, self.num_train_timesteps, self.steps_offset,
                                rounded=False).astype(np.float32)

    def sigmas(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        self._check_steps(steps)
        timesteps = self.timesteps(steps)
        train = self.train_sigmas()
        sigmas = np.interp(timesteps, np.arange(len(train)), train)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        init = init_sigma(float(sigmas.max()), self.timestep_spacing)
        return timesteps, sigmas, float(np.float32(init))

    def noising(self, steps: int, start: int) -> tuple[float, float]:
        return 1.0, float(self.sigmas(steps)[1][start])  # x = x0 + sigma z

    def tables(self, steps: int, start: int = 0) -> Tables:
        if start:
            return self._tail(self.tables(steps), start)
        timesteps, sigmas, init = self.sigmas(steps)
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
    sde: bool = False  # algorithm_type sde-dpmsolver++: "DPM++ 2M SDE"

    @property
    def name(self) -> str:
        return "DPM++ 2M" + (" SDE" if self.sde else "") + (" Karras" if self.karras else "")

    @property
    def kdiffusion_method(self) -> str:
        return "dpmpp_2m_sde" if self.sde else "dpmpp_2m"

    def sigmas(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        self._check_steps(steps)
        train = self.train_sigmas()
        if self.karras:  # the spacing does not apply: timesteps follow from the sigmas
            sigmas = karras_sigmas(float(train[0]), float(train[-1]), steps)
            timesteps = sigma_to_t(sigmas, train).round()
        else:
            timesteps = spaced_timesteps(self.timestep_spacing, steps, self.num_train_timesteps, self.steps_offset,
                                         one_more=True).astype(np.int64)
            sigmas = np.interp(timesteps, np.arange(len(train)), train)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        return timesteps.astype(np.float32), sigmas, 1.0

    def noising(self, steps: int, start: int) -> tuple[float, float]:
        s = float(self.sigmas(steps)[1][start])
        return 1 / np.sqrt(s ** 2 + 1), s / np.sqrt(s ** 2 + 1)  # x = alpha x0 + sigma_vp z

    def tables(self, steps: int, start: int = 0) -> Tables:
        timesteps, sigmas, init = self.sigmas(steps)
        sig = sigmas.astype(np.float64)
        alpha = 1 / np.sqrt(sig ** 2 + 1)
        update = np.zeros((steps, 6))
        for i in range(start, steps):
            s, t = sig[i], sig[i + 1]
            # The data prediction: m0 = (x - sigma_vp eps) / alpha = p x + q eps.
            p, q = 1 / alpha[i], -s
            # x' = (sigma_vp,t / sigma_vp,s) x - E m0 (first order), with E = alpha_t (e^-h - 1), and
            # h = lambda_t - lambda_s = log(s / t) since lambda = -log(sigma); the final t is 0.
            ratio, e, n = t * alpha[i + 1] / (s * alpha[i]), alpha[i + 1] * (t / s - 1), 0.0
            if self.sde:  # (sigma_vp,t / sigma_vp,s) e^-h x - alpha_t (e^-2h - 1) m0 + sigma_vp,t sqrt(1 - e^-2h) z
                ratio, e = ratio * t / s, alpha[i + 1] * ((t / s) ** 2 - 1)
                n = t * alpha[i + 1] * np.sqrt(1 - (t / s) ** 2)
            k = 0.0
            if start < i < steps - 1:  # second order: - E/(2 r) (m0 - m1), r = h_prev / h
                k = 0.5 * np.log(s / t) / np.log(sig[i - 1] / s)
            update[i] = [ratio - e * (1 + k) * p, -e * (1 + k) * q, e * k, n, p, q]
        s = sig[:-1]  # x = alpha x0 + sigma_vp eps, sigma_vp = sigma alpha
        update = self._predicting(update, (1 / (s * alpha[:-1]), -1 / s))
        return self._tail(Tables(timesteps, np.ones(steps, np.float32), update.astype(np.float32), init), start)


@dataclass(frozen=True)
class DPMSolverSDE(Sampler):
    """diffusers' DPMSolverSDEScheduler as AUTOMATIC1111's "DPM++ SDE" (k-diffusion's
    sample_dpmpp_sde, r 1/2, eta 1): two model evaluations a step, at its sigma and at the
    midpoint sqrt(s t), each followed by an ancestral move (kdiffusion.update_table has the
    algebra); the last step, into sigma 0, is one Euler row. With `karras`, Karras sigmas
    between the spaced schedule's ends ("DPM++ SDE Karras"). Its noise, in diffusers and A1111, is
    a Brownian tree sampled at each row's interval; here it is unit noise per row (JAX or RNG CPU)."""

    timestep_spacing: str = "linspace"  # diffusers' default for this scheduler
    steps_offset: int = 0
    karras: bool = False
    rows_per_step = 2

    @property
    def name(self) -> str:
        return "DPM++ SDE" + (" Karras" if self.karras else "")

    @property
    def kdiffusion_method(self) -> str:
        return "dpmpp_sde"

    def sigmas(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Per step (not per row): the spaced timesteps, as Euler's, or with `karras` Karras sigmas
        between the spaced sigmas' ends and their fractional timesteps."""
        euler = EulerDiscrete(**{f: getattr(self, f) for f in _FIELDS})
        timesteps, sigmas, init = euler.sigmas(steps)
        if self.karras:  # between the spaced sigmas' ends, in float64 as diffusers interpolates them
            ends = np.interp(timesteps[[-1, 0]].astype(np.float64), np.arange(self.num_train_timesteps),
                             self.train_sigmas())
            karras = karras_sigmas(ends[0], ends[1], steps)
            timesteps = sigma_to_t(karras, self.train_sigmas()).astype(np.float32)
            sigmas = np.concatenate([karras, [0.0]]).astype(np.float32)
            init = float(np.float32(init_sigma(float(sigmas.max()), self.timestep_spacing)))
        return timesteps, sigmas, init

    def noising(self, steps: int, start: int) -> tuple[float, float]:
        return 1.0, float(self.sigmas(steps)[1][start])

    def tables(self, steps: int, start: int = 0) -> Tables:
        if start:
            return self._tail(self.tables(steps), start)
        step_timesteps, sigmas, init = self.sigmas(steps)
        update, s = update_table("dpmpp_sde", sigmas)
        timesteps = sigma_to_t(s, self.train_sigmas()).astype(np.float32)
        timesteps[::2] = step_timesteps  # the steps' own, as diffusers gives them; midpoints between
        update = self._predicting(update, (1 / s, -1 / s))
        return Tables(timesteps, (1 / np.sqrt(s ** 2 + 1)).astype(np.float32), update.astype(np.float32), init)


@dataclass(frozen=True)
class DDIM(Sampler):
    """diffusers' DDIMScheduler, eta 0: x' = sqrt(alpha_prev) x0 + sqrt(1 - alpha_prev) eps, on
    variance-preserving latents (the model sees x as is; the initial noise is unit)."""

    set_alpha_to_one: bool = True  # diffusers' default; SDXL base's config says False

    @property
    def name(self) -> str:
        return "DDIM"

    def timesteps(self, steps: int) -> np.ndarray:
        return spaced_timesteps(self.timestep_spacing, steps, self.num_train_timesteps,
                                self.steps_offset).astype(np.int64)

    def sigmas(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        self._check_steps(steps)
        timesteps = self.timesteps(steps)
        train = self.train_sigmas()
        return timesteps.astype(np.float32), np.concatenate([train[timesteps], [0.0]]).astype(np.float32), 1.0

    def _alpha_prev(self, alphas_cumprod: np.ndarray, t: int) -> float:
        return alphas_cumprod[t] if t >= 0 else (1.0 if self.set_alpha_to_one else alphas_cumprod[0])

    def noising(self, steps: int, start: int) -> tuple[float, float]:
        a_t = float(self.alphas_cumprod().astype(np.float64)[self.timesteps(steps)[start]])
        return np.sqrt(a_t), np.sqrt(1 - a_t)  # diffusers' add_noise: x = sqrt(a_t) x0 + sqrt(1 - a_t) z

    def tables(self, steps: int, start: int = 0) -> Tables:
        if start:
            return self._tail(self.tables(steps), start)
        self._check_steps(steps)
        ac = self.alphas_cumprod().astype(np.float64)
        timesteps = self.timesteps(steps)
        update, to_eps = np.zeros((steps, 6)), np.zeros((2, steps))
        for i, t in enumerate(timesteps):
            update[i] = self._row(ac, timesteps, i)
            a_t = ac[t]
            to_eps[:, i] = 1 / np.sqrt(1 - a_t), -np.sqrt(a_t / (1 - a_t))  # x = sqrt(a_t) x0 + sqrt(1 - a_t) eps
        update = self._predicting(update, (to_eps[0], to_eps[1]))
        return Tables(timesteps.astype(np.float32), np.ones(steps, np.float32), update.astype(np.float32), 1.0)

    def _row(self, ac: np.ndarray, timesteps: np.ndarray, i: int) -> list[float]:
        """a, b, c, n, p, q of step i, for an eps-predicting model."""
        t = timesteps[i]
        a_t, a_prev = ac[t], self._alpha_prev(ac, t - self.num_train_timesteps // len(timesteps))
        p, q = 1 / np.sqrt(a_t), -np.sqrt((1 - a_t) / a_t)  # x0 = (x - sqrt(1 - a_t) eps) / sqrt(a_t)
        return [float(v) for v in (np.sqrt(a_prev) * p, np.sqrt(a_prev) * q + np.sqrt(1 - a_prev), 0.0, 0.0, p, q)]


@dataclass(frozen=True)
class LCM(DDIM):
    """diffusers' LCMScheduler, for LCM-LoRA and LCM-distilled UNets: each step the consistency
    model's clean estimate c_skip x + c_out x0, then noised again to the next timestep (not after the
    last). Timesteps: `steps` of the `original_inference_steps` distillation timesteps."""

    original_inference_steps: int = 50
    timestep_scaling: float = 10.0

    @property
    def name(self) -> str:
        return "LCM"

    def timesteps(self, steps: int) -> np.ndarray:
        if steps > self.original_inference_steps:
            raise ValueError(f"LCM takes at most {self.original_inference_steps} steps (its original_inference_steps)")
        k = self.num_train_timesteps // self.original_inference_steps
        origin = (np.arange(1, self.original_inference_steps + 1) * k - 1)[::-1]
        return origin[np.floor(np.linspace(0, len(origin), num=steps, endpoint=False)).astype(np.int64)]

    def _row(self, ac: np.ndarray, timesteps: np.ndarray, i: int) -> list[float]:
        t = timesteps[i]
        a_t = ac[t]
        scaled = t * self.timestep_scaling  # the boundary condition's scalings, sigma_data 0.5
        c_skip, c_out = 0.25 / (scaled ** 2 + 0.25), scaled / np.sqrt(scaled ** 2 + 0.25)
        p, q = c_skip + c_out / np.sqrt(a_t), -c_out * np.sqrt((1 - a_t) / a_t)  # the denoised estimate
        if i == len(timesteps) - 1:
            return [p, q, 0.0, 0.0, p, q]
        a_prev = self._alpha_prev(ac, int(timesteps[i + 1]))
        return [np.sqrt(a_prev) * p, np.sqrt(a_prev) * q, 0.0, np.sqrt(1 - a_prev), p, q]


__all__ = ["DDIM", "LCM", "DPMSolverMultistep", "DPMSolverSDE", "EulerDiscrete"]
