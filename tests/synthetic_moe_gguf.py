"""Small seeded mixture-of-experts GGUFs (qwen3moe, qwen2moe, Mixtral's `llama`), written as llama.cpp's
converter and llama-quantize write them.

Two layers, the 320-token byte-level vocabulary of tests/synthetic_gguf.py, each family's metadata and
tensor names (llama.cpp's src/models/<family>.cpp), experts as 3-D `ffn_{gate,up,down}_exps` tensors,
and head layouts shaped like the real models' (Qwen3-30B-A3B's head_dim wider than n_embd / n_head and
4 query heads per kv head; Qwen1.5-MoE's Q/K/V biases, shared expert and an expert count that is not a
power of two; Mixtral's 8 experts, 2 used). Tensor types as the real releases use them:

- `F32`: every matrix float32 (routing and the expert plumbing alone against llama.cpp);
- `Q8_0`: every matrix Q8_0;
- `Q4_K_M`: llama-quantize's Q4_K_M pattern: Q4_K matrices, Q6_K for the output head, attn_v and the
  first layer's ffn_down_exps (its "more bits" layers), Q4_K token embedding.

The router (`ffn_gate_inp`) and the shared expert's gate stay float32 as llama-quantize leaves them, as
do norms and biases. K-quant weights are random bits with chosen super-block scales
(tests/synthetic_quant_gguf.py); the others are quantized from normal values by the `gguf` package. The
same case always gives the same bytes: scripts/make_moe_goldens.py records their sha256 with llama.cpp's
logits and tests/test_moe.py rebuilds and checks them.
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
class MoeCase:
    """One synthetic MoE model: its name (the seed), family, shape, expert layout and tensor types."""

    name: str
    arch: str  # qwen3moe, qwen2moe or llama (Mixtral)
    types: str = "F32"  # F32, Q8_0 or Q4_K_M
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 8
    n_kv_head: int = 2
    head_dim: int = 64
    n_expert: int = 16
    n_used: int = 4
    n_ff_exp: int = 256
    n_ff_shexp: int = 0  # qwen2moe's shared expert
    qkv_bias: bool = False
    rope_base: float = 1e6
    n_ctx: int = 256
    n_tokens: int = 32


def _float_tensor(name: str) -> bool:
    """Tensors llama-quantize leaves in float: norms, biases, the routers, the shared expert's gate."""
    return "norm" in name or name.endswith(".bias") or "ffn_gate_inp" in name


def tensor_type(case: MoeCase, name: str) -> str:
    if case.types == "F32" or _float_tensor(name):
        return "F32"
    if case.types == "Q8_0":
        return "Q8_0"
    more_bits = name in ("output.weight", "blk.0.ffn_down_exps.weight") or "attn_v" in name
    return "Q6_K" if more_bits else "Q4_K"


class _Weights:
    """The case's tensors in write order, each stored in its type (3-D for the experts)."""

    def __init__(self, case: MoeCase) -> None:
        self.case = case
        self.rng = np.random.default_rng(zlib.crc32(case.name.encode()))
        self.tensors: dict[str, tuple[np.ndarray, str]] = {}

    def matrix(self, name: str, rows: int, cols: int, n_expert: int = 0, std: float | None = None) -> None:
        kind = tensor_type(self.case, name)
        scale = 1.0 / math.sqrt(cols) if std is None else std
        data = random_matrix(self.rng, kind, max(n_expert, 1) * rows, cols, scale)
        if n_expert:
            data = data.reshape(n_expert, rows, -1)
        self.tensors[name] = (data, kind)

    def vector(self, name: str, n: int, mean: float, std: float) -> None:
        self.tensors[name] = ((mean + std * self.rng.standard_normal(n)).astype(np.float32), "F32")


def _attention(w: _Weights, p: str) -> None:
    c = w.case
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    w.vector(p + "attn_norm.weight", c.n_embd, 1.0, 0.1)
    w.matrix(p + "attn_q.weight", q_dim, c.n_embd)
    w.matrix(p + "attn_k.weight", kv_dim, c.n_embd)
    w.matrix(p + "attn_v.weight", kv_dim, c.n_embd)
    if c.qkv_bias:
        for name, n in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            w.vector(f"{p}{name}.bias", n, 0.0, 0.5)
    if c.arch == "qwen3moe":
        w.vector(p + "attn_q_norm.weight", c.head_dim, 1.0, 0.1)
        w.vector(p + "attn_k_norm.weight", c.head_dim, 1.0, 0.1)
    w.matrix(p + "attn_output.weight", c.n_embd, q_dim)


