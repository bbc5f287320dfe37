"""ModernBERT (`modern-bert`: gte-modernbert, granite-embedding r2): a pre-LayerNorm encoder with RoPE.

LayerNorms without biases (the first layer has no attention norm), one fused Q|K|V matrix, NeoX RoPE,
and local layers: every third layer (0, 3, ...) attends to the whole input, the others to a symmetric
window of `attention.sliding_window` positions with their own RoPE base (`rope.freq_base_swa`). The
feed-forward is GEGLU over one fused up matrix (SwiGLU where `hidden_activation` says silu), and the
final states are LayerNormed. A classifier (`cls` dense + GELU + `cls.norm`, then `cls.output`) reads
the mean of the states unless `classifier.pooling_type` says CLS (llama.cpp's default for these).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.embedding import Pooler, RankHead
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.models.encoder import (
    POOLING_NAMES,
    EncoderAttention,
    EncoderHParams,
    EncoderModel,
    FeedForward,
    LayerNorm,
    Pass,
    linear,
    qkv_projection,
)
from engine.models.llama import Projection
from engine.models.rope import Rope

# `hidden_activation` -> the fused feed-forward's activation (llama.cpp's names; relu/reglu not built).
_ACTIVATIONS = {"gelu": "gelu", "geglu": "gelu", "silu": "silu", "swish": "silu", "swiglu": "silu"}


def dense_first_pattern(g: GGUFFile, n_layer: int, default: int) -> tuple[bool, ...]:
    """llama.cpp's load_swa_pattern with dense_first: a per-layer array, or a period n where the first
    layer of every n is global."""
    pattern = g.arch_value("attention.sliding_window_pattern", default)
    if not isinstance(pattern, int):
        return tuple(bool(v) for v in pattern)
    return tuple(pattern == 0 or il % pattern != 0 for il in range(n_layer))


class ModernBertLayer:
    def __init__(self, model: ModernBertModel, g: GGUFFile, il: int) -> None:
        hp, be, p = model.hp, model.backend, f"blk.{il}."
        has_norm = il != 0 or p + "attn_norm.weight" in g.tensors  # layer 0's is the identity
        self.attn_norm = LayerNorm(be, g, p + "attn_norm", hp.norm_eps, bias=False) if has_norm else None
        out = linear(be, g, p + "attn_output", bias=False)
        self.attn = EncoderAttention(hp, be, qkv_projection(be, g, hp, p), out)
        self.ffn_norm = LayerNorm(be, g, p + "ffn_norm", hp.norm_eps, bias=False)
        up, down = linear(be, g, p + "ffn_up", bias=False), linear(be, g, p + "ffn_down", bias=False)
        self.ffn = FeedForward(be, up, down, "geglu", model.activation)

    def projections(self) -> list[Projection]:
        return self.attn.projections() + self.ffn.projections()


class ModernBertModel(EncoderModel):
    @classmethod
    def read_hparams(cls, g: GGUFFile) -> EncoderHParams:
        hp = EncoderHParams.from_gguf(g)
        window = int(g.arch_value("attention.sliding_window", 0))
        if window <= 0:
            return hp
        return replace(hp, sliding_window=window, swa_layers=dense_first_pattern(g, hp.n_layer, 3))

    def read_inputs(self, g: GGUFFile) -> None:
        hp, be = self.hp, self.backend
        act = str(g.arch_value("hidden_activation", "gelu"))
        if act not in _ACTIVATIONS and g.arch_value("hidden_activation") is not None:
            raise UnsupportedModelError(f"modern-bert hidden_activation {act!r} is not supported")
        self.activation = _ACTIVATIONS.get(act, "gelu")
        self.embd_norm = LayerNorm(be, g, "token_embd_norm", hp.norm_eps, bias=False)
        self.output_norm = LayerNorm(be, g, "output_norm", hp.norm_eps, bias=False)
        self.rope = Rope.plain(be, hp.rope_base, neox=True, n_rot=hp.n_rot)
        self.rope_swa = Rope.plain(be, hp.rope_base_swa, neox=True, n_rot=hp.n_rot)

    def read_pooler(self, g: GGUFFile) -> Pooler:
        stored = int(g.arch_value("classifier.pooling_type", -1))
        mean = stored < 0 or POOLING_NAMES[stored] == "mean"  # unspecified: llama.cpp's default, mean
        head = RankHead.from_gguf(g, self.hp.arch, self.backend, self.hp.norm_eps)
        return Pooler(head, rank_input="mean" if mean else "last" if self.hp.causal else "first")

    def read_layer(self, g: GGUFFile, il: int) -> ModernBertLayer:
        return ModernBertLayer(self, g, il)

    def embed(self, batch: Any) -> Any:
        x = super().embed(batch)
        return self.embd_norm(x, x)

    def layer_forward(self, il: int, layer: ModernBertLayer, x: Any, step: Pass) -> Any:
        be, hp = self.backend, self.hp
        cur = x if layer.attn_norm is None else layer.attn_norm(x)
        swa = bool(hp.swa_layers[il])
        rope = self.rope_swa if swa else self.rope
        attn = layer.attn(cur, step, rope=rope, window=hp.sliding_window if swa else 0)
        be.add_inplace(attn, x)  # the attention's residual: the feed-forward's input
        out = layer.ffn(layer.ffn_norm(attn))
        be.add_inplace(out, attn)
        return out

    def final(self, x: Any) -> Any:
        return self.output_norm(x)
