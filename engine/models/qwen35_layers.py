"""The parts of the Qwen3.5 hybrids (`qwen35`, `qwen35moe`, `qwen3next`): their hyper-parameters and their
two kinds of decoder layer. engine/models/qwen35.py runs them.

Hyper-parameters as llama.cpp's llama_model_qwen35 / qwen3next read them: which layers are recurrent
(`attention.recurrent_layers`, else every `full_attention_interval`-th layer, 4 by default, is
attention), the Gated DeltaNet's shape (`ssm.conv_kernel`, `ssm.state_size`, `ssm.group_count`: key
heads, `ssm.time_step_rank`: value heads, `ssm.inner_size`), the M-RoPE sections, and the trunk's
length: a file with a multi-token-prediction block (`nextn_predict_layers`) has it as extra layers
after the trunk, which llama.cpp skips unless asked to draft with it, as Llamba skips it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile, Tensor, UnsupportedModelError
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, Projection, norm_weight
from engine.models.qwen3 import Qwen3Layer


@dataclass(frozen=True)
class DeltaNetShape:
    d_conv: int
    n_k_heads: int
    n_v_heads: int
    head_dim: int  # keys' and values' (llama.cpp requires ssm.inner_size / n_v_heads = ssm.state_size)
    grouped: bool  # value head h reads key head h // (n_v / n_k) (Qwen3-Next), else h % n_k (tiled)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def k_head(self) -> np.ndarray:
        """The key head each value head reads."""
        heads = np.arange(self.n_v_heads, dtype=np.int64)
        return heads // (self.n_v_heads // self.n_k_heads) if self.grouped else heads % self.n_k_heads

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> DeltaNetShape:
        arch = g.architecture
        keys = (
            "ssm.conv_kernel",
            "ssm.group_count",
            "ssm.time_step_rank",
            "ssm.state_size",
            "ssm.inner_size",
        )
        missing = [k for k in keys if g.arch_value(k) is None]
        if missing:
            raise UnsupportedModelError(f"{arch}: missing {arch}.{missing[0]}")
        d_conv, n_k, n_v, d_state, d_inner = (int(g.arch_value(k)) for k in keys)
        if n_k <= 0 or n_v % n_k or d_inner != n_v * d_state or d_conv < 2:
            raise UnsupportedModelError(
                f"{arch}: unsupported Gated DeltaNet shape (conv {d_conv}, {n_k} key heads, {n_v} value "
                f"heads, state {d_state}, inner {d_inner})"
            )
        return cls(d_conv, n_k, n_v, d_state, arch == "qwen3next")


@dataclass(frozen=True)
class Qwen35HParams(HParams):
    recurrent: tuple[bool, ...] = ()  # per trunk layer: Gated DeltaNet (True) or gated attention
    delta: DeltaNetShape | None = None
    rope_sections: tuple[int, ...] = ()  # Qwen3.5's M-RoPE sections (t, h, w, e), in rotated pairs
    n_layer_all: int = 0  # block_count: the trunk and a multi-token-prediction block, if any

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> Qwen35HParams:
        base = HParams.from_gguf(g)
        n_all = base.n_layer
        n_layer = n_all - int(g.arch_value("nextn_predict_layers", 0))
        sections: tuple[int, ...] = ()
        if g.architecture != "qwen3next":
            value = g.arch_value("rope.dimension_sections")
            if value is None:
                raise UnsupportedModelError(
                    f"{g.architecture}: missing {g.architecture}.rope.dimension_sections"
                )
            sections = tuple(int(s) for s in value)
        fields = {f: getattr(base, f) for f in HParams.__dataclass_fields__}
        return cls(
            **fields | {"n_layer": n_layer, "rope_neox": True, "swa_layers": (False,) * n_layer},
            recurrent=recurrent_layers(g, n_layer, n_all),
            delta=DeltaNetShape.from_gguf(g),
            rope_sections=sections,
            n_layer_all=n_all,
        )


def recurrent_layers(g: GGUFFile, n_layer: int, n_all: int) -> tuple[bool, ...]:
    """Which trunk layers are Gated DeltaNet: the per-layer `attention.recurrent_layers`, else all but
    every `full_attention_interval`-th (llama.cpp's default interval 4)."""
    flags = g.arch_value("attention.recurrent_layers")
    if flags is not None:
        values = tuple(bool(f) for f in flags)
        if len(values) != n_all:
            raise UnsupportedModelError(
                f"{g.architecture}: attention.recurrent_layers has {len(values)} layers"
            )
        return values[:n_layer]
    interval = int(g.arch_value("full_attention_interval", 4))
    return tuple((il + 1) % interval != 0 for il in range(n_layer))


def text_rope_pairs(sections: tuple[int, ...], n_pairs: int) -> np.ndarray:
    """Per rotated pair, whether interleaved M-RoPE turns it by the token's position (1.0) or by the
    fourth section's position, which llama.cpp sets to 0 for text (0.0: no rotation); ggml's sector
    rule (ggml_mrope_cache_init, imrope). With text positions t = h = w, the rest is NeoX RoPE."""
    s = [*sections, 0, 0, 0, 0][:4]
    total = sum(s)
    if total <= 0:
        raise UnsupportedModelError(f"rope.dimension_sections {list(sections)} has no rotated pairs")
    turns = np.zeros(n_pairs, dtype=np.float32)
    for i in range(n_pairs):
        sector = i % total
        chosen = (sector % 3 == 1 and sector < 3 * s[1]) or (sector % 3 == 2 and sector < 3 * s[2])
        turns[i] = chosen or (sector % 3 == 0 and sector < 3 * s[0])
    return turns


def rows_of(t: Tensor, rows: np.ndarray, name: str) -> Tensor:
    """Some rows of a stored matrix as a matrix of their own (rows are independent in every format)."""
    return Tensor(name, t.ggml_type, (len(rows), t.shape[1]), np.ascontiguousarray(t.data[rows]))


class GatedAttentionLayer(Qwen3Layer):
    """Full attention: Qwen3's (per-head Q/K RMS norms) with an output gate. `attn_q` holds each head's
    query rows then its gate rows; they are regrouped at load (all queries, then all gates), so one
    fused matmul gives Q, gate, K and V as plain column blocks."""

    ffn_norm_name = "post_attention_norm.weight"

    def qkv_projection(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> Projection:
        t = g.tensors
        q = t[p + "attn_q.weight"]
        if q.shape[0] != 2 * hp.n_head * hp.head_dim:
            raise UnsupportedModelError(
                f"{q.name} has {q.shape[0]} rows, not 2 x {hp.n_head} x {hp.head_dim}"
            )
        rows = np.arange(q.shape[0]).reshape(hp.n_head, 2, hp.head_dim)
        query, gate = (rows_of(q, rows[:, i].reshape(-1), q.name) for i in (0, 1))
        return Projection(backend, [query, gate, t[p + "attn_k.weight"], t[p + "attn_v.weight"]])


class DeltaNetLayer(LlamaLayer):
    """Linear attention: the in-projections (Q|K|V, z, beta's and alpha's logits; one fused matmul where
    their types agree), the conv kernel [d_conv, channels] (transposed at load: each tap's channels
    contiguous), dt_bias, a = -exp(A_log), the gated norm's weight and the out projection (`attn_out`,
    so the llama decoder's block applies it)."""

    ffn_norm_name = "post_attention_norm.weight"

    def __init__(self, backend: Backend, g: GGUFFile, hp: Qwen35HParams, il: int) -> None:  # type: ignore[override]
        t, p = g.tensors, f"blk.{il}."
        assert hp.delta is not None
        d = hp.delta
        self.attn_norm = norm_weight(backend, g, p + "attn_norm.weight")
        self.ffn_norm = norm_weight(backend, g, p + self.ffn_norm_name)
        if p + "ssm_in.weight" in t:
            raise UnsupportedModelError(
                f"{g.architecture}: legacy fused {p}ssm_in.weight (reconvert the model)"
            )
        beta, alpha = self.beta_alpha(g, d, p)
        self.qkv = Projection(backend, [t[p + "attn_qkv.weight"], t[p + "attn_gate.weight"], beta, alpha])
        self.attn_out = Projection(backend, [t[p + "ssm_out.weight"]])
        conv = np.asarray(t[p + "ssm_conv1d.weight"].data, dtype=np.float32)
        if conv.shape != (d.conv_channels, d.d_conv):
            raise UnsupportedModelError(
                f"{p}ssm_conv1d.weight is {conv.shape}, not {(d.conv_channels, d.d_conv)}"
            )
        self.conv_w = backend.upload(np.ascontiguousarray(conv.T))
        self.dt_bias = norm_weight(backend, g, p + "ssm_dt.bias")
        self.a = norm_weight(backend, g, p + "ssm_a")
        self.ssm_norm = norm_weight(backend, g, p + "ssm_norm.weight")
        self.init_ffn(backend, g, hp, p)

    def beta_alpha(self, g: GGUFFile, d: DeltaNetShape, p: str) -> tuple[Any, Any]:
        """The beta and alpha logit matrices [n_v_heads, n_embd] (Qwen3.5 stores them apart)."""
        return g.tensors[p + "ssm_beta.weight"], g.tensors[p + "ssm_alpha.weight"]


class GroupedDeltaNetLayer(DeltaNetLayer):
    """Qwen3-Next's: beta and alpha logits in one `ssm_ba` whose rows go per key head (that head's value
    heads' b, then their a); split at load into value-head order."""

    def beta_alpha(self, g: GGUFFile, d: DeltaNetShape, p: str) -> tuple[Any, Any]:
        ba = g.tensors[p + "ssm_ba.weight"]
        r = d.n_v_heads // d.n_k_heads
        base = (np.arange(d.n_k_heads)[:, None] * 2 * r + np.arange(r)[None, :]).reshape(-1)
        return rows_of(ba, base, ba.name + ":b"), rows_of(ba, base + r, ba.name + ":a")


def with_text_rope(hp: Qwen35HParams, rope: Any, backend: Backend) -> Any:
    """The model's RoPE with the pairs that M-RoPE turns by the (zero) fourth position held still."""
    if not hp.rope_sections:
        return rope
    turns = text_rope_pairs(hp.rope_sections, hp.n_rot // 2)
    if turns.all():
        return rope
    table = replace(rope.table, pair_scale=backend.upload(np.asarray(rope.table.pair_scale) * turns))
    return replace(rope, table=table)
