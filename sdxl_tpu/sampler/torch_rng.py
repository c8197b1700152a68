"""PyTorch's CPU `torch.randn`, bit for bit, in numpy (no torch at run time).

AUTOMATIC1111's "CPU" random number source, and ComfyUI's and Fooocus' default noise, draw the initial latent (and
each ancestral/SDE step's noise) with `torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))`.
Reproducing an image made there needs those exact float32 numbers, so this module mirrors what ATen does:

* The generator is mt19937 seeded by init_genrand with the low 32 bits of the 64-bit seed (negative seeds wrap as
  int64 -> uint64 first, as torch does).
* A float32 tensor of >= 16 elements (the AVX2 kernel `normal_fill_AVX2`, which x86 CPUs with AVX2 use; AVX-512
  CPUs fall back to it): every element gets a uniform `(random() & (2**24 - 1)) * 2**-24`, then each block of 16
  becomes 8 Box-Muller pairs (u1 = 1 - u[j], u2 = u[j + 8]) through the Cephes float32 `log256_ps`/`sincos256_ps`
  of ATen's avx_mathfun.h. If the size is not a multiple of 16, the last 16 are redrawn and transformed again.
  Linux wheels are built by GCC, which contracts those intrinsics' multiply-adds into FMAs: mirrored here exactly.
  A build whose compiler does not (MSVC on Windows, clang on macOS, as far as known; not checked here) would give
  about 1% of values an ulp away from these.
* Fewer than 16 elements: per element `normal_distribution<double>` (two 53-bit uniforms from two 64-bit draws,
  libm log1p/cos/sin), whose second value stays cached in the generator for the next small draw.

Not reproduced: torch's generic (non-AVX2) kernel, used on ARM (Apple silicon) and pre-AVX2 x86, which calls the
scalar libm logf/cosf/sinf; it differs from the AVX2 kernel in about 40% of values, by a few ulp.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

_F32, _F64 = np.float32, np.float64
_MT_STATE_WORDS = 624

# Constants of ATen's avx_mathfun.h (Cephes), as float32.
_LOG_POLY = tuple(_F32(c) for c in (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
                                    1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
                                    3.3333331174e-1))
_LOG_Q1, _LOG_Q2, _SQRT_HALF = _F32(-2.12194440e-4), _F32(0.693359375), _F32(0.707106781186547524)
_PI_PARTS = (_F32(-0.78515625), _F32(-2.4187564849853515625e-4), _F32(-3.77489497744594108e-8))
_SIN_POLY = (_F32(-1.9515295891e-4), _F32(8.3321608736e-3), _F32(-1.6666654611e-1))
_COS_POLY = (_F32(2.443315711809948e-5), _F32(-1.388731625493765e-3), _F32(4.166664568298827e-2))
_FOUR_OVER_PI, _TWO_PI = _F32(1.27323954473516), _F32(2.0 * math.pi)
_ONE, _HALF, _ZERO = _F32(1), _F32(0.5), _F32(0)


def _fma(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    """float32 a*b + c with one rounding, like the FMA instruction (numpy has no fma); a is an array."""
    total = a.astype(_F64) * b + c  # the product is exact (24 + 24 bits); only the float64 sum rounds
    result = total.astype(_F32, order="C")  # C order: written through reshape(-1) below
    # Rounding that float64 to float32 can differ from one rounding of the exact value only where it landed exactly
    # halfway between two float32s (low 29 of its 52 fraction bits 1000...0; results here are never subnormal).
    suspects = np.flatnonzero((total.view(np.int64) & 0x1FFFFFFF) == 0x10000000)
    if suspects.size:
        a64 = a.reshape(-1)[suspects].astype(_F64)
        b64, c64 = (np.asarray(v, _F64).reshape(-1)[suspects] if np.ndim(v) else _F64(v) for v in (b, c))
        product = a64 * b64
        near = product + c64
        c_part = near - product
        error = (product - (near - c_part)) + (c64 - c_part)  # TwoSum: the sum's exact rounding error
        # Step off the halfway point toward the exact value, so the float32 rounding goes the right way.
        near = np.where(error == 0, near, np.nextafter(near, np.copysign(np.inf, error)))
        result.reshape(-1)[suspects] = near.astype(_F32)
    return result


def _log(x: np.ndarray) -> np.ndarray:
    """log256_ps for x in (0, 1], in its operation order (products that are exact are left unfused)."""
    bits = x.view(np.uint32)
    exponent = ((bits >> 23).astype(np.int32) - 126).astype(_F32)
    mantissa = ((bits & np.uint32(0x807FFFFF)) | np.uint32(0x3F000000)).view(_F32)  # in [0.5, 1)
    below = mantissa < _SQRT_HALF
    exponent -= np.where(below, _ONE, _ZERO)
    m = (mantissa - _ONE) + np.where(below, mantissa, _ZERO)
    m2 = m * m
    y = np.full_like(m, _LOG_POLY[0])
    for coefficient in _LOG_POLY[1:]:
        y = _fma(y, m, coefficient)
    y = _fma(y * m, m2, exponent * _LOG_Q1)  # GCC fuses the first of the two products (checked against torch)
    y -= m2 * _HALF
    return (m + y) + exponent * _LOG_Q2


def _sincos(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sincos256_ps for x in [0, 2 pi): octant reduction, then the sine and cosine polynomials."""
    octant = ((x * _FOUR_OVER_PI).astype(np.int32) + 1) & ~1
    y = octant.astype(_F32)
    sin_sign = ((octant & 4) << 29).astype(np.uint32)
    cos_sign = ((~(octant - 2) & 4) << 29).astype(np.uint32)
    sine_poly_gives_sin = (octant & 2) == 0
    x = (x + y * _PI_PARTS[0]) + y * _PI_PARTS[1]  # exact products: fused or not, the same
    x = _fma(y, _PI_PARTS[2], x)
    z = x * x
    cos_poly = _fma(_fma(np.full_like(z, _COS_POLY[0]), z, _COS_POLY[1]), z, _COS_POLY[2])
    cos_poly = _fma(cos_poly * z, z, -(z * _HALF)) + _ONE
    sin_poly = _fma(_fma(np.full_like(z, _SIN_POLY[0]), z, _SIN_POLY[1]), z, _SIN_POLY[2])
    sin_poly = _fma(sin_poly * z, x, x)
    # The blend adds +0 to the chosen polynomial, which turns -0 into +0.
    sin = np.where(sine_poly_gives_sin, sin_poly, cos_poly) + _ZERO
    cos = np.where(sine_poly_gives_sin, cos_poly, sin_poly) + _ZERO
    return (sin.view(np.uint32) ^ sin_sign).view(_F32), (cos.view(np.uint32) ^ cos_sign).view(_F32)


