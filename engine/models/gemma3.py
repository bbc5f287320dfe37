"""Gemma 3: the llama decoder plus q/k norms, post-norms, a scaled embedding, GELU and sliding windows.

The RMSNorm weights in the GGUF already include Gemma's +1, so they are used as stored. Layers alternate
five sliding-window layers (RoPE base 10000) with one global layer (the model's RoPE base).
"""

from __future__ import annotations

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile
from engine.kv import KVCache
from engine.models.llama import LlamaLayer, LlamaModel


class Gemma3Layer(LlamaLayer):
    def __init__(self, backend: Backend, g: GGUFFile, il: int) -> None:
        super().__init__(backend, g, il)
        p = f"blk.{il}."

        def weight(name: str) -> np.ndarray:
            return backend.upload(np.array(g.tensors[p + name].data, dtype=np.float32))

        self.q_norm = weight("attn_q_norm.weight")
        self.k_norm = weight("attn_k_norm.weight")
        self.post_attn_norm = weight("post_attention_norm.weight")
        self.post_ffn_norm = weight("post_ffw_norm.weight")


class Gemma3Model(LlamaModel):
    layer_class = Gemma3Layer

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        x = super().embed(tokens)
        self.backend.scale_inplace(x, self.hp.embed_scale)
        return x

    def head_norm(self, x: np.ndarray, weight: np.ndarray) -> None:
        """RMSNorm of each head of x[T, heads, head_dim], in place."""
        flat = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
        self.backend.rmsnorm(flat, weight, self.hp.rms_eps, flat)

    def attention_block(self, il: int, layer: Gemma3Layer, x: np.ndarray, batch: Batch, kv: KVCache) -> None:
        hp = self.hp
        q, k, v = self.qkv_heads(layer, self.norm(x, layer.attn_norm))
        self.head_norm(q, layer.q_norm)
        self.head_norm(k, layer.k_norm)
        base = self.rope_base(il)
        self.backend.rope(q, batch.positions, base, hp.rope_neox)
        self.backend.rope(k, batch.positions, base, hp.rope_neox)
        (o,) = layer.attn_out(self.attend(il, q, k, v, batch, kv))
        self.backend.add_inplace(x, self.norm(o, layer.post_attn_norm))

    def ffn_block(self, layer: Gemma3Layer, x: np.ndarray) -> None:
        gate, up = layer.gate_up(self.norm(x, layer.ffn_norm))
        self.backend.gelu_mul(gate, up, gate)
        (down,) = layer.down(gate)
        self.backend.add_inplace(x, self.norm(down, layer.post_ffn_norm))
