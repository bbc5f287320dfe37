"""Gemma 4's parts (`gemma4`): its hyper-parameters, its decoder layer, the routed experts beside the dense
FFN (26B-A4B) and the per-layer embedding inputs (E2B/E4B). engine/models/gemma4.py runs them.

Hyper-parameters are read here, not in engine/models/hparams.py, because Gemma 4 gives its sliding-window
and global layers different head dims (`attention.key_length_swa` / `attention.key_length`), kv-head
counts (a per-layer `attention.head_count_kv`), rotated dimensions (`rope.dimension_count_swa`) and FFN
widths (a per-layer `feed_forward_length`), as llama.cpp's llama_model_gemma4 reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.models.hparams import HParams, swa_pattern
from engine.models.llama import LlamaLayer, Projection, norm_weight
from engine.models.moe import Dispatch, ExpertMatrices, MoeFFN, Routing


def per_layer(value: Any, n_layer: int, key: str) -> tuple[int, ...]:
    """A key llama.cpp reads with get_key_or_arr: one integer for every layer, or one per layer."""
    if isinstance(value, int):
        return (value,) * n_layer
    values = tuple(int(v) for v in value)
    if len(values) != n_layer:
        raise UnsupportedModelError(f"gemma4: {key} has {len(values)} values, not {n_layer}")
    return values


@dataclass(frozen=True)
class Gemma4HParams(HParams):
    """HParams plus Gemma 4's per-layer geometry. `head_dim` and `n_kv_head` are the widest layer's (the
    KV cache's cells); each layer attends with its own `head_dims[il]` and `kv_heads[il]`."""

    head_dims: tuple[int, ...] = ()
    kv_heads: tuple[int, ...] = ()
    n_ffs: tuple[int, ...] = ()
    n_rot_swa: int = 0
    n_layer_kv: int = 0  # layers 0 .. n_layer_kv - 1 have their own KV; the later ones reuse one of those
    n_embd_per_layer: int = 0
    softcap: float = 0.0

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> Gemma4HParams:
        n_layer, n_embd = int(required(g, "block_count")), int(required(g, "embedding_length"))
        head_full, head_swa = _head_dims(g)
        required(g, "attention.sliding_window_pattern")  # llama.cpp has no default for it
        swa = swa_pattern(g, n_layer, 0)
        n_heads = set(per_layer(required(g, "attention.head_count"), n_layer, "attention.head_count"))
        if len(n_heads) != 1:
            raise UnsupportedModelError("gemma4: per-layer attention.head_count is not supported")
        n_head = n_heads.pop()
        kv_heads = per_layer(g.arch_value("attention.head_count_kv", n_head), n_layer, "head_count_kv")
        head_dims = tuple(head_swa if s else head_full for s in swa)
        n_shared = int(g.arch_value("attention.shared_kv_layers", 0))
        _check_shared_kv(swa, n_layer - n_shared)
        return cls(
            arch="gemma4",
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=0,  # per layer: n_ffs
            n_head=n_head,
            n_kv_head=max(kv_heads),
            head_dim=max(head_dims),
            n_vocab=len(g.metadata["tokenizer.ggml.tokens"]),
            n_ctx_train=int(required(g, "context_length")),
            rms_eps=float(required(g, "attention.layer_norm_rms_epsilon")),
            rope_base=float(g.arch_value("rope.freq_base", 10000.0)),
            rope_neox=True,
            attn_scale=1.0,  # queries and keys are RMS-normed: no 1/sqrt(head_dim)
            n_rot=int(g.arch_value("rope.dimension_count", head_full)),
            sliding_window=int(required(g, "attention.sliding_window")),
            swa_layers=swa,
            rope_base_swa=float(g.arch_value("rope.freq_base_swa", 10000.0)),
            embed_scale=math.sqrt(n_embd),
            head_dims=head_dims,
            kv_heads=kv_heads,
            n_ffs=per_layer(required(g, "feed_forward_length"), n_layer, "feed_forward_length"),
            n_rot_swa=int(g.arch_value("rope.dimension_count_swa", head_swa)),
            n_layer_kv=n_layer - n_shared,
            n_embd_per_layer=int(required(g, "embedding_length_per_layer_input")),
            # llama.cpp caps at 30 when the key is absent (its hparams default); 0 turns it off
            softcap=float(g.arch_value("final_logit_softcapping", 30.0)),
        )

    def cache_layer(self, il: int) -> int:
        """Which layer's KV cells layer il reads: its own, or (a shared-KV layer) the last sliding or
        global layer that has its own, as llama.cpp's layer_reuse_cb maps them."""
        if il < self.n_layer_kv:
            return il
        return self.n_layer_kv - (2 if self.swa_layers[il] else 1)


def required(g: GGUFFile, key: str) -> Any:
    """`gemma4.<key>`, which llama.cpp requires: a file without it is refused naming the key."""
    value = g.arch_value(key)
    if value is None:
        raise UnsupportedModelError(f"gemma4: missing gemma4.{key}")
    return value


def _head_dims(g: GGUFFile) -> tuple[int, int]:
    """(global, sliding-window) head dims; keys and values must have the same (as llama.cpp requires)."""
    full = int(required(g, "attention.key_length"))
    swa = int(required(g, "attention.key_length_swa"))
    if int(g.arch_value("attention.value_length", full)) != full:
        raise UnsupportedModelError("gemma4: attention.value_length differs from attention.key_length")
    if int(g.arch_value("attention.value_length_swa", swa)) != swa:
        raise UnsupportedModelError(
            "gemma4: attention.value_length_swa differs from attention.key_length_swa"
        )
    return full, swa


def _check_shared_kv(swa: tuple[bool, ...], n_layer_kv: int) -> None:
    """Shared-KV layers read the last two layers with a cache, which must be one sliding and one global."""
    if n_layer_kv == len(swa):
        return
    if n_layer_kv < 2 or not swa[n_layer_kv - 2] or swa[n_layer_kv - 1]:
        raise UnsupportedModelError(
            f"gemma4: attention.shared_kv_layers {len(swa) - n_layer_kv} does not leave a sliding then a "
            "global layer to share"
        )


class Gemma4Experts(MoeFFN):
    """26B-A4B's routed experts: GELU experts, routed from the attention block's output RMS-normed without
    a weight, scaled by 1/sqrt(n_embd) and the router's per-dimension `ffn_gate_inp.scale`; each expert's
    output scaled by its `ffn_down_exps.scale` before the routing weights (llama.cpp's down_exps_s).
    Gate and up come as the converter writes them from Hugging Face's fused `experts.gate_up_proj`
    (`ffn_gate_up_exps`: each expert's gate rows, then its up rows), or as two tensors."""

    def __init__(self, backend: Backend, g: GGUFFile, prefix: str, hp: Gemma4HParams) -> None:
        routing = Routing.from_gguf(g, "softmax", True)
        t = g.tensors
        self.fused_width = 0  # rows of the gate half of a fused gate|up, 0: two tensors
        if prefix + "ffn_gate_up_exps.weight" in t:
            self.init_fused(backend, g, prefix, routing)
        else:
            super().__init__(backend, g, prefix, routing, activation="gelu")
        scale = np.asarray(t[prefix + "ffn_gate_inp.scale"].data, np.float32)
        # one norm weight for rms_norm, * 1/sqrt(n_embd), * scale (ggml's three ops; the same to an ulp)
        self.router_norm = backend.upload(scale * (np.float32(1.0) / np.sqrt(np.float32(hp.n_embd))))
        down = t.get(prefix + "ffn_down_exps.scale")
        self.down_scale = None if down is None else np.array(down.data, np.float32).reshape(-1)
        self.eps = hp.rms_eps

    def init_fused(self, backend: Backend, g: GGUFFile, prefix: str, routing: Routing) -> None:
        """MoeFFN's set-up for one `ffn_gate_up_exps` tensor (expert, 2 n_ff, n_embd): one matrix per
        expert, its output split into gate and up."""
        t = g.tensors
        self.backend, self.routing, self.activation, self.router_bias = backend, routing, "gelu", None
        router = t[prefix + "ffn_gate_inp.weight"]
        if router.shape[0] != routing.n_expert:
            raise UnsupportedModelError(
                f"{router.name} has {router.shape[0]} experts, not {routing.n_expert}"
            )
        self.router = backend.pack_router_weight(router.data, router.ggml_type, router.shape)
        gate_up, down = t[prefix + "ffn_gate_up_exps.weight"], t[prefix + "ffn_down_exps.weight"]
        for tensor in (gate_up, down):
            if len(tensor.shape) != 3 or tensor.shape[0] != routing.n_expert:
                raise UnsupportedModelError(
                    f"gemma4: {tensor.name} is not {routing.n_expert} experts ({tensor.shape})"
                )
        self.fused_width = gate_up.shape[1] // 2
        self.gate_up = ExpertMatrices(backend, [gate_up])
        self.down = ExpertMatrices(backend, [down])
        self.n_out = down.shape[1]
        self.last_choice = np.zeros((0, routing.n_used), np.int64)

    def activate(self, gate: Any, up: Any) -> None:
        self.backend.gelu_mul(gate, up, gate)

    def run(self, h: Any, residual: Any) -> Any:
        """The experts' weighted sum [T, n_embd] over the normed input h, routed from `residual`."""
        be = self.backend
        r = be.empty(residual.shape)
        be.rmsnorm(residual, self.router_norm, self.eps, r)
        chosen, weights = self.choose(r)
        plan = Dispatch.of(chosen)
        projected = self.gate_up(be.take_rows(h, plan.tokens), plan)
        if self.fused_width:
            projected = be.split_cols(projected[0], [self.fused_width, self.fused_width])
        gate, up = projected
        self.activate(gate, up)
        (y,) = self.down(gate, plan)
        if self.down_scale is not None:
            for expert, start, end in plan.runs:
                be.scale_inplace(y[start:end], float(self.down_scale[expert]))
        return be.combine_experts([y], plan.rows, weights)


class Gemma4Layer(LlamaLayer):
    """One decoder layer: Gemma 3's norms (q/k norms, post-norms), its own head geometry, V from K's
    projection where the layer has no `attn_v`, no K/V at all in a shared-KV layer; the dense GELU FFN,
    with routed experts beside it where the layer has a router; the per-layer input's gate and
    projection; the output scale."""

    def __init__(self, backend: Backend, g: GGUFFile, hp: Gemma4HParams, il: int) -> None:
        self.il, self.head_dim, self.n_kv = il, hp.head_dims[il], hp.kv_heads[il]
        self.has_kv = il < hp.n_layer_kv
        super().__init__(backend, g, hp, il)
        t, p = g.tensors, f"blk.{il}."
        self.q_norm = norm_weight(backend, g, p + "attn_q_norm.weight")
        self.k_norm = norm_weight(backend, g, p + "attn_k_norm.weight") if self.has_kv else None
        self.post_attn_norm = norm_weight(backend, g, p + "post_attention_norm.weight")
        self.post_ffn_norm = norm_weight(backend, g, p + "post_ffw_norm.weight")
        self.per_layer: tuple[Projection, Projection, Any] | None = None
        if hp.n_embd_per_layer:
            gate, proj = (
                Projection(backend, [t[p + "inp_gate.weight"]]),
                Projection(backend, [t[p + "proj.weight"]]),
            )
            self.per_layer = (gate, proj, norm_weight(backend, g, p + "post_norm.weight"))
        scale = t.get(p + "layer_output_scale.weight")
        self.out_scale = None if scale is None else float(np.asarray(scale.data, np.float32).reshape(-1)[0])

    def qkv_projection(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> Projection:
        """Q, K and V (or Q and K: V is K's projection), fused into one matmul; Q alone in a shared-KV
        layer (K/V weights a file may still carry there are unused, as in llama.cpp)."""
        t = g.tensors
        names = ["attn_q", "attn_k", "attn_v"]
        if not self.has_kv:
            for unused in ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight"):
                t.get(p + unused)
            names = ["attn_q"]
        elif p + "attn_v.weight" not in t:
            names = ["attn_q", "attn_k"]
        tensors = [t[f"{p}{n}.weight"] for n in names]
        heads = [hp.n_head, self.n_kv, self.n_kv]
        for tensor, n_heads in zip(tensors, heads, strict=False):  # a wrong width would fail mid-step
            if tensor.shape[0] != n_heads * self.head_dim:
                raise UnsupportedModelError(
                    f"gemma4: {tensor.name} has {tensor.shape[0]} rows, not {n_heads} x {self.head_dim}"
                )
        return Projection(backend, tensors)

    def init_ffn(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> None:
        super().init_ffn(backend, g, hp, p)
        self.experts: Gemma4Experts | None = None
        if p + "ffn_gate_inp.weight" in g.tensors:
            assert isinstance(hp, Gemma4HParams)
            self.experts = Gemma4Experts(backend, g, p, hp)
            self.pre_ffn_norm_2 = norm_weight(backend, g, p + "pre_ffw_norm_2.weight")
            self.post_ffn_norm_1 = norm_weight(backend, g, p + "post_ffw_norm_1.weight")
            self.post_ffn_norm_2 = norm_weight(backend, g, p + "post_ffw_norm_2.weight")

    def projections(self) -> list[Projection]:
        extra = [] if self.per_layer is None else [self.per_layer[0], self.per_layer[1]]
        return [*super().projections(), *extra]

    def packed_weights(self) -> list[Any]:
        experts = [] if self.experts is None else self.experts.packed_weights()
        return super().packed_weights() + experts


class PerLayerInputs:
    """E2B/E4B's per-layer embedding inputs: for each token and layer, the token's row of
    `per_layer_token_embd` (scaled by sqrt(n_embd_per_layer)) plus the scaled embedding projected by
    `per_layer_model_proj` (scaled by 1/sqrt(n_embd), RMS-normed per layer), the sum scaled by 1/sqrt(2):
    llama.cpp's build_inp_per_layer and project_per_layer_inputs."""

    def __init__(self, backend: Backend, g: GGUFFile, hp: Gemma4HParams) -> None:
        t = g.tensors
        self.backend, self.hp = backend, hp
        embd, proj = t["per_layer_token_embd.weight"], t["per_layer_model_proj.weight"]
        width = hp.n_layer * hp.n_embd_per_layer
        if embd.shape[1] != width or proj.shape[0] != width:
            shapes = f"{embd.shape}/{proj.shape}"
            raise UnsupportedModelError(
                f"gemma4: per-layer inputs {shapes} do not hold {hp.n_layer} x {hp.n_embd_per_layer}"
            )
        self.embd = backend.pack_weight(embd.data, embd.ggml_type, embd.shape)
        self.proj = backend.pack_weight(proj.data, proj.ggml_type, proj.shape)
        self.norm = norm_weight(backend, g, "per_layer_proj_norm.weight")

    def packed_weights(self) -> list[Any]:
        return [self.embd, self.proj]

    def __call__(self, tokens: Any, x: Any) -> list[Any]:
        """Each layer's input [T, n_embd_per_layer] for the tokens whose scaled embedding is x."""
        be, hp = self.backend, self.hp
        n, width, per = len(tokens), hp.n_layer * hp.n_embd_per_layer, hp.n_embd_per_layer
        rows = be.empty((n, width))
        be.get_rows(self.embd, tokens, rows)
        be.scale_inplace(rows, float(np.sqrt(np.float32(per))))
        out = be.empty((n, width))
        be.matmul(x, self.proj, out)
        be.scale_inplace(out, float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd))))
        flat = out.reshape(n * hp.n_layer, per)
        be.rmsnorm(flat, self.norm, hp.rms_eps, flat)
        be.add_inplace(out, rows)
        be.scale_inplace(out, float(np.float32(1.0) / np.sqrt(np.float32(2.0))))
        return be.split_cols(out, [per] * hp.n_layer)
