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
    loading.check_fits(parts, [_Device(16_900_000_000)])  # (15.4 GB: it may fit; the run says)
    loading.check_fits(parts, [_Device(None)])  # (a CPU says nothing: its memory is the host's)
    with pytest.raises(DeviceMemoryError) as refused:
        loading.check_fits({**parts, "the IP-Adapter and its image encoder": 3_800_000_000}, [_Device(16_900_000_000)])
    assert str(refused.value).startswith("The networks to load take 19.2 GB (the model 6.9 GB, the refiner 6.0 GB, "
                                         "ControlNet canny 2.5 GB, the IP-Adapter and its image encoder 3.8 GB); "
                                         "one TPU v5 lite holds 16.9 GB")
    assert "--refiner" in str(refused.value) and isinstance(refused.value, CompileError)


def test_a_load_that_cannot_fit_is_refused_before_the_weights_are_read(tiny_checkpoint, tiny_refiner, monkeypatch):
    monkeypatch.setattr(loading, "device_memory", lambda device: 1_000_000)  # (1 MB: the tiny model takes more)

    def read(*args, **kwargs):
        raise AssertionError("the model's weights were read")

    monkeypatch.setattr(Checkpoint, "fill", read)
    with pytest.raises(DeviceMemoryError, match=r"the model \d\.\d GB, the refiner \d\.\d GB\); one .* holds 0\.0 GB"):
        load_pipeline(tiny_checkpoint, refiner=str(tiny_refiner), warmup=False, sizes=[(64, 64)])
