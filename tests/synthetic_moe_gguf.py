"""Small seeded mixture-of-experts GGUFs (qwen3moe, qwen2moe, Mixtral's `llama`, gpt-oss), written as
llama.cpp's converter and llama-quantize write them.

Two layers, the 320-token byte-level vocabulary of tests/synthetic_gguf.py, each family's metadata and
tensor names (llama.cpp's src/models/<family>.cpp), experts as 3-D `ffn_{gate,up,down}_exps` tensors,
and head layouts shaped like the real models' (Qwen3-30B-A3B's head_dim wider than n_embd / n_head and
4 query heads per kv head; Qwen1.5-MoE's Q/K/V biases, shared expert and an expert count that is not a
power of two; Mixtral's 8 experts, 2 used; gpt-oss's 64-wide heads under a wider embedding, 4 of 8
experts, attention and expert biases, sinks, a sliding window every other layer, YaRN). Tensor types as
the real releases use them:

- `F32`: every matrix float32 (routing and the expert plumbing alone against llama.cpp);
- `Q8_0`: every matrix Q8_0;
- `Q4_K_M`: llama-quantize's Q4_K_M pattern: Q4_K matrices, Q6_K for the output head, attn_v and the
  first layer's ffn_down_exps (its "more bits" layers), Q4_K token embedding.
- `MXFP4`: gpt-oss's release: MXFP4 experts (quantized from normal values by the `gguf` package), Q8_0
  for the other matrices.

The router (`ffn_gate_inp`) and the shared expert's gate stay float32 as llama-quantize leaves them, as
do norms and biases. K-quant weights are random bits with chosen super-block scales
(tests/synthetic_quant_gguf.py); the others are quantized from normal values by the `gguf` package. The
same case always gives the same bytes: scripts/make_moe_goldens.py records their sha256 with llama.cpp's
logits and tests/test_moe.py rebuilds and checks them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
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
    arch: str  # qwen3moe, qwen2moe, llama (Mixtral) or gpt-oss
    types: str = "F32"  # F32, Q8_0, Q4_K_M or MXFP4
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
    sliding_window: int = 0  # gpt-oss: every other layer's window
    sink: float = 0.0  # gpt-oss: the sinks' mean; -1e4 takes them out of every softmax (see CASES)
    rope_base: float = 1e6
    n_ctx: int = 256
    n_tokens: int = 32
    n_vocab: int = N_VOCAB  # a case with a vocabulary of its own (tests/synthetic_harmony_gguf.py)


def _float_tensor(name: str) -> bool:
    """Tensors llama-quantize leaves in float: norms, biases, sinks, the routers, the shared expert's gate."""
    return "norm" in name or name.endswith(".bias") or "ffn_gate_inp" in name or "sinks" in name


def tensor_type(case: MoeCase, name: str) -> str:
    if case.types == "F32" or _float_tensor(name):
        return "F32"
    if case.types == "MXFP4":
        return "MXFP4" if "_exps." in name else "Q8_0"
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
        if kind == "MXFP4":  # the gguf package quantizes it (random_matrix knows ggml's older types)
            normal = (self.rng.standard_normal((max(n_expert, 1) * rows, cols)) * scale).astype(np.float32)
            data = gguf.quants.quantize(normal, gguf.GGMLQuantizationType.MXFP4)
        else:
            data = random_matrix(self.rng, kind, max(n_expert, 1) * rows, cols, scale)
        if n_expert:
            data = data.reshape(n_expert, rows, -1)
        self.tensors[name] = (data, kind)

    def vector(self, name: str, n: int | tuple[int, int], mean: float, std: float) -> None:
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
    if c.arch == "gpt-oss":
        w.vector(p + "attn_output.bias", c.n_embd, 0.0, 0.5)
        w.vector(p + "attn_sinks.weight", c.n_head, c.sink, 2.0)  # some heads' sinks take most of the weight


