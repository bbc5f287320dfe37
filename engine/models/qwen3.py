"""Qwen3 (dense): the llama decoder plus a per-head RMSNorm of queries and keys before RoPE.

No Q/K/V biases (Qwen2 had them); RoPE is NeoX-style with the file's base (1e6), head_dim comes from
`attention.key_length` (128 also where n_embd / n_head is not: Qwen3-0.6B's 1024 / 16), and the output
head is `output.weight` or the tied embedding. Qwen3-Reranker GGUFs add the `cls.output` classifier
that pooling rank uses (engine/embedding.py).
"""

from __future__ import annotations

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, LlamaModel, norm_weight


class Qwen3Layer(LlamaLayer):
    def __init__(self, backend: Backend, g: GGUFFile, hp: HParams, il: int) -> None:
        super().__init__(backend, g, hp, il)
        p = f"blk.{il}."
        self.q_norm = norm_weight(backend, g, p + "attn_q_norm.weight")
        self.k_norm = norm_weight(backend, g, p + "attn_k_norm.weight")


class Qwen3Model(LlamaModel):
    layer_class = Qwen3Layer

    def qk_norm(self, layer: Qwen3Layer, q: np.ndarray, k: np.ndarray) -> None:
        self.head_norm(q, layer.q_norm)
        self.head_norm(k, layer.k_norm)
