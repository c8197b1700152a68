"""sdxl_tpu.sampler.torch_rng against real torch (a test-only dependency): the same float32 bits, call after call."""

import subprocess
import sys

import numpy as np
import pytest

from sdxl_tpu.sampler.torch_rng import TorchCPUGenerator, _fma, torch_randn

SEEDS = (0, 1, 42, 1234567890, 2**32 - 1, 2**32 + 5, 2**63 - 1, 2**64 - 1, -1, -(2**63))
SHAPES = ((4, 128, 128), (4, 64, 64), (4, 96, 160), (4, 8, 8), (1,), (3,), (15,), (16,), (17,), (31,), (33,),
          (4, 13, 7), (0,), (2, 0, 3))


def torch_generator(seed: int):
    import torch

    return torch.Generator("cpu").manual_seed(seed)


def torch_draw(generator, shape) -> np.ndarray:
    import torch

    return torch.randn(shape, generator=generator, dtype=torch.float32).numpy()


def assert_same_bits(mine: np.ndarray, expected: np.ndarray) -> None:
    assert mine.dtype == np.float32 and mine.shape == expected.shape and mine.flags.c_contiguous
    assert np.array_equal(mine, expected)
    assert np.array_equal(mine.view(np.uint32), expected.view(np.uint32))  # also the signs of zeros


@pytest.mark.parametrize("seed", SEEDS)
def test_one_draw_matches_torch(seed):
    for shape in SHAPES:
        assert_same_bits(torch_randn(seed, shape), torch_draw(torch_generator(seed), shape))


@pytest.mark.parametrize("seed", (7, 2**40 + 3))
def test_big_odd_size(seed):
    # ~10**6 values: the AVX2 path's polynomials over many inputs, and the redrawn last 16.
    assert_same_bits(torch_randn(seed, (1_000_003,)), torch_draw(torch_generator(seed), (1_000_003,)))


@pytest.mark.parametrize("seed", (0, 42, 2**32 + 5))
def test_successive_draws_continue_the_stream(seed):
    # As A1111 draws the initial latent, then each ancestral step's noise, from one generator. The small draws
    # leave a cached normal in the generator, which later small draws use, across the big ones in between.
    shapes = [(4, 128, 128), (3,), (4, 64, 64), (1,), (4, 13, 7), (5,), (17,), (2,), (4, 128, 128), (1,), (15,)]
    mine, theirs = TorchCPUGenerator(seed), torch_generator(seed)
    for shape in shapes:
        assert_same_bits(mine.randn(shape), torch_draw(theirs, shape))


def test_shape_forms_and_seed_range():
    assert_same_bits(TorchCPUGenerator(3).randn(20), torch_draw(torch_generator(3), (20,)))
    assert_same_bits(TorchCPUGenerator(np.int64(3)).randn([np.int64(4), 5]), torch_draw(torch_generator(3), (4, 5)))
    for seed in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError):
            TorchCPUGenerator(seed)
    with pytest.raises(ValueError):
        TorchCPUGenerator(0).randn((2, -1))


def test_fma_rounds_once():
    # 24929/2**14 * 673/2**10 == 1 + 2**-24 exactly: halfway between the float32s 1 and 1 + 2**-23. A tiny addend
    # decides the rounding, which a float64 sum alone would lose (it rounds back to the halfway point).
    a, b = np.float32(24929 / 2**14), np.float32(673 / 2**10)
    tiny = np.float32(2.0**-80)
    assert _fma(np.array([a]), b, tiny)[0] == np.float32(1 + 2**-23)
    assert _fma(np.array([a]), b, -tiny)[0] == np.float32(1)
    assert _fma(np.array([a]), b, np.float32(0))[0] == np.float32(1)  # an exact tie: to even
    # Array operands, a strided one among them, with the halfway case in the middle.
    a_arr = np.array([[1.5, 9.0], [a, 9.0], [2.0, 9.0]], np.float32)[:, 0]
    c_arr = np.array([0.25, tiny, -0.5], np.float32)
    expected = np.array([1.5 * 673 / 2**10 + 0.25, 1 + 2**-23, 2 * 673 / 2**10 - 0.5], np.float32)
    assert np.array_equal(_fma(a_arr, np.full(3, b), c_arr), expected)


def test_module_does_not_import_torch():
    code = ("import sys, sdxl_tpu.sampler.torch_rng; "
            "assert 'torch' not in sys.modules, [m for m in sys.modules if 'torch' in m]")
    subprocess.run([sys.executable, "-c", code], check=True)
