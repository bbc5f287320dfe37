"""Qwen2 (Qwen2.5, Qwen2.5-Coder): the llama decoder plus biases on the Q, K and V projections.

Everything else is llama's: RMSNorm (eps 1e-6 from the file), SwiGLU, grouped-query attention; RoPE is
NeoX-style (rotate halves, `HParams.rope_neox`) with the model's base (1e6), and the output head is
`output.weight` when the file has one (Qwen2.5-Coder-1.5B does, Q6_K) or else the tied token embedding.
"""

from __future__ import annotations

from engine.gguf import GGUFFile, Tensor
from engine.models.llama import LlamaLayer, LlamaModel


class Qwen2Layer(LlamaLayer):
    def qkv_biases(self, g: GGUFFile, prefix: str) -> list[Tensor] | None:
        return [g.tensors[prefix + f"attn_{name}.bias"] for name in ("q", "k", "v")]


class Qwen2Model(LlamaModel):
    layer_class = Qwen2Layer
