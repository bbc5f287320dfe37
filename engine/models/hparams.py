"""Model hyper-parameters read from GGUF metadata, for every supported architecture."""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.gguf import GGUFFile, UnsupportedModelError

# llama.cpp's rope type per architecture: NeoX (rotate halves) for these, "normal" pairs for llama and
# mistral3 (Gemma 3 sets its own below).
_NEOX_ARCHS = frozenset({"qwen2", "qwen3", "phi3", "qwen2moe", "qwen3moe", "gpt-oss"})


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_neox: bool
    attn_scale: float
    n_rot: int  # dimensions RoPE turns (Phi-4-mini: 3/4 of head_dim)
    # Sliding-window attention (Gemma 3): window size and which layers use it, with their RoPE base.
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_base_swa: float = 10000.0
    embed_scale: float = 1.0

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> HParams:
        arch = g.require_architecture()
        n_embd = int(g.arch_value("embedding_length"))
        n_head = int(g.arch_value("attention.head_count"))
        head_dim = int(g.arch_value("attention.key_length", n_embd // n_head))
        n_layer = int(g.arch_value("block_count"))
        common = dict(
            arch=arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=int(g.arch_value("feed_forward_length", 0)),  # absent: Qwen3.5-MoE
            n_head=n_head,
            n_kv_head=int(g.arch_value("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            n_vocab=len(g.metadata["tokenizer.ggml.tokens"]),
            n_ctx_train=int(g.arch_value("context_length")),
            rms_eps=float(g.arch_value("attention.layer_norm_rms_epsilon")),
            rope_base=float(g.arch_value("rope.freq_base", 10000.0)),
            n_rot=int(g.arch_value("rope.dimension_count", head_dim)),
            attn_scale=1.0 / math.sqrt(head_dim),
        )
        if not 0 < common["n_rot"] <= head_dim:
            raise UnsupportedModelError(f"rope.dimension_count {common['n_rot']} exceeds head_dim {head_dim}")
        if arch == "gemma3":
            # Every sixth layer is global; the others see a sliding window with RoPE base 10000.
            swa = tuple((i + 1) % 6 != 0 for i in range(n_layer))
            return cls(
                **common,
                rope_neox=True,
                sliding_window=int(g.arch_value("attention.sliding_window", 0)),
                swa_layers=swa,
                embed_scale=math.sqrt(n_embd),
            )
        if arch == "gpt-oss":
            return cls(
                **common,
                rope_neox=True,
                sliding_window=int(g.arch_value("attention.sliding_window")),
                swa_layers=swa_pattern(g, n_layer, 2),
                rope_base_swa=float(g.arch_value("rope.freq_base_swa", common["rope_base"])),
            )
        return cls(**common, rope_neox=arch in _NEOX_ARCHS, swa_layers=(False,) * n_layer)


def swa_pattern(g: GGUFFile, n_layer: int, default: int) -> tuple[bool, ...]:
    """Which layers see a sliding window, as llama.cpp's load_swa_pattern reads it: a per-layer array
    `attention.sliding_window_pattern`, or a period n (that key, else the family's default) where the
    last layer of every n is global."""
    pattern = g.arch_value("attention.sliding_window_pattern", default)
    if not isinstance(pattern, int):
        flags = [bool(v) for v in pattern]
        if len(flags) != n_layer:
            raise UnsupportedModelError(
                f"attention.sliding_window_pattern has {len(flags)} layers, not {n_layer}"
            )
        return tuple(flags)
    return tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
