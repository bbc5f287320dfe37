"""llama.cpp's random numbers: std::mt19937 seeded with the request's seed, read as libstdc++ reads it.

Each of llama.cpp's stochastic samplers (dist, XTC, mirostat) owns an mt19937 seeded with the same seed.
numpy's legacy RandomState seeds its MT19937 exactly as std::mt19937(seed) does (init_genrand), and a
full-range 32-bit randint is the generator's raw output, so the uniform numbers below are bit for bit
the ones llama.cpp's samplers draw (tests/test_sampler_goldens.py checks seeded picks against
llama.cpp's). libstdc++'s generate_canonical builds a double from two 32-bit outputs and a float from
one; a result that rounds up to 1 is clamped below it.
"""

from __future__ import annotations

import math

import numpy as np

_TWO_32 = 4294967296.0
_TWO_64 = 18446744073709551616.0
_BELOW_ONE_F32 = float(np.nextafter(np.float32(1), np.float32(0)))


class LlamaRng:
    def __init__(self, seed: int) -> None:
        self._state = np.random.RandomState(seed & 0xFFFFFFFF)

    def _raw(self, n: int) -> np.ndarray:
        return self._state.randint(0, 1 << 32, size=n, dtype=np.uint64)

    def uniform(self) -> float:
        """std::uniform_real_distribution<double>(0, 1): [0, 1)."""
        low, high = self._raw(2)
        value = (float(low) + float(high) * _TWO_32) / _TWO_64
        return value if value < 1.0 else math.nextafter(1.0, 0.0)

    def uniform_f32(self) -> float:
        """std::uniform_real_distribution<float>(0, 1) (XTC's chance): one output rounded to float."""
        (raw,) = self._raw(1)
        value = float(np.float32(float(raw))) / _TWO_32
        return value if value < 1.0 else _BELOW_ONE_F32
