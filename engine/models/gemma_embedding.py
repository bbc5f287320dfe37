"""EmbeddingGemma (`gemma-embedding`): Gemma 3's layer run as a non-causal encoder.

RMSNorms (stored with Gemma's +1), a scaled token embedding (sqrt(n_embd)), per-head Q/K norms, NeoX
RoPE, queries scaled by 1/sqrt(head_dim), post-attention and post-feed-forward norms, gelu(gate) * up.
Every token sees its whole input, five of every six layers within a symmetric window of
`attention.sliding_window` positions (with `rope.freq_base_swa`); the final states are RMSNormed. The
optional sentence-transformers projections (`dense_2`, `dense_3`) follow pooling (engine/embedding.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.embedding import DenseOut, Pooler, RankHead
from engine.gguf import GGUFFile
from engine.models.encoder import EncoderAttention, EncoderHParams, EncoderModel, FeedForward, Pass, linear
from engine.models.hparams import swa_pattern
from engine.models.llama import Projection, norm_weight
from engine.models.rope import Rope


class GemmaEmbeddingLayer:
    def __init__(self, model: GemmaEmbeddingModel, g: GGUFFile, il: int) -> None:
        hp, be, p, t = model.hp, model.backend, f"blk.{il}.", g.tensors
        qkv = Projection(be, [t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"]])
        self.attn = EncoderAttention(hp, be, qkv, linear(be, g, p + "attn_output", bias=False))
        self.attn_norm = norm_weight(be, g, p + "attn_norm.weight")
        self.q_norm = norm_weight(be, g, p + "attn_q_norm.weight")
        self.k_norm = norm_weight(be, g, p + "attn_k_norm.weight")
        self.post_attn_norm = norm_weight(be, g, p + "post_attention_norm.weight")
        self.ffn_norm = norm_weight(be, g, p + "ffn_norm.weight")
        self.post_ffn_norm = norm_weight(be, g, p + "post_ffw_norm.weight")
        gate_up = Projection(be, [t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]])
        self.ffn = FeedForward(be, gate_up, linear(be, g, p + "ffn_down", bias=False), "par", "gelu")

    def projections(self) -> list[Projection]:
        return self.attn.projections() + self.ffn.projections()


class GemmaEmbeddingModel(EncoderModel):
    @classmethod
    def read_hparams(cls, g: GGUFFile) -> EncoderHParams:
        hp = EncoderHParams.from_gguf(g, eps_key="attention.layer_norm_rms_epsilon")
        return replace(
            hp,
            causal=False,  # llama.cpp: embeddings do not use causal attention, whatever the file says
            sliding_window=int(g.arch_value("attention.sliding_window")),
            swa_layers=swa_pattern(g, hp.n_layer, 6),
        )

    def read_inputs(self, g: GGUFFile) -> None:
        hp, be = self.hp, self.backend
        g.tensors.get("output.weight")  # llama.cpp loads an output head it never uses for embeddings
        self.output_norm = norm_weight(be, g, "output_norm.weight")
        self.rope = Rope.plain(be, hp.rope_base, neox=True, n_rot=hp.n_rot)
        self.rope_swa = Rope.plain(be, hp.rope_base_swa, neox=True, n_rot=hp.n_rot)

    def read_pooler(self, g: GGUFFile) -> Pooler:
        be = self.backend
        return Pooler(RankHead.from_gguf(g, self.hp.arch, be), "first", DenseOut.from_gguf(g, be))

    def read_layer(self, g: GGUFFile, il: int) -> GemmaEmbeddingLayer:
        return GemmaEmbeddingLayer(self, g, il)

    def rms(self, x: Any, weight: Any) -> Any:
        out = self.backend.empty(x.shape)
        self.backend.rmsnorm(x, weight, self.hp.norm_eps, out)
        return out

    def head_rms(self, x: Any, weight: Any) -> None:
        flat = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
        self.backend.rmsnorm(flat, weight, self.hp.norm_eps, flat)

    def embed(self, batch: Any) -> Any:
        x = super().embed(batch)
        self.backend.scale_inplace(x, float(self.hp.n_embd) ** 0.5)
        return x

    def layer_forward(self, il: int, layer: GemmaEmbeddingLayer, x: Any, step: Pass) -> Any:
        be, hp = self.backend, self.hp
        q, k, v = layer.attn.heads(self.rms(x, layer.attn_norm))
        swa = bool(hp.swa_layers[il])
        rope = self.rope_swa if swa else self.rope
        self.head_rms(q, layer.q_norm)
        rope.apply(be, q, step.positions, 0)
        self.head_rms(k, layer.k_norm)
        rope.apply(be, k, step.positions, 0)
        be.scale_inplace(q.reshape(q.shape[0], -1), hp.attn_scale)
        attn = layer.attn.attend(q, k, v, step, hp.sliding_window if swa else 0, scale=1.0)
        sa_out = self.rms(attn, layer.post_attn_norm)
        be.add_inplace(sa_out, x)
        out = self.rms(layer.ffn(self.rms(sa_out, layer.ffn_norm)), layer.post_ffn_norm)
        be.add_inplace(out, sa_out)
        return out

    def final(self, x: Any) -> Any:
        return self.rms(x, self.output_norm)
