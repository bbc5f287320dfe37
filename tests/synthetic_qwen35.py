"""Small seeded Qwen3.5-family GGUFs (`qwen35`, `qwen35moe`, `qwen3next`), written as llama.cpp's converter
(conversion/qwen.py) and llama-quantize write them. The weights are synthetic: seeded random values,
not a trained model's; the same case always gives the same bytes, so scripts/make_qwen35_goldens.py
(llama.cpp's logits and the files' sha256, committed) and tests/test_qwen35.py run the very same files.

The hybrid trunk: every `full_attention_interval`-th layer is gated attention (Q|gate per head in one
`attn_q` of 2 * n_head * head_dim rows, Q/K RMS norms, partial rotary), the others Gated DeltaNet
linear attention; each layer's FFN (dense SwiGLU, or routed plus a gated shared expert) follows a
`post_attention_norm`. Layouts as the converter writes them:

- `attn_qkv` [2 * key_dim + value_dim, n_embd] (Q heads, K heads, V heads), `attn_gate` (z)
  [value_dim, n_embd], `ssm_conv1d` [conv channels, d_conv] (float32, llama-quantize leaves it),
  `ssm_dt.bias` and `ssm_a` [n_v_heads] (ssm_a = -exp(A_log): the converter stores A already negated
  and exponentiated), `ssm_norm` [head_v_dim], `ssm_out` [n_embd, value_dim];
- Qwen3.5: `ssm_beta` and `ssm_alpha` [n_v_heads, n_embd], value heads in tiled order (the converter
  reorders them so that value head h reads key head h % n_k_heads); `rope.dimension_sections`
  (interleaved M-RoPE, which text-only positions reduce to NeoX RoPE);
- Qwen3-Next: one `ssm_ba` [2 * n_v_heads, n_embd] whose rows go per key head (that head's value
  heads' b, then their a), value heads grouped (head h reads key head h // (n_v / n_k)); plain NeoX RoPE.

Sizes: 4-8 layers of 256 wide, head_dim 64 with 16 rotated dimensions (the real models' 1/4), d_state
64, 2 key heads and 4 value heads (4 and 4 in `qwen35-f32-mtp`, which also has the multi-token-prediction
block the converter appends after the trunk, `nextn_predict_layers`, and the per-layer
`attention.recurrent_layers` it writes from a config's `layer_types`), d_conv 4, the 320-token
byte-level BPE vocabulary of tests/synthetic_gguf.py with the `qwen2` pre-tokenizer (not the real
Qwen3.5 vocabulary of 248k tokens: its embedding would make the goldens megabytes per case; without
the real vocabulary there is no chat template). The decays are spread over (0.27, 0.99) per token, so
the state carries the prompt far. Tensor types as in tests/synthetic_moe_gguf.py: `F32`; `Q8_0` (every
matrix but the conv kernel and the routers); `Q4_K_M` (Q4_K, Q6_K for the head, attn_v, the first
layer's attn_qkv and ffn_down, routed and shared experts' included: K-quants are random bits with chosen
super-block scales, the gguf package cannot quantize them). The Q4_K_M mixtures of experts have experts
and a shared expert 256 wide (the real releases' are 512): K-quant rows hold whole 256-value
super-blocks, and llama-quantize would store narrower `ffn_down_exps` rows in Q5_0 / Q8_0 instead.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tests.synthetic_gguf import BOS, N_VOCAB, _write_vocabulary
from tests.synthetic_quant_gguf import random_matrix


@dataclass(frozen=True)
class Qwen35Case:
    """One synthetic model: its name (the seed), family, tensor types and shape."""

    name: str
    arch: str  # qwen35, qwen35moe or qwen3next
    types: str = "F32"  # F32, Q8_0 or Q4_K_M
    n_layer: int = 6
    full_attention_interval: int = 3
    n_embd: int = 256
    n_head: int = 4
    n_kv_head: int = 2
    head_dim: int = 64
    n_rot: int = 16
    rope_sections: tuple[int, ...] = (3, 3, 2, 0)  # qwen35 / qwen35moe: pairs per t/h/w/e section
    d_conv: int = 4
    d_state: int = 64
    n_k_heads: int = 2
    n_v_heads: int = 4
    n_ff: int = 512  # the dense FFN
    n_expert: int = 0
    n_used: int = 0
    n_ff_exp: int = 256
    n_ff_shexp: int = 256
    rope_base: float = 1e7
    mtp: bool = False  # a multi-token-prediction block after the trunk (`nextn_predict_layers` 1)
    # The attention layers as the converter writes a config's `layer_types` (`attention.recurrent_layers`,
    # which llama.cpp reads before the interval); empty: the interval alone says.
    attention_layers: tuple[int, ...] = ()
    n_ctx: int = 256
    n_tokens: int = 80

    @property
    def moe(self) -> bool:
        return self.n_expert > 0

    @property
    def conv_channels(self) -> int:
        return (2 * self.n_k_heads + self.n_v_heads) * self.d_state

    def recurrent(self, il: int) -> bool:
        if self.attention_layers:
            return il not in self.attention_layers
        return (il + 1) % self.full_attention_interval != 0


def tensor_type(case: Qwen35Case, name: str, il: int) -> str:
    """What llama-quantize (with the case's type) stores a matrix in; float tensors stay F32."""
    if case.types == "F32" or "ssm_conv1d" in name or "ffn_gate_inp" in name:
        return "F32"
    if case.types == "Q8_0":
        return "Q8_0"
    more_bits = name == "output.weight" or "attn_v." in name
    first = il == 0 and ("attn_qkv." in name or "ffn_down" in name)
    return "Q6_K" if more_bits or first else "Q4_K"


class _Weights:
    """The case's tensors in write order, each as (stored data, type name)."""

    def __init__(self, case: Qwen35Case) -> None:
        self.case = case
        self.rng = np.random.default_rng(zlib.crc32(case.name.encode()))
        self.tensors: dict[str, tuple[np.ndarray, str]] = {}

    def matrix(
        self, name: str, rows: int, cols: int, il: int = -1, n_expert: int = 0, std: float = 0.0
    ) -> None:
        kind = tensor_type(self.case, name, il)
        scale = std or 1.0 / math.sqrt(cols)
        data = random_matrix(self.rng, kind, max(n_expert, 1) * rows, cols, scale)
        self.tensors[name] = (data.reshape(n_expert, rows, -1) if n_expert else data, kind)

    def vector(self, name: str, values: np.ndarray) -> None:
        self.tensors[name] = (values.astype(np.float32), "F32")

    def normal(self, n: int, mean: float, std: float) -> np.ndarray:
        return mean + std * self.rng.standard_normal(n)


def _attention(w: _Weights, p: str, il: int) -> None:
    c = w.case
    w.matrix(p + "attn_q.weight", 2 * c.n_head * c.head_dim, c.n_embd, il)  # per head: Q rows, gate rows
    w.matrix(p + "attn_k.weight", c.n_kv_head * c.head_dim, c.n_embd, il)
    w.matrix(p + "attn_v.weight", c.n_kv_head * c.head_dim, c.n_embd, il)
    w.vector(p + "attn_q_norm.weight", w.normal(c.head_dim, 1.0, 0.1))
    w.vector(p + "attn_k_norm.weight", w.normal(c.head_dim, 1.0, 0.1))
    w.matrix(p + "attn_output.weight", c.n_embd, c.n_head * c.head_dim, il)


def _delta_net(w: _Weights, p: str, il: int) -> None:
    c = w.case
    value_dim = c.n_v_heads * c.d_state
    w.matrix(p + "attn_qkv.weight", c.conv_channels, c.n_embd, il)
    w.matrix(p + "attn_gate.weight", value_dim, c.n_embd, il)
    w.vector(p + "ssm_conv1d.weight", (0.5 * w.rng.standard_normal((c.conv_channels, c.d_conv))))
    w.vector(p + "ssm_dt.bias", w.normal(c.n_v_heads, -1.0, 0.5))
    # A in (0.02, 1): with softplus(alpha + dt_bias) the per-token decays spread over (0.27, 0.99)
    w.vector(p + "ssm_a", -np.exp(w.rng.uniform(math.log(0.02), 0.0, c.n_v_heads)))
    if c.arch == "qwen3next":
        w.matrix(p + "ssm_ba.weight", 2 * c.n_v_heads, c.n_embd, il)
    else:
        w.matrix(p + "ssm_beta.weight", c.n_v_heads, c.n_embd, il)
        w.matrix(p + "ssm_alpha.weight", c.n_v_heads, c.n_embd, il)
    w.vector(p + "ssm_norm.weight", w.normal(c.d_state, 1.0, 0.1))
    w.matrix(p + "ssm_out.weight", c.n_embd, value_dim, il)


def _ffn(w: _Weights, p: str, il: int) -> None:
    c = w.case
    if not c.moe:
        w.matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd, il)
        w.matrix(p + "ffn_up.weight", c.n_ff, c.n_embd, il)
        w.matrix(p + "ffn_down.weight", c.n_embd, c.n_ff, il)
        return
    w.matrix(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd, il)
    w.matrix(p + "ffn_gate_exps.weight", c.n_ff_exp, c.n_embd, il, c.n_expert)
    w.matrix(p + "ffn_up_exps.weight", c.n_ff_exp, c.n_embd, il, c.n_expert)
    w.matrix(p + "ffn_down_exps.weight", c.n_embd, c.n_ff_exp, il, c.n_expert)
    w.vector(p + "ffn_gate_inp_shexp.weight", w.normal(c.n_embd, 0.0, 1.0 / math.sqrt(c.n_embd)))
    w.matrix(p + "ffn_gate_shexp.weight", c.n_ff_shexp, c.n_embd, il)
    w.matrix(p + "ffn_up_shexp.weight", c.n_ff_shexp, c.n_embd, il)
    w.matrix(p + "ffn_down_shexp.weight", c.n_embd, c.n_ff_shexp, il)


