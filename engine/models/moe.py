"""Mixture-of-experts feed-forward blocks (Mixtral, Qwen2-MoE, Qwen3-MoE): routing and expert matmuls.

A router (`ffn_gate_inp`, a float matrix) scores every expert for every token; the top k are run and
their outputs added with weights, as llama.cpp's `build_moe_ffn` does:

- `softmax` gating (Mixtral, Qwen2-MoE, Qwen3-MoE): probabilities over all experts, the k largest
  chosen (best first), their probabilities the weights, divided by their sum where the family
  normalises them (Mixtral, Qwen3-MoE: llama.cpp's `norm_w`; Qwen2-MoE does not);
- `softmax_weight` gating (gpt-oss): the k largest logits chosen, the weights a softmax over those k.

The experts are stored as 3-D tensors (`ffn_{gate,up,down}_exps`: expert, rows, cols), each packed as
one matrix with a per-expert view the existing matmul kernels take (`Backend.pack_expert_weights`; the
CPU packs an expert the first time it is routed to). Routing runs on the host over the [T, n_expert]
router logits; the batch's (token, expert) rows are gathered once, sorted by expert, and each expert
that any token chose runs once over its rows, so a decode step reads only the chosen experts' weights
and a prompt reads each chosen expert once, never one matmul per token and expert. Where the backend
has a kernel for the format (`Backend.experts_matmul`: the CPU's Q4_K, Q6_K and Q8_0), all of a
layer's experts run in one call per matrix (gate|up, then down) instead of a matmul per expert: on
Qwen3-30B-A3B's 48 layers of top-8 the loop made ~2,300 kernel calls a token, each a parallel region.
Every token's result depends on its own row only (the matmul kernels quantize and sum row by row), so
it is bitwise the same in any batch, whichever experts its neighbours chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile, Tensor, UnsupportedModelError
from engine.models.llama import same_type_runs

# llama.cpp clamps the sum of the chosen weights before dividing by it (the smallest normal f16).
_MIN_WEIGHT_SUM = np.float32(6.103515625e-5)


@dataclass(frozen=True)
class Routing:
    """How a family turns router logits into k experts and their weights."""

    n_expert: int
    n_used: int
    gating: str = "softmax"  # or "softmax_weight"
    normalize: bool = True  # divide the chosen weights by their sum

    @classmethod
    def from_gguf(cls, g: GGUFFile, gating: str = "softmax", normalize: bool = True) -> Routing:
        """expert_count and expert_used_count; per-layer counts and expert groups (which no supported
        family has) are refused with their key's name."""
        arch = g.architecture
        n_expert, n_used = g.arch_value("expert_count"), g.arch_value("expert_used_count")
        for key, value in (("expert_count", n_expert), ("expert_used_count", n_used)):
            if not isinstance(value, int):
                raise UnsupportedModelError(f"{arch}: {arch}.{key} must be one integer (got {value!r})")
        if int(g.arch_value("expert_group_count", 0)) > 1:
            raise UnsupportedModelError(
                f"{arch}: expert groups ({arch}.expert_group_count) are not supported"
            )
        if not 0 < n_used <= n_expert:
            raise UnsupportedModelError(f"{arch}: expert_used_count {n_used} of expert_count {n_expert}")
        return cls(n_expert, n_used, gating, normalize)


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """ggml's float32 softmax of each row: exp(x - max) in float32, summed in double, scaled by 1/sum."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    total = e.sum(axis=1, dtype=np.float64, keepdims=True)
    return e * (1.0 / total).astype(np.float32)


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest of each row, largest first (ties: the lower index), as ggml's descending argsort."""
    return np.argsort(-x, axis=1, kind="stable")[:, :k]


