"""The denoising loop as the host drives it, on a pipeline's compiled program: stepwise (one
dispatch per table row, each step reported as it completes, previews, a stop asked in between)
or fused (all rows in one dispatch); and the noise the host draws for the images that take it
from PyTorch's CPU generator (RNG CPU). A step is one table row, or two (DPM++ SDE's midpoint)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..sampler.tables import Tables
from ..sampler.torch_rng import TorchCPUGenerator
from ..spec.errors import Cancelled
from .preview import Previews
from .update import State


# Denoising rows dispatched ahead of the one being waited for: enough that the device never waits
# for the host (dispatching a row takes far less than running one), few enough that a stopped call
# ends within LOOKAHEAD + 1 rows.
LOOKAHEAD = 1


class HostNoise:
    """The host's share of a call's noise (RNG CPU): per image that draws its own (a seed; None:
    JAX draws it on the device), PyTorch's CPU generator seeded with it, its stream continued
    from the initial noise into each noisy row, as A1111's ImageRNG draws it (NCHW, torch.randn's
    shape; handed over NHWC by `put`). False when no image draws its own."""

    def __init__(self, seeds: Sequence[int | None], latent_shape: tuple[int, int, int], tables: Tables, rows: int,
                 put: Callable[[np.ndarray], Any]):
        self.generators = [TorchCPUGenerator(s) if s is not None else None for s in seeds]
        self.shape, self.put = latent_shape, put
        # The rows that add noise: the host sets it before each (none to set when no image draws its own).
        self.noisy = {i for i in range(rows) if tables.update[i, 3] != 0} if self else set()

    def __bool__(self) -> bool:
        return any(g is not None for g in self.generators)

    def draw(self) -> Any:
        """The next unit noise of every image (zeros for those JAX draws for), on the devices."""
        zeros = np.zeros(self.shape, np.float32)
        return self.put(np.stack([g.randn(self.shape) if g else zeros for g in self.generators]).transpose(0, 2, 3, 1))


def denoise_stepwise(run_row: Callable[[State, int], State], state: State, step_ends: Sequence[int],
                     host: HostNoise, previews: Previews, progress: Callable[[int, int], None] | None,
                     stop: Callable[[], bool] | None) -> State:
    """Every row, one dispatch each with LOOKAHEAD queued on the device; each step reported (and
    previewed) as it completes, and `stop` asked in between (Cancelled when it says so)."""
    steps, in_flight, done = len(step_ends), collections.deque(), 0

    def finish_oldest() -> None:
        nonlocal done
        row, finished = in_flight.popleft()
        finished = jax.block_until_ready(finished)
        if row + 1 != step_ends[done]:  # the first of a step's two rows
            return
        done += 1
        if progress is not None:
            progress(done, steps)
        previews.after_step(done, finished.prediction)
        if done < steps and stop is not None and stop():
            raise Cancelled(f"stopped after step {done} of {steps}")

    for i in range(step_ends[-1]):
        if i in host.noisy:
            state = state._replace(noise=host.draw())
        state = run_row(state, i)
        in_flight.append((i, state))
        if len(in_flight) > LOOKAHEAD:
            finish_oldest()
    while in_flight:
        finish_oldest()
    return state


def denoise_fused(run_rows: Callable[[State, int, int], State], state: State, step_ends: Sequence[int],
                  host: HostNoise, progress: Callable[[int, int], None] | None) -> State:
    """Every row in one dispatch, unless the host gives the noise: then one per noisy row."""
    rows, noisy = step_ends[-1], host.noisy
    bounds = [0, *sorted(noisy | {i + 1 for i in noisy}), rows]
    for first, end in zip(bounds, bounds[1:]):
        if first < end:
            if first in noisy:
                state = state._replace(noise=host.draw())
            state = run_rows(state, first, end)
    state = jax.block_until_ready(state)
    if progress is not None:
        progress(len(step_ends), len(step_ends))
    return state