def _mtp_block(w: _Weights, il: int) -> None:
    """The converter's `blk.<n_layer>`: a full-attention decoder block and the nextn projections (llama.cpp
    skips them unless it drafts with them)."""
    c, p = w.case, f"blk.{il}."
    w.vector(p + "attn_norm.weight", w.normal(c.n_embd, 1.0, 0.1))
    _attention(w, p, il)
    w.vector(p + "post_attention_norm.weight", w.normal(c.n_embd, 1.0, 0.1))
    _ffn(w, p, il)
    w.matrix(p + "nextn.eh_proj.weight", c.n_embd, 2 * c.n_embd, il)
    w.vector(p + "nextn.enorm.weight", w.normal(c.n_embd, 1.0, 0.1))
    w.vector(p + "nextn.hnorm.weight", w.normal(c.n_embd, 1.0, 0.1))


def model_tensors(case: Qwen35Case) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (stored data, type name), in the order they are written."""
    w = _Weights(case)
    w.matrix("token_embd.weight", N_VOCAB, case.n_embd, std=1.0)
    w.vector("output_norm.weight", w.normal(case.n_embd, 1.0, 0.1))
    w.matrix("output.weight", N_VOCAB, case.n_embd)
    for il in range(case.n_layer):
        p = f"blk.{il}."
        w.vector(p + "attn_norm.weight", w.normal(case.n_embd, 1.0, 0.1))
        (_delta_net if case.recurrent(il) else _attention)(w, p, il)
        w.vector(p + "post_attention_norm.weight", w.normal(case.n_embd, 1.0, 0.1))
        _ffn(w, p, il)
    if case.mtp:
        _mtp_block(w, case.n_layer)
    return w.tensors


def _write_metadata(w: gguf.GGUFWriter, c: Qwen35Case) -> None:
    w.add_name("Llamba synthetic Qwen3.5-family model")
    w.add_block_count(c.n_layer + int(c.mtp))
    if c.mtp:
        w.add_nextn_predict_layers(1)
    w.add_context_length(4096)
    w.add_embedding_length(c.n_embd)
    if c.arch != "qwen35moe":  # Qwen3.5-MoE configs have no dense intermediate_size to write
        w.add_feed_forward_length(c.n_ff)
    w.add_head_count(c.n_head)
    w.add_head_count_kv(c.n_kv_head)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(c.rope_base)
    w.add_rope_dimension_count(c.n_rot)
    if c.arch != "qwen3next":
        w.add_rope_dimension_sections(list(c.rope_sections))
    w.add_ssm_conv_kernel(c.d_conv)
    w.add_ssm_state_size(c.d_state)
    w.add_ssm_group_count(c.n_k_heads)
    w.add_ssm_time_step_rank(c.n_v_heads)
    w.add_ssm_inner_size(c.n_v_heads * c.d_state)
    w.add_full_attention_interval(c.full_attention_interval)
    if c.attention_layers:  # the multi-token-prediction block is not recurrent
        flags = [c.recurrent(il) for il in range(c.n_layer)] + [False] * int(c.mtp)
        w.add_array(f"{c.arch}.attention.recurrent_layers", flags)
    if c.moe:
        w.add_expert_count(c.n_expert)
        w.add_expert_used_count(c.n_used)
        w.add_expert_feed_forward_length(c.n_ff_exp)
        w.add_expert_shared_feed_forward_length(c.n_ff_shexp)
    w.add_file_type({"F32": 0, "Q8_0": 7, "Q4_K_M": 15}[c.types])


def write_gguf(
    case: Qwen35Case, path: Path, tensors: dict[str, tuple[np.ndarray, str]] | None = None
) -> Path:
    """The case's model as a GGUF file at `path` (same case, same bytes); `tensors` replace the case's own
    (a test's other layouts)."""
    w = gguf.GGUFWriter(str(path), case.arch)
    _write_metadata(w, case)
    _write_vocabulary(w, "qwen2")
    for name, (data, kind) in (model_tensors(case) if tensors is None else tensors).items():
        if kind == "F32":
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def prompt_tokens(case: Qwen35Case) -> list[int]:
    """The case's input: seeded token ids, BOS first."""
    rng = np.random.default_rng(zlib.crc32(("tokens:" + case.name).encode()))
    return [BOS, *rng.integers(0, BOS, case.n_tokens - 1).tolist()]


def _moe(name: str, arch: str, types: str, width: int = 128) -> Qwen35Case:
    """Qwen3.5-35B-A3B / Qwen3-Next-80B-A3B in small: 4 layers (attention every second), 8 experts of
    which 2 are used, a shared expert, all `width` wide."""
    return Qwen35Case(
        name,
        arch,
        types,
        n_layer=4,
        full_attention_interval=2,
        n_expert=8,
        n_used=2,
        n_ff_exp=width,
        n_ff_shexp=width,
    )


CASES: dict[str, Qwen35Case] = {
    c.name: c
    for c in (
        Qwen35Case("qwen35-f32", "qwen35"),
        Qwen35Case("qwen35-q8_0", "qwen35", "Q8_0"),
        Qwen35Case("qwen35-q4_k_m", "qwen35", "Q4_K_M"),
        # Qwen3.5-0.8B's key heads (as many as value heads), the multi-token-prediction block the converter
        # appends, and the layer types it writes: here attention at layers 3 and 6, where the interval
        # (also written) would say 3 and 7
        Qwen35Case(
            "qwen35-f32-mtp",
            "qwen35",
            n_layer=8,
            full_attention_interval=4,
            n_k_heads=4,
            mtp=True,
            attention_layers=(3, 6),
        ),  # fmt: skip
        _moe("qwen35moe-f32", "qwen35moe", "F32"),
        _moe("qwen35moe-q8_0", "qwen35moe", "Q8_0"),
        _moe("qwen3next-f32", "qwen3next", "F32"),
        _moe("qwen3next-q8_0", "qwen3next", "Q8_0"),
        # the releases' Q4_K_M (Qwen3.6-35B-A3B, Qwen3-Next-80B-A3B); experts one K-quant super-block wide
        _moe("qwen35moe-q4_k_m", "qwen35moe", "Q4_K_M", width=256),
        _moe("qwen3next-q4_k_m", "qwen3next", "Q4_K_M", width=256),
    )
}