def _experts(w: _Weights, p: str) -> None:
    c = w.case
    w.vector(p + "ffn_norm.weight", c.n_embd, 1.0, 0.1)
    # std 1/sqrt(n_embd) on normed inputs: router logits of spread ~1, so no near ties between experts
    w.matrix(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd)
    w.matrix(p + "ffn_gate_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert)
    w.matrix(p + "ffn_up_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert)
    w.matrix(p + "ffn_down_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert)
    if c.n_ff_shexp:
        w.vector(p + "ffn_gate_inp_shexp.weight", c.n_embd, 0.0, 1.0 / math.sqrt(c.n_embd))
        w.matrix(p + "ffn_gate_shexp.weight", c.n_ff_shexp, c.n_embd)
        w.matrix(p + "ffn_up_shexp.weight", c.n_ff_shexp, c.n_embd)
        w.matrix(p + "ffn_down_shexp.weight", c.n_embd, c.n_ff_shexp)


def model_tensors(case: MoeCase) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (stored data, type name), in the order they are written."""
    w = _Weights(case)
    w.matrix("token_embd.weight", N_VOCAB, case.n_embd, std=1.0)
    w.vector("output_norm.weight", case.n_embd, 1.0, 0.1)
    w.matrix("output.weight", N_VOCAB, case.n_embd)
    for il in range(case.n_layer):
        _attention(w, f"blk.{il}.")
        _experts(w, f"blk.{il}.")
    return w.tensors


def _write_metadata(w: gguf.GGUFWriter, case: MoeCase, used_count: list[int] | None) -> None:
    c, a = case, case.arch
    w.add_name("Llamba synthetic MoE model")
    w.add_block_count(c.n_layer)
    w.add_context_length(1024)
    w.add_embedding_length(c.n_embd)
    # Mixtral's experts are feed_forward_length wide; the Qwen families' dense width is unused
    w.add_feed_forward_length(c.n_ff_exp if a == "llama" else c.n_ff_exp * c.n_used)
    w.add_head_count(c.n_head)
    w.add_head_count_kv(c.n_kv_head)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(c.rope_base)
    if c.head_dim != c.n_embd // c.n_head:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    w.add_expert_count(c.n_expert)
    if used_count is None:
        w.add_expert_used_count(c.n_used)
    else:  # per layer, as llama.cpp's get_key_or_arr allows
        w.add_array(f"{a}.expert_used_count", used_count)
    if a != "llama":
        w.add_expert_feed_forward_length(c.n_ff_exp)
    else:
        w.add_vocab_size(N_VOCAB)
        w.add_rope_dimension_count(c.head_dim)
    if c.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(c.n_ff_shexp)
    w.add_file_type({"F32": 0, "Q8_0": 7, "Q4_K_M": 15}[c.types])


def write_gguf(
    case: MoeCase,
    path: Path,
    tensors: dict[str, tuple[np.ndarray, str]] | None = None,
    used_count: list[int] | None = None,
) -> Path:
    """The case's model as a GGUF file at `path` (same case, same bytes); `tensors` replace the case's
    own (a test's other layouts), `used_count` writes expert_used_count as a per-layer array."""
    w = gguf.GGUFWriter(str(path), case.arch)
    _write_metadata(w, case, used_count)
    _write_vocabulary(w, "gpt-2")
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


def prompt_tokens(case: MoeCase) -> list[int]:
    """The case's input: seeded token ids, BOS first."""
    rng = np.random.default_rng(zlib.crc32(("tokens:" + case.name).encode()))
    return [BOS, *rng.integers(0, BOS, case.n_tokens - 1).tolist()]


def _family(arch: str) -> MoeCase:
    if arch == "qwen3moe":  # Qwen3-30B-A3B: head_dim 128 under 2048 / 32, 32:4 heads, 128 experts, 8 used
        return MoeCase("", "qwen3moe")
    if arch == "qwen2moe":  # Qwen1.5-MoE-A2.7B: Q/K/V biases, 60 experts, 4 used, a shared expert
        return MoeCase("", "qwen2moe", n_head=4, n_kv_head=4, n_expert=12, n_ff_shexp=512, qkv_bias=True)
    # Mixtral 8x7B: 8 experts, 2 used, 32:8 heads of 128 (n_embd / n_head)
    return MoeCase("", "llama", n_head=8, n_kv_head=2, head_dim=32, n_expert=8, n_used=2, n_ff_exp=512)


def _case(name: str, arch: str, types: str) -> MoeCase:
    from dataclasses import replace

    return replace(_family(arch), name=name, types=types)


CASES: dict[str, MoeCase] = {
    c.name: c
    for c in (
        _case("qwen3moe-f32", "qwen3moe", "F32"),
        _case("qwen3moe-q8_0", "qwen3moe", "Q8_0"),
        _case("qwen3moe-q4_k_m", "qwen3moe", "Q4_K_M"),
        _case("qwen2moe-q8_0", "qwen2moe", "Q8_0"),
        _case("qwen2moe-q4_k_m", "qwen2moe", "Q4_K_M"),
        _case("mixtral-q8_0", "llama", "Q8_0"),
        _case("mixtral-q4_k_m", "llama", "Q4_K_M"),
    )
}
