"""Qwen3: the llama decoder plus an RMSNorm of each query and key head before RoPE (NeoX style).

Llamba carries it for rerankers (Qwen3-Reranker's GGUFs add the `cls.output` classifier that pooling
rank uses, engine/embedding.py); the decoder is the same for generation.
"""

from __future__ import annotations

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile
from engine.kv import KVCache
from engine.models.llama import LlamaLayer, LlamaModel


class Qwen3Layer(LlamaLayer):
    def __init__(self, backend: Backend, g: GGUFFile, il: int) -> None:
        super().__init__(backend, g, il)
        p = f"blk.{il}."
        self.q_norm = backend.upload(np.array(g.tensors[p + "attn_q_norm.weight"].data, dtype=np.float32))
        self.k_norm = backend.upload(np.array(g.tensors[p + "attn_k_norm.weight"].data, dtype=np.float32))


class Qwen3Model(LlamaModel):
    layer_class = Qwen3Layer

    def head_norm(self, x: np.ndarray, weight: np.ndarray) -> None:
        """RMSNorm of each head of x[T, heads, head_dim], in place."""
        flat = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
        self.backend.rmsnorm(flat, weight, self.hp.rms_eps, flat)

    def attention_block(self, il: int, layer: Qwen3Layer, x: np.ndarray, batch: Batch, kv: KVCache) -> None:
        hp = self.hp
        q, k, v = self.qkv_heads(layer, self.norm(x, layer.attn_norm))
        self.head_norm(q, layer.q_norm)
        self.head_norm(k, layer.k_norm)
        self.backend.rope(q, batch.positions, hp.rope_base, hp.rope_neox)
        self.backend.rope(k, batch.positions, hp.rope_base, hp.rope_neox)
        (o,) = layer.attn_out(self.attend(il, q, k, v, batch, kv))
        self.backend.add_inplace(x, o)
