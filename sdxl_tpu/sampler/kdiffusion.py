"""Samplers as k-diffusion runs them, the library AUTOMATIC1111, Forge and ComfyUI sample with.

Under an A1111 schedule type a sampler works in Karras' (variance exploding) terms: noise levels
sigma come from the model's discrete schedule as A1111 builds it (float64 betas, the cumulative
product cast to float32, as sgm's LegacyDDPMDiscretization: sigmas.py), the model sees
x / sqrt(sigma^2 + 1) at the fractional timestep log-interpolated from sigma (k-diffusion's
CompVisDenoiser, not rounded), the first latents are sigma_max x noise, and each method's last
step goes to sigma 0 as its k-diffusion function does. The updates are the same linear form as
tables.py's:

    x' = a x + b eps + c m + n z        m' = x - sigma eps  (the denoised estimate)

so these are host tables too, for the same compiled update. Pure numpy, float64 host math on
float32 sigmas (torch's float32 in k-diffusion).
"""

from __future__ import annotations

import numpy as np

from .sigmas import schedule_sigmas, sigma_to_t

METHODS = ("euler", "euler_ancestral", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde")  # k-diffusion's sample_<method>


def ancestral(s: float, t: float) -> tuple[float, float]:
    """k-diffusion's get_ancestral_step, eta 1: (sigma_down, sigma_up) of a step from s to t."""
    up = min(t, np.sqrt(t ** 2 * (s ** 2 - t ** 2) / s ** 2))
    return np.sqrt(t ** 2 - up ** 2), up


def update_table(method: str, sigmas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, 6) coefficients a, b, c, n, p, q of k-diffusion's sample_<method> (eta 1, s_noise 1,
    midpoint for the SDEs, r 1/2 for DPM++ SDE) on `sigmas`, for an eps-predicting model, and the
    sigma each row evaluates the model at: one row per step, two for DPM++ SDE's (but the last)."""
    sig = sigmas.astype(np.float64)
    rows, row_sigmas = [], []
    for i in range(len(sig) - 1):
        s, t = sig[i], sig[i + 1]
        a, b, c, n = 1.0, t - s, 0.0, 0.0  # Euler: x + (t - s) d, d = eps
        if method == "euler_ancestral" and t > 0:
            down, n = ancestral(s, t)
            b = down - s
        elif method == "dpmpp_2m":
            # x' = (t/s) x - expm1(-h) D', h = log(s/t), D' = (1 + k) D - k D_prev with k = h / (2 h_prev);
            # first order at the first step and into sigma 0 (where t/s = 0 and expm1(-h) = -1).
            e = t / s - 1
            k = 0.5 * np.log(s / t) / np.log(sig[i - 1] / s) if i > 0 and t > 0 else 0.0
            a, b, c = t / s - e * (1 + k), e * (1 + k) * s, e * k
        elif method == "dpmpp_2m_sde" and t > 0:  # (into sigma 0: the denoised estimate, Euler's row)
            # x' = (t/s) e^-h x + F D + F k (D - D_prev) + t sqrt(F) z, F = -expm1(-2h), k = h / (2 h_prev)
            h = np.log(s / t)
            f = -np.expm1(-2 * h)
            k = 0.5 * h / np.log(sig[i - 1] / s) if i > 0 else 0.0
            a, b, c, n = (t / s) * np.exp(-h) + f * (1 + k), -f * (1 + k) * s, -f * k, t * np.sqrt(f)
        elif method == "dpmpp_sde" and t > 0:
            # Two evaluations: at s, an ancestral step to the midpoint sm = sqrt(s t) (x_2 = x + (sd - s) eps
            # + su z), keeping x in m; at sm, from x (now m) with the midpoint's estimate D_2 = x_2 - sm eps_2:
            # x' = (sd/s) x + (1 - sd/s) D_2 + su z, (sd, su) now the ancestral step from s to t.
            mid = np.sqrt(s * t)
            down, up = ancestral(s, mid)
            rows.append([1.0, down - s, 0.0, up, 1.0, 0.0])
            row_sigmas.append(s)
            down, up = ancestral(s, t)
            w = down / s
            rows.append([1 - w, -(1 - w) * mid, w, up, 1.0, -mid])
            row_sigmas.append(mid)
            continue
        elif method not in METHODS:
            raise ValueError(f"no k-diffusion method {method!r}; methods: {', '.join(METHODS)}")
        rows.append([a, b, c, n, 1.0, -s])
        row_sigmas.append(s)
    return np.array(rows), np.array(row_sigmas)


def tables(method: str, schedule: str, steps: int, train: np.ndarray, start: int = 0):
    """(timesteps, input scale, update, init sigma) of `method` on A1111's `schedule`, per row, from
    step `start` (img2img: the sigmas' tail, its first the noise added to the image's latents);
    the update for an eps-predicting model, with (u, v) such that eps = u x + v output for a model
    that predicts the clean latents (x = x0 + sigma eps)."""
    sigmas = schedule_sigmas(schedule, steps, train)[start:]
    update, s = update_table(method, sigmas)
    timesteps = sigma_to_t(s, train).astype(np.float32)
    scale = (1 / np.sqrt(s ** 2 + 1)).astype(np.float32)
    return timesteps, scale, update, float(sigmas[0]), (1 / s, -1 / s)
