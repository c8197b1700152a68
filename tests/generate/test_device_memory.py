"""Networks that cannot fit a device's memory are refused before minutes of reading them, naming what
each takes (each device holds every network: a TPU v5e's 16 GB does not hold SDXL with the refiner and
an IP-Adapter; RESULTS 2026-12-07)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from flax import nnx

from sdxl_tpu import load_pipeline
from sdxl_tpu.generate import loading
from sdxl_tpu.request.errors import CompileError, DeviceMemoryError
from sdxl_tpu.weights.checkpoint import Checkpoint


class _Device:
    device_kind = "TPU v5 lite"

    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return None if self.limit is None else {"bytes_limit": self.limit, "bytes_in_use": 0}


def test_what_networks_take_and_what_a_device_holds():
    layer = nnx.Linear(3, 5, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert loading.weight_bytes(layer) == (3 * 5 + 5) * 2
    assert loading.weight_bytes(nnx.eval_shape(lambda: nnx.Linear(3, 5, rngs=nnx.Rngs(0)))) == (3 * 5 + 5) * 4
    parts = {"the model": 6_900_000_000, "the refiner": 6_000_000_000, "ControlNet canny": 2_500_000_000}
    loading.check_fits(parts, _Device(16_900_000_000))  # (15.4 GB: it may fit; the run says)
    loading.check_fits(parts, _Device(None))  # (a CPU says nothing: its memory is the host's)
    with pytest.raises(DeviceMemoryError) as refused:
        loading.check_fits({**parts, "the IP-Adapter and its image encoder": 3_800_000_000}, _Device(16_900_000_000))
    assert str(refused.value).startswith("The networks to load take 19.2 GB (the model 6.9 GB, the refiner 6.0 GB, "
                                         "ControlNet canny 2.5 GB, the IP-Adapter and its image encoder 3.8 GB) "
                                         "and each device holds them all: one TPU v5 lite holds 16.9 GB.")
    assert "--refiner" in str(refused.value) and isinstance(refused.value, CompileError)


def test_a_load_that_cannot_fit_is_refused_before_the_weights_are_read(tiny_checkpoint, tiny_refiner, monkeypatch):
    monkeypatch.setattr(loading, "device_memory", lambda device: 1_000_000)  # (1 MB: the tiny model takes more)

    def read(*args, **kwargs):
        raise AssertionError("the model's weights were read")

    monkeypatch.setattr(Checkpoint, "fill", read)
    with pytest.raises(DeviceMemoryError, match=r"the model \d\.\d GB, the refiner \d\.\d GB\) and .* holds 0\.0 GB"):
        load_pipeline(tiny_checkpoint, refiner=str(tiny_refiner), warmup=False, sizes=[(64, 64)])


def test_a_device_that_runs_out_while_loading_says_what_was_loaded(tiny_checkpoint, monkeypatch):
    """Weights that fit, but not beside a call's programs, meet XLA's RESOURCE_EXHAUSTED while they are
    read or the first programs load (a v5e with SDXL, the plus IP-Adapter and the refiner, 2026-12-07):
    said as what each network takes and what to do, not as a model that could not be found."""
    monkeypatch.setattr(loading, "device_memory", lambda device: 16_900_000_000)

    def exhausted(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Error loading program 'jit__lambda': Attempting to allocate 69.96M.")

    monkeypatch.setattr(Checkpoint, "fill", exhausted)
    with pytest.raises(DeviceMemoryError) as refused:
        load_pipeline(tiny_checkpoint, warmup=False, sizes=[(64, 64)])
    message = str(refused.value)
    assert message.startswith("The networks to load take 0.0 GB (the model 0.0 GB) and did not fit beside what a "
                              "call needs: one ") and "holds 16.9 GB. Load fewer of them" in message, message
    assert "(--images)" in message and isinstance(refused.value.__cause__, RuntimeError)
    assert loading.out_of_device_memory(RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
                                                     "memory in memory space hbm. HLO temporaries (18.47G) exceeds "
                                                     "available HBM (15.75G)"))
    assert not loading.out_of_device_memory(RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem"))
    # Anything else is raised as it was.
    monkeypatch.setattr(Checkpoint, "fill", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk on fire")))
    with pytest.raises(RuntimeError, match="disk on fire"):
        load_pipeline(tiny_checkpoint, warmup=False, sizes=[(64, 64)])