def _box_muller(uniforms: np.ndarray) -> np.ndarray:
    """normal_fill_16_AVX2 over consecutive blocks of 16 uniforms (len a multiple of 16)."""
    blocks = uniforms.reshape(-1, 2, 8)
    radius = np.sqrt(_F32(-2) * _log(_ONE - blocks[:, 0]))
    sin, cos = _sincos(_TWO_PI * blocks[:, 1])
    # fmadd(n, std=1, mean=0): exact, but -0 becomes +0.
    return np.stack([radius * cos + _ZERO, radius * sin + _ZERO], axis=1).reshape(-1)


class TorchCPUGenerator:
    """`torch.Generator("cpu").manual_seed(seed)`: successive `randn` calls continue one stream, as torch's do."""

    def __init__(self, seed: int):
        seed = operator.index(seed)
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"seed {seed} is outside torch's range [-2**63, 2**64)")
        key = [seed % 2**32]  # init_genrand on the low 32 bits (a negative seed wraps, as int64 -> uint64)
        for index in range(1, _MT_STATE_WORDS):
            key.append((1812433253 * (key[-1] ^ (key[-1] >> 30)) + index) & 0xFFFFFFFF)
        self._mt = np.random.MT19937(0)
        self._mt.state = {"bit_generator": "MT19937",
                          "state": {"key": np.array(key, np.uint32), "pos": _MT_STATE_WORDS}}
        self._cached_normal: float | None = None  # the generator's next_double_normal_sample

    def _uniform_floats(self, count: int) -> np.ndarray:
        """uniform_real_distribution<float>(0, 1): 24 bits of one 32-bit draw each."""
        return (self._mt.random_raw(count) & 0xFFFFFF).astype(_F32) * _F32(2.0**-24)

    def _uniform_double(self) -> float:
        """uniform_real_distribution<double>(0, 1): 53 bits of a 64-bit draw (first 32-bit word high)."""
        high, low = (int(word) for word in self._mt.random_raw(2))
        return ((high << 32 | low) & (2**53 - 1)) * 2.0**-53

    def _normal_double(self) -> float:
        """normal_distribution<double>: Box-Muller, returning the cosine and caching the sine."""
        if self._cached_normal is not None:
            value, self._cached_normal = self._cached_normal, None
            return value
        angle_uniform, radius_uniform = self._uniform_double(), self._uniform_double()
        radius = math.sqrt(-2.0 * math.log1p(-radius_uniform))
        theta = 2.0 * math.pi * angle_uniform
        self._cached_normal = radius * math.sin(theta)
        return radius * math.cos(theta)

    def randn(self, shape: int | Sequence[int]) -> np.ndarray:
        """float32 standard normals of `shape` (C order), advancing the stream exactly as `torch.randn` does."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(operator.index(n) for n in shape)
        if any(size < 0 for size in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        count = math.prod(shape)
        if count < 16:
            values = [self._normal_double() + 0.0 for _ in range(count)]  # `* std + mean` turns -0 into +0
            return np.array(values, _F64).astype(_F32).reshape(shape)
        normals = _box_muller(self._uniform_floats(count)[: count - count % 16])
        if count % 16:
            # torch transforms the whole blocks, then redraws the last 16 elements and transforms those.
            normals = np.concatenate([normals[: count - 16], _box_muller(self._uniform_floats(16))])
        return normals.reshape(shape)


def torch_randn(seed: int, shape: int | Sequence[int]) -> np.ndarray:
    """`torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))` as a float32 numpy array."""
    return TorchCPUGenerator(seed).randn(shape)
