"""llama.cpp's random numbers: std::mt19937 seeded with the request's seed, read as libstdc++ reads it.

Each of llama.cpp's stochastic samplers (dist, XTC, mirostat) owns an mt19937 seeded with the same seed.
numpy's legacy RandomState seeds its MT19937 exactly as std::mt19937(seed) does (init_genrand); its
state is handed to an MT19937 bit generator whose raw outputs are the 32-bit numbers (0.4 us a draw,
where RandomState.randint takes 5), so the uniform numbers below are bit for bit the ones llama.cpp's
samplers draw (tests/test_sampler_goldens.py checks seeded picks against
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
        self._bits = np.random.MT19937()
        self._bits.state = np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False)

    def uniform(self) -> float:
        """std::uniform_real_distribution<double>(0, 1): [0, 1)."""
        low, high = self._bits.random_raw(), self._bits.random_raw()
        value = (float(low) + float(high) * _TWO_32) / _TWO_64
        return value if value < 1.0 else math.nextafter(1.0, 0.0)

    def uniform_f32(self) -> float:
        """std::uniform_real_distribution<float>(0, 1) (XTC's chance): one output rounded to float."""
        value = float(np.float32(float(self._bits.random_raw()))) / _TWO_32
        return value if value < 1.0 else _BELOW_ONE_F32
