"""Qwen2-MoE (`qwen2moe`: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): llama's attention (optional Q/K/V biases,
NeoX RoPE) and in every layer routed experts plus a shared expert.

Routing: softmax over the experts and the top `expert_used_count`, their probabilities used as they are
(llama.cpp's qwen2moe does not renormalise them). The shared expert is a dense SwiGLU
(`ffn_{gate,up,down}_shexp`, `expert_shared_feed_forward_length` wide) on the same normed input, its
output scaled per token by sigmoid(h . `ffn_gate_inp_shexp`) and added after the routed experts' sum,
as llama.cpp adds it (its sigmoid is silu(g) / g: the same here, on the host).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, LlamaModel, Projection
from engine.models.moe import MoeLayerMixin, MoeModelMixin


class Qwen2MoeLayer(MoeLayerMixin, LlamaLayer):
    normalize = False

    def init_ffn(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> None:
        super().init_ffn(backend, g, hp, p)
        t = g.tensors
        self.shexp_gate_up = Projection(
            backend, [t[p + "ffn_gate_shexp.weight"], t[p + "ffn_up_shexp.weight"]]
        )
        self.shexp_down = Projection(backend, [t[p + "ffn_down_shexp.weight"]])
        gate = t[p + "ffn_gate_inp_shexp.weight"]  # one row: {n_embd} (or 1 x n_embd)
        data = np.asarray(gate.data).reshape(1, -1)
        self.shexp_gate = backend.pack_router_weight(data, gate.ggml_type, (1, hp.n_embd))  # batch-invariant

    def projections(self) -> list[Projection]:
        return [*super().projections(), self.shexp_gate_up, self.shexp_down]


class Qwen2MoeModel(MoeModelMixin, LlamaModel):
    layer_class = Qwen2MoeLayer

    def ffn_block(self, layer: Qwen2MoeLayer, x: Any) -> None:
        be = self.backend
        h = self.norm(x, layer.ffn_norm)
        y, rows, weights = layer.moe(h)
        gate, up = layer.shexp_gate_up(h)
        be.silu_mul(gate, up, gate)
        (shared,) = layer.shexp_down(gate)
        logit = be.empty((h.shape[0], 1))
        be.router_matmul(h, layer.shexp_gate, logit)
        g = np.asarray(be.download(logit), dtype=np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            sigmoid = (g / (np.float32(1.0) + np.exp(-g))) / g  # ggml's silu(g) / g
        rows = np.concatenate([rows, len(rows) * rows.shape[1] + np.arange(len(rows))[:, None]], axis=1)
        weights = np.concatenate([weights, sigmoid], axis=1)
        be.add_inplace(x, be.combine_experts([y, shared], rows, weights))
