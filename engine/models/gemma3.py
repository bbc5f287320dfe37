"""Gemma 3: the llama decoder plus q/k norms, post-norms, a scaled embedding, GELU and sliding windows.

The RMSNorm weights in the GGUF already include Gemma's +1, so they are used as stored. Layers alternate
five sliding-window layers (unscaled RoPE, base 10000) with one global layer (the model's RoPE).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile
from engine.memory.kv import KVCache
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, LlamaModel, norm_weight
from engine.models.rope import Rope


class Gemma3Layer(LlamaLayer):
    def __init__(self, backend: Backend, g: GGUFFile, hp: HParams, il: int) -> None:
        super().__init__(backend, g, hp, il)
        p = f"blk.{il}."
        self.q_norm = norm_weight(backend, g, p + "attn_q_norm.weight")
        self.k_norm = norm_weight(backend, g, p + "attn_k_norm.weight")
        self.post_attn_norm = norm_weight(backend, g, p + "post_attention_norm.weight")
        self.post_ffn_norm = norm_weight(backend, g, p + "post_ffw_norm.weight")


class Gemma3Model(LlamaModel):
    layer_class = Gemma3Layer

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        super().__init__(g, backend, on_layer)
        hp = self.hp
        self.rope_swa = Rope.plain(backend, hp.rope_base_swa, hp.rope_neox, hp.n_rot)

    def rope_for(self, il: int) -> Rope:
        return self.rope_swa if self.hp.swa_layers[il] else self.rope

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        x = super().embed(tokens)
        self.backend.scale_inplace(x, self.hp.embed_scale)
        return x

    def qk_norm(self, layer: Gemma3Layer, q: np.ndarray, k: np.ndarray) -> None:
        self.head_norm(q, layer.q_norm)
        self.head_norm(k, layer.k_norm)

    def attention_block(self, il: int, layer: Gemma3Layer, x: np.ndarray, batch: Batch, kv: KVCache) -> None:
        (o,) = layer.attn_out(self.attention(il, layer, self.norm(x, layer.attn_norm), batch, kv))
        self.backend.add_inplace(x, self.norm(o, layer.post_attn_norm))

    def ffn_block(self, layer: Gemma3Layer, x: np.ndarray) -> None:
        gate, up = layer.gate_up(self.norm(x, layer.ffn_norm))
        self.backend.gelu_mul(gate, up, gate)
        (down,) = layer.down(gate)
        self.backend.add_inplace(x, self.norm(down, layer.post_ffn_norm))
