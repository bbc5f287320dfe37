"""Qwen3.5-MoE (`qwen35moe`: Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's hybrid trunk
(engine/models/qwen35.py) with, in every layer, routed experts plus a shared expert.

As llama.cpp's llama_model_qwen35moe: softmax over the experts, the top `expert_used_count`, their
probabilities divided by their sum (engine/models/moe.py); the shared expert is a dense SwiGLU
(`ffn_{gate,up,down}_shexp`) on the same normed input, scaled per token by sigmoid(h .
`ffn_gate_inp_shexp`) and added after the routed experts' sum. The files carry no dense
`feed_forward_length`: the experts' widths are their tensors'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, Projection
from engine.models.moe import MoeLayerMixin, MoeModelMixin
from engine.models.qwen35 import Qwen35Model
from engine.models.qwen35_layers import DeltaNetLayer, GatedAttentionLayer


class SharedExpertMixin:
    """Routed experts plus the gated shared expert (before MoeLayerMixin in the bases)."""

    def init_ffn(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> None:
        super().init_ffn(backend, g, hp, p)  # type: ignore[misc]
        t = g.tensors
        self.shexp_gate_up = Projection(
            backend, [t[p + "ffn_gate_shexp.weight"], t[p + "ffn_up_shexp.weight"]]
        )
        self.shexp_down = Projection(backend, [t[p + "ffn_down_shexp.weight"]])
        gate = t[p + "ffn_gate_inp_shexp.weight"]  # one row: {n_embd}
        data = np.asarray(gate.data).reshape(1, -1)
        self.shexp_gate = backend.pack_router_weight(data, gate.ggml_type, (1, hp.n_embd))  # batch-invariant

    def projections(self) -> list[Projection]:
        return [*super().projections(), self.shexp_gate_up, self.shexp_down]  # type: ignore[misc]


class Qwen35MoeAttentionLayer(SharedExpertMixin, MoeLayerMixin, GatedAttentionLayer):
    pass


class Qwen35MoeDeltaNetLayer(SharedExpertMixin, MoeLayerMixin, DeltaNetLayer):
    pass


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml's float32 sigmoid: 1 / (1 + expf(-x))."""
    with np.errstate(over="ignore"):
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


class Qwen35MoeModel(MoeModelMixin, Qwen35Model):
    attention_layer: type[LlamaLayer] = Qwen35MoeAttentionLayer
    recurrent_layer: type[LlamaLayer] = Qwen35MoeDeltaNetLayer

    def ffn_block(self, layer: Any, x: Any) -> None:
        be = self.backend
        h = self.norm(x, layer.ffn_norm)
        y, rows, weights = layer.moe(h)
        gate, up = layer.shexp_gate_up(h)
        be.silu_mul(gate, up, gate)
        (shared,) = layer.shexp_down(gate)
        logit = be.empty((h.shape[0], 1))
        be.router_matmul(h, layer.shexp_gate, logit)
        shared_weight = sigmoid(np.asarray(be.download(logit), dtype=np.float32))
        # the shared expert's output as one more rank, added after the routed ones (llama.cpp's order)
        rows = np.concatenate([rows, len(rows) * rows.shape[1] + np.arange(len(rows))[:, None]], axis=1)
        weights = np.concatenate([weights, shared_weight], axis=1)
        be.add_inplace(x, be.combine_experts([y, shared], rows, weights))