def _experts(w: _Weights, p: str) -> None:
    c = w.case
    oss = c.arch == "gpt-oss"
    w.vector(p + ("post_attention_norm.weight" if oss else "ffn_norm.weight"), c.n_embd, 1.0, 0.1)
    # std 1/sqrt(n_embd) on normed inputs: router logits of spread ~1, so no near ties between experts
    w.matrix(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd)
    w.matrix(p + "ffn_gate_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert)
    w.matrix(p + "ffn_up_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert)
    w.matrix(p + "ffn_down_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert)
    if oss:  # biases on the router and every expert matrix; gate logits past the clamp (7) at times
        w.vector(p + "ffn_gate_inp.bias", c.n_expert, 0.0, 0.5)
        w.vector(p + "ffn_gate_exps.bias", (c.n_expert, c.n_ff_exp), 0.0, 3.0)
        w.vector(p + "ffn_up_exps.bias", (c.n_expert, c.n_ff_exp), 0.0, 3.0)
        w.vector(p + "ffn_down_exps.bias", (c.n_expert, c.n_embd), 0.0, 0.5)
    if c.n_ff_shexp:
        w.vector(p + "ffn_gate_inp_shexp.weight", c.n_embd, 0.0, 1.0 / math.sqrt(c.n_embd))
        w.matrix(p + "ffn_gate_shexp.weight", c.n_ff_shexp, c.n_embd)
        w.matrix(p + "ffn_up_shexp.weight", c.n_ff_shexp, c.n_embd)
        w.matrix(p + "ffn_down_shexp.weight", c.n_embd, c.n_ff_shexp)


def model_tensors(case: MoeCase) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (stored data, type name), in the order they are written."""
    w = _Weights(case)
    w.matrix("token_embd.weight", case.n_vocab, case.n_embd, std=1.0)
    w.vector("output_norm.weight", case.n_embd, 1.0, 0.1)
    w.matrix("output.weight", case.n_vocab, case.n_embd)
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
    # Mixtral's and gpt-oss's experts are feed_forward_length wide; the Qwen families' dense width is unused
    w.add_feed_forward_length(c.n_ff_exp if a in ("llama", "gpt-oss") else c.n_ff_exp * c.n_used)
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
        w.add_vocab_size(c.n_vocab)
        w.add_rope_dimension_count(c.head_dim)
    if c.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(c.n_ff_shexp)
    if a == "gpt-oss":  # gpt-oss-20b: window 128, YaRN x32 over 4096 (here x8 over 128)
        w.add_sliding_window(c.sliding_window)
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 8.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 128)
    w.add_file_type({"F32": 0, "Q8_0": 7, "Q4_K_M": 15, "MXFP4": 38}[c.types])


def write_gguf(
    case: MoeCase,
    path: Path,
    tensors: dict[str, tuple[np.ndarray, str]] | None = None,
    used_count: list[int] | None = None,
    vocabulary: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """The case's model as a GGUF file at `path` (same case, same bytes); `tensors` replace the case's
    own (a test's other layouts), `used_count` writes expert_used_count as a per-layer array,
    `vocabulary` writes the tokenizer's metadata (tests/synthetic_gguf.py's 320 tokens otherwise)."""
    w = gguf.GGUFWriter(str(path), case.arch)
    _write_metadata(w, case, used_count)
    if vocabulary is None:
        _write_vocabulary(w, "gpt-2")
    else:
        vocabulary(w)
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
    if arch == "gpt-oss":  # gpt-oss-20b: 64:8 heads of 64 under 2880, 32 experts, 4 used, biases
        return MoeCase("", "gpt-oss", n_expert=8, qkv_bias=True, sliding_window=8, rope_base=150000.0)
    # Mixtral 8x7B: 8 experts, 2 used, 32:8 heads of 128 (n_embd / n_head)
    return MoeCase("", "llama", n_head=8, n_kv_head=2, head_dim=32, n_expert=8, n_used=2, n_ff_exp=512)


def _case(name: str, arch: str, types: str, **changes: float) -> MoeCase:
    from dataclasses import replace

    return replace(_family(arch), name=name, types=types, **changes)


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
        _case("gpt-oss-f32", "gpt-oss", "F32"),
        _case("gpt-oss-mxfp4", "gpt-oss", "MXFP4"),
        # Sinks at -1e4: a first token's attention weight is exactly 1 on both sides again (llama.cpp's
        # non-flash attention rounds the weights to f16 for the value product, which a live sink's
        # weight of < 1 does not survive), so its logits isolate the MXFP4 experts, the routing and biases.
        _case("gpt-oss-mxfp4-no-sinks", "gpt-oss", "MXFP4", sink=-1e4),
    )
}