def route(logits: np.ndarray, routing: Routing) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts int64 [T, k] best first, their weights float32 [T, k]) from router logits [T, n]."""
    if routing.gating == "softmax":
        probs = softmax_rows(logits)
        chosen = top_k(probs, routing.n_used)
        weights = np.take_along_axis(probs, chosen, 1)
    else:
        chosen = top_k(logits, routing.n_used)
        weights = softmax_rows(np.take_along_axis(logits, chosen, 1))
    if routing.normalize:
        total = weights.sum(axis=1, dtype=np.float64, keepdims=True).astype(np.float32)
        weights = weights / np.maximum(total, _MIN_WEIGHT_SUM)
    return chosen, weights.astype(np.float32, copy=False)


@dataclass(frozen=True)
class Dispatch:
    """The batch's (token, rank) pairs sorted by expert: which token rows each expert runs over."""

    tokens: np.ndarray  # int32 [T * k]: the token of each sorted pair
    runs: list[tuple[int, int, int]]  # (expert, start, end) into the sorted pairs
    rows: np.ndarray  # int64 [T, k]: where pair (t, i) sits in the sorted order
    table: np.ndarray  # int64 [len(runs), 3]: the runs as an array (the one-call expert kernels')

    @classmethod
    def of(cls, chosen: np.ndarray) -> Dispatch:
        n_tok, k = chosen.shape
        flat = chosen.reshape(-1)
        order = np.argsort(flat, kind="stable")  # by expert, then token: each expert's rows in batch order
        rows = np.empty(len(order), np.int64)
        rows[order] = np.arange(len(order))
        experts = flat[order]
        starts = [0, *(np.flatnonzero(np.diff(experts)) + 1).tolist()]
        ends = [*starts[1:], len(order)]
        runs = [(int(experts[s]), s, e) for s, e in zip(starts, ends, strict=True)]
        table = np.array(runs, np.int64).reshape(len(runs), 3)
        return cls((order // k).astype(np.int32), runs, rows.reshape(n_tok, k), table)


class ExpertMatrices:
    """The matrices every expert applies to one input (gate and up; or down), from their 3-D tensors.
    Consecutive tensors of one type are fused per expert (gate|up: one matmul, its output split), as
    `Projection` fuses Q|K|V; optional biases are [n_expert, rows] tensors (gpt-oss)."""

    def __init__(self, backend: Backend, tensors: list[Tensor], biases: list[Tensor] | None = None) -> None:
        self.backend = backend
        self.packed: list[Any] = []
        # per fused group: (weight per expert, bias per expert or None, output sizes, the one packed
        # matrix that holds every expert or None)
        self.groups: list[tuple[list[Any], list[Any] | None, list[int], Any]] = []
        self.prepare: list[Any] = []  # per group: the backend's prepare(expert ids) or None
        for start, end in same_type_runs(tensors):
            self.groups.append(self._fuse(tensors[start:end], None if biases is None else biases[start:end]))

    def _fuse(
        self, tensors: list[Tensor], biases: list[Tensor] | None
    ) -> tuple[list[Any], list[Any] | None, list[int], Any]:
        n_expert, _, n_cols = tensors[0].shape
        sizes = [t.shape[1] for t in tensors]
        whole, each, prepare = self.backend.pack_expert_weights(
            [t.data for t in tensors], tensors[0].ggml_type, (n_expert, sum(sizes), n_cols)
        )
        self.packed.extend(whole)
        self.prepare.append(prepare)
        bias = None
        if biases is not None:
            rows = np.concatenate([np.asarray(b.data, dtype=np.float32) for b in biases], axis=1)
            bias = [self.backend.upload(np.ascontiguousarray(rows[e])) for e in range(n_expert)]
        return each, bias, sizes, whole[0] if len(whole) == 1 else None

    def __call__(self, x: Any, plan: Dispatch) -> list[Any]:
        """Each run's expert over its rows of x [n, cols] (the pairs sorted by expert, plan's order): one
        [n, rows] array per tensor. Every run in one kernel call where the backend has one for the
        format (`Backend.experts_matmul`), else a matmul per run."""
        be, outs = self.backend, []
        for (weights, bias, sizes, whole), prepare in zip(self.groups, self.prepare, strict=True):
            if prepare is not None:
                prepare(plan.table[:, 0])
            out = be.empty((x.shape[0], sum(sizes)))
            one_call = be.experts_matmul is not None and whole is not None
            if not (one_call and be.experts_matmul(x, whole, sum(sizes), plan.table, out)):
                for expert, start, end in plan.runs:
                    be.matmul(x[start:end], weights[expert], out[start:end])
            if bias is not None:
                for expert, start, end in plan.runs:
                    be.add_bias_inplace(out[start:end], bias[expert])
            outs.extend([out] if len(sizes) == 1 else be.split_cols(out, sizes))
        return outs


def expert_tensors(g: GGUFFile, prefix: str, names: list[str]) -> list[Tensor]:
    """The layer's 3-D expert tensors `<prefix><name>.weight`. Files with one tensor per expert (old
    Mixtral conversions: `ffn_gate.0.weight`) or gate and up merged (`ffn_gate_up_exps`) are refused
    with the name of what they hold instead."""
    t = g.tensors
    for other in (f"{prefix}ffn_gate.0.weight", f"{prefix}ffn_gate_up_exps.weight"):
        if other in t:
            raise UnsupportedModelError(f"{g.architecture}: unsupported expert layout ({other})")
    missing = [f"{prefix}{n}.weight" for n in names if f"{prefix}{n}.weight" not in t]
    if missing:
        raise UnsupportedModelError(f"{g.architecture}: missing expert tensor {missing[0]}")
    tensors = [t[f"{prefix}{n}.weight"] for n in names]
    for tensor in tensors:
        if len(tensor.shape) != 3:
            raise UnsupportedModelError(f"{g.architecture}: {tensor.name} is not 3-D ({tensor.shape})")
    return tensors


class MoeFFN:
    """One layer's routed experts: router, gate|up and down per expert. `__call__(h)` returns the experts'
    outputs and how to combine them; `last_choice` keeps the last batch's chosen experts (for tests)."""

    def __init__(
        self,
        backend: Backend,
        g: GGUFFile,
        prefix: str,
        routing: Routing,
        biases: bool = False,
        activation: str = "silu",
    ) -> None:
        t = g.tensors
        self.backend, self.routing = backend, routing
        router = t[prefix + "ffn_gate_inp.weight"]
        if router.shape[0] != routing.n_expert:
            raise UnsupportedModelError(
                f"{router.name} has {router.shape[0]} experts, not {routing.n_expert}"
            )
        self.router = backend.pack_router_weight(router.data, router.ggml_type, router.shape)
        self.router_bias = None
        gate_up = expert_tensors(g, prefix, ["ffn_gate_exps", "ffn_up_exps"])
        (down,) = expert_tensors(g, prefix, ["ffn_down_exps"])
        gate_up_b = down_b = None
        if biases:
            self.router_bias = backend.upload(
                np.array(t[prefix + "ffn_gate_inp.bias"].data, dtype=np.float32)
            )
            gate_up_b = [t[prefix + "ffn_gate_exps.bias"], t[prefix + "ffn_up_exps.bias"]]
            down_b = [t[prefix + "ffn_down_exps.bias"]]
        self.gate_up = ExpertMatrices(backend, gate_up, gate_up_b)
        self.down = ExpertMatrices(backend, [down], down_b)
        self.n_out = down.shape[1]
        self.activation = activation
        self.last_choice = np.zeros((0, routing.n_used), np.int64)

    def packed_weights(self) -> list[Any]:
        """The experts' packed matrices (the router, a float array of its own, is not one)."""
        return [*self.gate_up.packed, *self.down.packed]

    def choose(self, h: Any) -> tuple[np.ndarray, np.ndarray]:
        """(chosen experts, weights) of each row of h, on the host."""
        be = self.backend
        logits = be.empty((h.shape[0], self.routing.n_expert))
        be.router_matmul(h, self.router, logits)
        if self.router_bias is not None:
            be.add_bias_inplace(logits, self.router_bias)
        chosen, weights = route(np.asarray(be.download(logits)), self.routing)
        self.last_choice = chosen
        return chosen, weights

    def __call__(self, h: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        """(y [T * k, n_embd] the chosen experts' outputs, rows [T, k] where token t's i-th expert's output
        is in y, weights [T, k]), for `Backend.combine_experts([y], rows, weights)`."""
        be = self.backend
        chosen, weights = self.choose(h)
        plan = Dispatch.of(chosen)
        gate, up = self.gate_up(be.take_rows(h, plan.tokens), plan)
        self.activate(gate, up)
        (y,) = self.down(gate, plan)
        return y, plan.rows, weights

    def activate(self, gate: Any, up: Any) -> None:
        """gate = the activation of (gate, up), in place: SwiGLU, or gpt-oss's clamped one (ggml's
        swiglu_oai, alpha 1.702 and limit 7, constants in llama.cpp too)."""
        if self.activation == "swiglu_oai":
            self.backend.swiglu_oai(gate, up, 1.702, 7.0)  # type: ignore[misc]
        else:
            self.backend.silu_mul(gate, up, gate)


class MoeLayerMixin:
    """A decoder layer whose feed-forward block is routed experts (before a LlamaLayer in the bases).
    `gating` and `normalize` are the family's routing (see the module's docstring)."""

    gating = "softmax"
    normalize = True
    expert_biases = False
    activation = "silu"
    qkv: Any
    attn_out: Any

    def init_ffn(self, backend: Backend, g: GGUFFile, hp: Any, p: str) -> None:
        routing = Routing.from_gguf(g, self.gating, self.normalize)
        self.moe = MoeFFN(backend, g, p, routing, self.expert_biases, self.activation)

    def projections(self) -> list[Any]:
        return [self.qkv, self.attn_out]

    def packed_weights(self) -> list[Any]:
        dense = [group.weight for projection in self.projections() for group in projection.groups]
        return dense + self.moe.packed_weights()


class MoeModelMixin:
    """A model whose layers are MoeLayerMixin layers: the FFN block runs the routed experts (before a
    LlamaModel in the bases)."""

    backend: Backend
    norm: Any  # LlamaModel's

    def ffn_block(self, layer: Any, x: Any) -> None:
        y, rows, weights = layer.moe(self.norm(x, layer.ffn_norm))
        self.backend.add_inplace(x, self.backend.combine_experts([y], rows, weights))
