"""The denoising loop as the host drives it, on a pipeline's compiled program: stepwise (one
dispatch per table row, each step reported as it completes, previews, a stop asked in between)
or fused (all rows in one dispatch); and the noise the host draws for the images that take it
from PyTorch's CPU generator (RNG CPU). A step is one table row, or two (DPM++ SDE's midpoint)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import jax
import numpy as np

from ..sampler.tables import Tables
from ..sampler.torch_rng import TorchCPUGenerator
from ..request.errors import Cancelled
from .preview import Previews
from .sampler_update import State


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
                 put: Callable[[np.ndarray], jax.Array]):
        self.generators = [TorchCPUGenerator(s) if s is not None else None for s in seeds]
        self.shape, self.put = latent_shape, put
        # The rows that add noise, in order: the host hands their noise over before them (none when
        # no image draws its own).
        self.noisy = [i for i in range(rows) if tables.update[i, 3] != 0] if self else []
        self._first_slot = None

    def __bool__(self) -> bool:
        return any(g is not None for g in self.generators)

    def draw(self) -> jax.Array:
        """The next unit noise of every image (zeros for those JAX draws for), on the devices."""
        zeros = np.zeros(self.shape, np.float32)
        return self.put(np.stack([g.randn(self.shape) if g else zeros for g in self.generators]).transpose(0, 2, 3, 1))

    def refill(self, state: State, count: int) -> State:
        """`state` holding the next `count` noisy rows' noise of every image (its room, K rows:
        State.noise; the rest zeros), in one transfer, the first of them next."""
        room = state.noise.shape[1]
        zeros = np.zeros((room, *self.shape), np.float32)
        rows = np.stack([np.concatenate([np.stack([g.randn(self.shape) for _ in range(count)]), zeros[count:]])
                         if g else zeros for g in self.generators])
        if self._first_slot is None:
            self._first_slot = self.put(np.zeros(len(self.generators), np.int32))
        return state._replace(noise=self.put(rows.transpose(0, 1, 3, 4, 2)), noise_slot=self._first_slot)


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

    noisy = set(host.noisy)
    for i in range(step_ends[-1]):
        if i in noisy:
            state = host.refill(state, 1)
        state = run_row(state, i)
        in_flight.append((i, state))
        if len(in_flight) > LOOKAHEAD:
            finish_oldest()
    while in_flight:
        finish_oldest()
    return state


def denoise_fused(run_rows: Callable[[State, int, int], State], state: State, step_ends: Sequence[int],
                  host: HostNoise, progress: Callable[[int, int], None] | None) -> State:
    """Every row in one dispatch; where the host gives the noise, one per K noisy rows (the room
    the state has: State.noise), their noise handed over before it."""
    rows, noisy, room = step_ends[-1], host.noisy, state.noise.shape[1]
    # Each dispatch ends where the noisy row that would not fit begins.
    bounds = [0, *noisy[room::room], rows]
    for k, (first, end) in enumerate(zip(bounds, bounds[1:])):
        if noisy:
            state = host.refill(state, len(noisy[k * room:(k + 1) * room]))
        state = run_rows(state, first, end)
    state = jax.block_until_ready(state)
    if progress is not None:
        progress(len(step_ends), len(step_ends))
    return state
