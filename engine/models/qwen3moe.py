"""Qwen3-MoE (`qwen3moe`: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): Qwen3's attention (per-head
Q/K RMS norms, NeoX RoPE, head_dim from `attention.key_length`) and routed experts in every layer.

Routing as llama.cpp's: softmax over all experts, the top `expert_used_count` (8 of 128 in the real
models), their probabilities divided by their sum; no shared expert. The experts' width is the 3-D
tensors' (`expert_feed_forward_length`, 768 in Qwen3-30B-A3B).
"""

from __future__ import annotations

from engine.models.moe import MoeLayerMixin, MoeModelMixin
from engine.models.qwen3 import Qwen3Layer, Qwen3Model


class Qwen3MoeLayer(MoeLayerMixin, Qwen3Layer):
    pass


class Qwen3MoeModel(MoeModelMixin, Qwen3Model):
    layer_class = Qwen3MoeLayer
