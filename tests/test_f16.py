"""engine/cpu/f16.py: both conversions (LLVM's half type where the target has F16C, integer arithmetic
where it has not) against numpy's float16, every half value and the float32 rounding cases."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from engine.cpu import f16

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)


@njit(cache=True)
def _widen(h: np.ndarray, integer: bool) -> np.ndarray:
    out = np.empty(h.shape, np.float32)
    for i in range(h.size):
        out[i] = f16._half_to_float_integer(h[i]) if integer else f16.half_to_float(h[i])
    return out


@njit(cache=True)
def _narrow(x: np.ndarray, integer: bool) -> np.ndarray:
    out = np.empty(x.shape, np.uint16)
    for i in range(x.size):
        out[i] = f16._float_to_half_integer(x[i]) if integer else f16.float_to_half(x[i])
    return out


def float_cases() -> np.ndarray:
    rng = np.random.default_rng(3)
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    bits = halves.view(np.uint32)
    ties = (bits + np.uint32(0x1000)).view(np.float32)  # half-way between two halves (or their subnormals)
    near = np.concatenate([(bits + d).view(np.float32) for d in (np.uint32(1), np.uint32(0xFFF))])
    wide = (rng.standard_normal(200_000) * 10.0 ** rng.uniform(-12, 6, 200_000)).astype(np.float32)
    edges = np.array(
        [65504, 65519.99, 65520, 1e9, -1e9, 5.96e-8, 2.98e-8, 2.9802322e-08, 1e-9, 0.0, -0.0], np.float32
    )
    cases = np.concatenate([halves, ties, near, wide, edges, np.array([np.inf, -np.inf], np.float32)])
    return cases[~np.isnan(cases)]


def test_every_half_widens_as_numpy() -> None:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = h.view(np.float16).astype(np.float32)
    for integer in (True, False):
        got = _widen(h, integer)
        finite = ~np.isnan(want)
        np.testing.assert_array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
        assert np.isnan(got[~finite]).all()


def test_floats_round_to_nearest_even_as_numpy() -> None:
    x = float_cases()
    with np.errstate(over="ignore"):  # beyond 65520: inf, as the kernels give
        want = x.astype(np.float16).view(np.uint16)
    for integer in (True, False):
        np.testing.assert_array_equal(_narrow(x, integer), want)
    nan = _narrow(np.array([np.nan], np.float32), True)[0]
    assert nan & 0x7C00 == 0x7C00 and nan & 0x3FF
