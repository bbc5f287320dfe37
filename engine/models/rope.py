"""RoPE as a GGUF describes it: base, style, rotated dimensions and scaling, read as llama.cpp reads them.

The kernel (`Backend.rope`) turns pair i of the first n_rot dimensions by position * base^(-2i/n_rot) *
`pair_scale[i]` and scales cos/sin by `mscale`. What fills those two:

- linear scaling (`rope.scaling.type` linear, the default type, with `rope.scaling.factor`): every pair
  at 1/factor; `none` never scales;
- Llama 3's scaling: the converter bakes it into a `rope_freqs.weight` tensor (one divisor per pair);
  there is no `rope.scaling.*` key for it;
- LongRoPE (Phi-3 128k): `rope_factors_short.weight` / `rope_factors_long.weight`, the long ones when a
  sequence's context exceeds `rope.scaling.original_context_length`, and `rope.scaling.attn_factor`;
- YaRN (`rope.scaling.type` yarn: Ministral 3, Qwen3 long-context files): ggml's ramp between
  interpolated and extrapolated angles over the correction dimensions, and its magnitude factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile, UnsupportedModelError

# Architectures whose llama.cpp loader reads YaRN's beta and log-multiplier keys (the others keep the
# defaults 32, 1 and 0 whatever the file says).
_YARN_KEY_ARCHS = frozenset({"mistral3"})


@dataclass(frozen=True)
class RopeTable:
    pair_scale: Any  # float32 [n_rot / 2] on the backend
    mscale: float


@dataclass(frozen=True)
class Rope:
    freq_base: float
    neox: bool
    table: RopeTable
    long: RopeTable | None = None  # LongRoPE: for sequences whose context exceeds n_ctx_orig
    n_ctx_orig: int = 0

    def for_context(self, n_ctx_seq: int) -> RopeTable:
        return self.long if self.long is not None and n_ctx_seq > self.n_ctx_orig else self.table

    def apply(self, backend: Backend, x: Any, positions: Any, n_ctx_seq: int) -> None:
        """Rotate x[T, heads, head_dim] in place at `positions` (a sequence's context decides LongRoPE)."""
        t = self.for_context(n_ctx_seq)
        backend.rope(x, positions, self.freq_base, self.neox, t.pair_scale, t.mscale)

    def shift(self, backend: Backend, keys: Any, delta_positions: Any, n_ctx_seq: int) -> None:
        """Turn cached keys by a position delta (context shift): a rotation only, no magnitude factor
        (llama.cpp applies its attention factor again here; a second factor would rescale the keys)."""
        t = self.for_context(n_ctx_seq)
        backend.rope(keys, delta_positions, self.freq_base, self.neox, t.pair_scale, 1.0)

    @classmethod
    def plain(cls, backend: Backend, freq_base: float, neox: bool, n_rot: int) -> Rope:
        """Unscaled RoPE (Gemma 3's sliding-window layers)."""
        return cls(freq_base, neox, RopeTable(backend.upload(np.ones(n_rot // 2, dtype=np.float32)), 1.0))


@dataclass(frozen=True)
class _Scaling:
    """The scaling keys of one file, with llama.cpp's defaults."""

    kind: str
    freq_scale: float
    attn_factor: float
    n_ctx_orig: int
    beta_fast: float
    beta_slow: float
    log_mul: float

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> _Scaling:
        kind = str(g.arch_value("rope.scaling.type", "linear"))
        if kind not in ("none", "linear", "yarn", "longrope"):
            raise UnsupportedModelError(f"unsupported RoPE scaling type '{kind}'")
        factor = float(g.arch_value("rope.scaling.factor", g.arch_value("rope.scale_linear", 0.0)))
        yarn_keys = g.require_architecture() in _YARN_KEY_ARCHS
        n_ctx_train = g.arch_value("context_length")
        return cls(
            kind=kind,
            freq_scale=1.0 if kind == "none" or factor == 0.0 else 1.0 / factor,
            attn_factor=float(g.arch_value("rope.scaling.attn_factor", 1.0)),
            n_ctx_orig=int(g.arch_value("rope.scaling.original_context_length", n_ctx_train)),
            beta_fast=float(g.arch_value("rope.scaling.yarn_beta_fast", 32.0)) if yarn_keys else 32.0,
            beta_slow=float(g.arch_value("rope.scaling.yarn_beta_slow", 1.0)) if yarn_keys else 1.0,
            log_mul=float(g.arch_value("rope.scaling.yarn_log_multiplier", 0.0)) if yarn_keys else 0.0,
        )

    def yarn_ramp(self, n_rot: int, freq_base: float) -> np.ndarray:
        """Per pair, how much of the extrapolated (unscaled) angle YaRN keeps: 1 for the fast pairs,
        0 for the slow ones, a linear ramp between the correction dimensions (ggml's definition)."""
        if self.kind != "yarn":
            return np.zeros(n_rot // 2)

        def corr_dim(n_rotations: float) -> float:
            return n_rot * math.log(self.n_ctx_orig / (n_rotations * 2 * math.pi)) / (2 * math.log(freq_base))

        low = max(0.0, math.floor(corr_dim(self.beta_fast)))
        high = min(n_rot - 1.0, math.ceil(corr_dim(self.beta_slow)))
        y = (np.arange(n_rot // 2) - low) / max(0.001, high - low)
        return 1.0 - np.clip(y, 0.0, 1.0)

    def mscale(self) -> float:
        """cos/sin magnitude. With YaRN, llama.cpp's context factor get_mscale(f, 1) / get_mscale(f, log_mul)
        / (1 + 0.1 ln f) times the kernel's own (1 + 0.1 ln f); always times `rope.scaling.attn_factor`."""
        if self.kind != "yarn":
            return self.attn_factor
        factor = 1.0 / self.freq_scale

        def get_mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0

        attn = get_mscale(factor, 1.0)
        if self.log_mul != 0.0:
            attn /= get_mscale(factor, self.log_mul)
        return attn * self.attn_factor


def rope_from_gguf(g: GGUFFile, backend: Backend, freq_base: float, neox: bool, n_rot: int) -> Rope:
    """The model's RoPE (its full-attention layers) from the file's keys and factor tensors."""
    if n_rot <= 0 or n_rot % 2:
        raise UnsupportedModelError(f"unsupported rope.dimension_count {n_rot}")
    s = _Scaling.from_gguf(g)
    ramp = s.yarn_ramp(n_rot, freq_base)
    base_scale = s.freq_scale * (1.0 - ramp) + ramp  # YaRN's mix; freq_scale everywhere without YaRN

    def table(factors_name: str) -> RopeTable:
        factors = np.ones(n_rot // 2)
        if factors_name in g.tensors:
            factors = np.asarray(g.tensors[factors_name].data, dtype=np.float64)
            if factors.shape != (n_rot // 2,):
                raise UnsupportedModelError(f"{factors_name} has {factors.shape}, not ({n_rot // 2},)")
        pair_scale = (base_scale / factors).astype(np.float32)
        return RopeTable(backend.upload(pair_scale), float(np.float32(s.mscale())))

    if "rope_freqs.weight" in g.tensors:  # Llama 3's factors apply at every context size
        return Rope(freq_base, neox, table("rope_freqs.weight"), None, s.n_ctx_orig)
    long = table("rope_factors_long.weight") if "rope_factors_long.weight" in g.tensors else None
    return Rope(freq_base, neox, table("rope_factors_short.weight"), long, s.n_ctx_orig)
