"""Qwen3.5 (`qwen35`): a hybrid decoder of Gated DeltaNet linear-attention layers and, every few layers,
gated full attention; each layer's SwiGLU FFN follows a post-attention RMS norm.

- Gated attention (engine/models/qwen35_layers.py): Q and an output gate from one projection, Q/K
  RMS norms per head, RoPE over the first `rope.dimension_count` dimensions (a quarter of head_dim) as
  interleaved M-RoPE turns them for text (all three positions the token's: NeoX RoPE), attention over
  the KV cache, then attention * sigmoid(gate) before the output matrix.
- Gated DeltaNet (engine/cpu/delta_net.py): Q|K|V from one projection through a causal conv of width
  `ssm.conv_kernel` and SiLU, Q and K L2-normed per head, the delta rule over a per-sequence state with
  decay exp(softplus(alpha + dt_bias) * a) and write strength sigmoid(b), then rms_norm(out) * w *
  silu(z) and the out projection.

Memory is a `HybridMemory`: a KV cache over the attention layers only and a recurrent store (conv tail
[d_conv - 1, channels], delta-rule state [value heads, d_k, d_v]) over the linear ones; `kv_index` /
`recurrent_index` map a layer to its slot. The recurrent kernels are the Backend's `delta_net`
module, which only the CPU backend has, so the model refuses any other backend at load. Cells cannot
move (no context shift: a recurrent state cannot be re-positioned).

Measured at Qwen3.5-4B's layer sizes (scripts/bench_qwen35.py: three Gated DeltaNet layers and one
attention layer, Q4_K_M, 2 threads, avx512-vnni, a machine shared with other jobs): the recurrent
kernels (conv, gates, delta rule, output gate) take 3.1-4.3% of a 512-token prefill step and 3.0-3.7%
of a decode step (two runs); the linear-attention blocks without their projections 3.9-4.9% and
3.3-4.1%. The matmuls take most of the rest, so the token-by-token form serves prefill too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.memory.hybrid import HybridMemory
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes, KVCache
from engine.memory.recurrent import RecurrentCache, RecurrentShape
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer
from engine.models.qwen3 import Qwen3Model
from engine.models.qwen35_layers import (
    DeltaNetLayer,
    DeltaNetShape,
    GatedAttentionLayer,
    Qwen35HParams,
    with_text_rope,
)


class Qwen35Model(Qwen3Model):
    non_causal_media = False  # its gated attention takes no per-token limits
    attention_layer: type[LlamaLayer] = GatedAttentionLayer
    recurrent_layer: type[LlamaLayer] = DeltaNetLayer
    hp: Qwen35HParams

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        if backend.delta_net is None:
            raise UnsupportedModelError(
                f"{g.architecture}: the Gated DeltaNet layers run on the CPU backend only, not {backend.name}"
            )
        kernels = self.kernels = backend.delta_net
        super().__init__(g, backend, on_layer)
        hp = self.hp
        self.delta: DeltaNetShape = hp.delta  # type: ignore[assignment]
        self.kv_index = _slots([not r for r in hp.recurrent])
        self.recurrent_index = _slots(list(hp.recurrent))
        self.k_head = self.delta.k_head()
        self.l2_weight = kernels.l2_norm_weight(self.delta.head_dim)
        self.l2_eps = kernels.l2_norm_eps(hp.rms_eps, self.delta.head_dim)
        self.rope = with_text_rope(hp, self.rope, backend)
        _skip_mtp_layers(g, hp)

    @classmethod
    def read_hparams(cls, g: GGUFFile) -> HParams:
        return Qwen35HParams.from_gguf(g)

    def layer_class(self, backend: Backend, g: GGUFFile, hp: Qwen35HParams, il: int) -> LlamaLayer:  # type: ignore[override]
        return (self.recurrent_layer if hp.recurrent[il] else self.attention_layer)(backend, g, hp, il)

    def new_cache(self, n_seq: int, n_ctx: int, types: CacheTypes = DEFAULT_CACHE_TYPES) -> HybridMemory:  # type: ignore[override]
        hp, d = self.hp, self.delta
        kv = KVCache(len(self.kv_index), n_seq, n_ctx, hp.n_kv_head, hp.head_dim, self.backend, types)
        shape = RecurrentShape(
            conv=(d.d_conv - 1, d.conv_channels), ssm=(d.n_v_heads, d.head_dim, d.head_dim)
        )
        return HybridMemory(kv, RecurrentCache(len(self.recurrent_index), n_seq, n_ctx, shape, self.backend))

    def shift_kv(self, kv: Any, seq: int, start: int, end: int, delta: int) -> None:
        raise NotImplementedError(f"{self.hp.arch}: a recurrent state cannot be shifted")

    def attention(self, il: int, layer: Any, h: np.ndarray, batch: Batch, memory: Any) -> np.ndarray:
        if self.hp.recurrent[il]:
            return self.delta_net(il, layer, h, batch, memory)
        return self.gated_attention(il, layer, h, batch, memory)

    def gated_attention(
        self, il: int, layer: GatedAttentionLayer, h: np.ndarray, batch: Batch, memory: HybridMemory
    ) -> np.ndarray:
        hp, be, n = self.hp, self.backend, h.shape[0]
        q, gate, k, v = layer.qkv(h)
        q = q.reshape(n, hp.n_head, hp.head_dim)
        k = k.reshape(n, hp.n_kv_head, hp.head_dim)
        v = v.reshape(n, hp.n_kv_head, hp.head_dim)
        self.qk_norm(layer, q, k)
        self.rope.apply(be, q, batch.positions, memory.n_ctx)
        self.rope.apply(be, k, batch.positions, memory.n_ctx)
        out = self.attend_heads(il, q, k, v, batch, memory).reshape(n, hp.n_head * hp.head_dim)
        self.kernels.sigmoid_mul(out, gate)
        return out

    def attend_heads(
        self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, batch: Batch, memory: Any
    ) -> np.ndarray:
        be, kv, i = self.backend, memory.kv, self.kv_index[il]
        be.store_kv(k, v, batch.seq_ids, batch.positions, kv.k[i], kv.v[i])
        out = be.empty(q.shape)
        be.attention(q, kv.k[i], kv.v[i], batch.seq_ids, batch.positions, 0, self.hp.attn_scale, out)
        return out

    def delta_net(
        self, il: int, layer: DeltaNetLayer, h: np.ndarray, batch: Batch, memory: HybridMemory
    ) -> np.ndarray:
        """The linear-attention block before its out projection: [T, value_dim]."""
        be, d, n = self.backend, self.delta, h.shape[0]
        state, r = memory.recurrent, self.recurrent_index[il]
        mixed, z, b, alpha = layer.qkv(h)
        conv = be.empty(mixed.shape)
        self.kernels.conv1d_silu(mixed, batch.seq_ids, layer.conv_w, state.conv[r], conv)
        q, k, v = be.split_cols(conv, [d.key_dim, d.key_dim, d.value_dim])
        for x in (q, k):
            heads = x.reshape(n * d.n_k_heads, d.head_dim)
            be.rmsnorm(heads, self.l2_weight, self.l2_eps, heads)
        g, beta = be.empty((n, d.n_v_heads)), be.empty((n, d.n_v_heads))
        self.kernels.decay_and_beta(alpha, b, layer.dt_bias, layer.a, g, beta)
        out = be.empty((n, d.n_v_heads, d.head_dim))
        heads_k, heads_v = (n, d.n_k_heads, d.head_dim), (n, d.n_v_heads, d.head_dim)
        self.kernels.gated_delta_rule(
            q.reshape(heads_k),
            k.reshape(heads_k),
            v.reshape(heads_v),
            g,
            beta,
            batch.seq_ids,
            self.k_head,
            state.ssm[r],
            out,
        )
        rows = out.reshape(n * d.n_v_heads, d.head_dim)
        be.rmsnorm(rows, layer.ssm_norm, self.hp.rms_eps, rows)
        be.silu_mul(z, out.reshape(n, d.value_dim), z)
        return z


def _slots(flags: list[bool]) -> dict[int, int]:
    """layer -> its index among the layers whose flag is set."""
    return {il: i for i, il in enumerate(il for il, f in enumerate(flags) if f)}


def _skip_mtp_layers(g: GGUFFile, hp: Qwen35HParams) -> None:
    """The multi-token-prediction block's tensors are known and left unused (as llama.cpp leaves them
    unless it drafts with them): marked read, so the load does not refuse the file for them."""
    extra = tuple(f"blk.{il}." for il in range(hp.n_layer, hp.n_layer_all))
    for name in [n for n in g.tensors if extra and n.startswith(extra)]:
        g.tensors.get(name)
