"""Small seeded Gemma 4 GGUFs (`gemma4`), written with the metadata keys, tensor names and shapes that
llama.cpp's converter (conversion/gemma.py's Gemma4Model) writes. The weights are synthetic: random
numbers from a seed (the case's name), not Google's; the same case always gives the same bytes, so
scripts/make_gemma4_goldens.py (llama.cpp's logits, committed with each file's sha256) and
tests/test_gemma4.py (Llamba's) run the very same model without committing it.

The tokenizer is tests/synthetic_gguf.py's 320-token byte-level BPE (`gpt2`, pre-tokenizer gpt-2),
which llama.cpp loads under any architecture; a case with `chat_template` also carries llama.cpp's
models/templates/google-gemma-4-31B-it.jinja (read from the reference sdist) as
`tokenizer.chat_template`.

What the cases hold, as the real releases do:

- `gemma4-dense` (E2B/E4B-style): sliding-window and global layers interleaved by a per-layer
  `attention.sliding_window_pattern`, with their own head dims (`attention.key_length_swa` 32,
  `attention.key_length` 64) and kv-head counts (a per-layer `attention.head_count_kv`), NeoX RoPE
  (base 10000 on sliding layers, 1e6 with the converter's proportional `rope_freqs.weight` on global
  ones: 1 for the rotated quarter of the pairs, 1e30 for the rest), the last two layers sharing the KV
  cache of the last sliding and global layers that have one (`attention.shared_kv_layers`), global
  layers without `attn_v` (V is K's projection), per-layer embedding inputs
  (`embedding_length_per_layer_input`, `per_layer_token_embd`, `per_layer_model_proj`, each layer's
  `inp_gate`/`proj`/`post_norm`), a per-layer `feed_forward_length` (doubled on the shared-KV layers, the
  converter's use_double_wide_mlp), a `layer_output_scale` per layer and final logit soft-capping;
- `gemma4-moe` (26B-A4B-style): every layer's dense FFN beside routed experts with their extra norms
  (`pre_ffw_norm_2`, `post_ffw_norm_1`, `post_ffw_norm_2`), the router's input scale
  (`ffn_gate_inp.scale`) and the per-expert output scale (`ffn_down_exps.scale`), gate and up fused in
  `ffn_gate_up_exps` as the converter writes Hugging Face's `experts.gate_up_proj`
  (`gemma4-moe-split-q8_0`: as two tensors, which llama.cpp also loads); no per-layer embeddings, no
  shared KV;
- `*-q8_0`: the same models with every matrix Q8_0 (quantized by the `gguf` package), the router and
  vectors float32 as llama-quantize leaves them;
- `*-q4_k_m`: llama-quantize's Q4_K_M mixture (llama.cpp 0c1e570's choices for a real release): Q4_K
  matrices; Q6_K for the head, which is the tied `token_embd` (and so `per_layer_token_embd`, the same
  category to llama-quantize), for `attn_v` and for every `ffn_down*` (dense and experts) on the layers
  its `use_more_bits` picks (the first and last eighth, every third between; attn_v counted over the
  layers that have one); `per_layer_model_proj`, the router, norms and scales float32. (Its special
  case for exactly 8 experts, Mixtral's Q8_0 attn_k/attn_v, is not applied: the releases have more.)
  K-quant rows hold whole 256-value super-blocks, so these cases are 256 wide with 64/128-wide heads
  (the dense one with 256-wide per-layer inputs, as E2B/E4B's) and 256-wide experts; the weights are
  random K-quant bits with chosen super-block scales (tests/synthetic_quant_gguf.py: the `gguf` package
  cannot quantize K types).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

from tests.synthetic_gguf import BOS, N_VOCAB, _write_vocabulary
from tests.synthetic_quant_gguf import random_matrix

TEMPLATE = "models/templates/google-gemma-4-31B-it.jinja"


@dataclass(frozen=True)
class Gemma4Case:
    """One synthetic Gemma 4 model: its name (the seed), shape, layer layout and tensor types."""

    name: str
    types: str = "F32"  # F32, Q8_0 or Q4_K_M
    layers: str = "SSSGSG"  # per layer: S sliding window, G global
    n_embd: int = 128
    n_head: int = 4
    head_dim_swa: int = 32
    head_dim: int = 64  # global layers
    n_kv_swa: int = 2
    n_kv: int = 1  # global layers
    n_ff: int = 256
    n_kv_shared: int = 2  # the last layers read earlier layers' KV cache
    n_embd_per_layer: int = 32  # 0: no per-layer embedding inputs
    double_wide_shared: bool = True  # n_ff doubled on the shared-KV layers
    v_from_k: bool = True  # global layers have no attn_v
    sliding_window: int = 8
    partial_rotary: float = 0.25  # of the global layers' pairs
    rope_base: float = 1e6
    rope_base_swa: float = 1e4
    softcap: float = 3.0  # 0: no final_logit_softcapping key
    n_expert: int = 0
    n_used: int = 0
    n_ff_exp: int = 0
    fused_gate_up: bool = True  # ffn_gate_up_exps (the converter's), else ffn_gate_exps + ffn_up_exps
    chat_template: bool = False
    n_ctx: int = 256
    n_tokens: int = 32

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def is_swa(self, il: int) -> bool:
        return self.layers[il] == "S"

    def has_kv(self, il: int) -> bool:
        return il < self.n_layer - self.n_kv_shared

    def layer_dims(self, il: int) -> tuple[int, int]:
        """(head_dim, kv heads) of layer il."""
        return (self.head_dim_swa, self.n_kv_swa) if self.is_swa(il) else (self.head_dim, self.n_kv)

    def n_ff_of(self, il: int) -> int:
        return 2 * self.n_ff if self.double_wide_shared and not self.has_kv(il) else self.n_ff

    def has_v(self, il: int) -> bool:
        return self.has_kv(il) and (self.is_swa(il) or not self.v_from_k)


def _float_tensor(name: str) -> bool:
    """What llama-quantize leaves in float32: vectors, scales, the router."""
    return name.endswith((".scale", "norm.weight", "rope_freqs.weight", "output_scale.weight")) or (
        "ffn_gate_inp" in name
    )


def use_more_bits(i: int, n: int) -> bool:
    """llama-quantize's Q4_K_M "more bits" layers: the first and last eighth, every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(case: Gemma4Case, name: str) -> str:
    """What llama-quantize (with the case's type) stores a tensor in (the module's docstring)."""
    if case.types == "F32" or _float_tensor(name):
        return "F32"
    if case.types == "Q8_0":
        return "Q8_0"
    if name == "per_layer_model_proj.weight":  # llama-quantize leaves it as it is
        return "F32"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):  # the tied head
        return "Q6_K"
    il = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if ".attn_v." in name:
        with_v = [i for i in range(case.n_layer) if case.has_v(i)]
        return "Q6_K" if use_more_bits(with_v.index(il), len(with_v)) else "Q4_K"
    if ".ffn_down" in name:
        return "Q6_K" if use_more_bits(il, case.n_layer) else "Q4_K"
    return "Q4_K"


class _Weights:
    """The case's tensors in write order, each stored in its type."""

    def __init__(self, case: Gemma4Case) -> None:
        self.case = case
        self.rng = np.random.default_rng(zlib.crc32(case.name.encode()))
        self.tensors: dict[str, tuple[np.ndarray, str]] = {}

    def matrix(self, name: str, rows: int, cols: int, n_expert: int = 0, std: float | None = None) -> None:
        scale = 1.0 / math.sqrt(cols) if std is None else std
        kind = tensor_type(self.case, name)
        data = random_matrix(self.rng, kind, max(n_expert, 1) * rows, cols, scale)
        self.tensors[name] = (data.reshape(n_expert, rows, -1) if n_expert else data, kind)

    def vector(self, name: str, n: int, mean: float, std: float) -> None:
        self.tensors[name] = ((mean + std * self.rng.standard_normal(n)).astype(np.float32), "F32")

    def uniform(self, name: str, n: int, low: float, high: float) -> None:
        self.tensors[name] = (self.rng.uniform(low, high, n).astype(np.float32), "F32")


def _attention(w: _Weights, il: int) -> None:
    c, p = w.case, f"blk.{il}."
    head_dim, n_kv = c.layer_dims(il)
    w.vector(p + "attn_norm.weight", c.n_embd, 1.0, 0.1)
    w.matrix(p + "attn_q.weight", c.n_head * head_dim, c.n_embd)
    if c.has_kv(il):
        w.matrix(p + "attn_k.weight", n_kv * head_dim, c.n_embd)
        if c.has_v(il):
            w.matrix(p + "attn_v.weight", n_kv * head_dim, c.n_embd)
        w.vector(p + "attn_k_norm.weight", head_dim, 1.0, 0.1)
    # q/k norm weights well under 1: Gemma 4 attends with scale 1 on normed heads, and scores of
    # spread ~head_dim would make every softmax one-hot
    w.vector(p + "attn_q_norm.weight", head_dim, 0.25, 0.025)
    w.matrix(p + "attn_output.weight", c.n_embd, c.n_head * head_dim)
    w.vector(p + "post_attention_norm.weight", c.n_embd, 1.0, 0.1)


def _ffn(w: _Weights, il: int) -> None:
    c, p = w.case, f"blk.{il}."
    n_ff = c.n_ff_of(il)
    w.vector(p + "ffn_norm.weight", c.n_embd, 1.0, 0.1)
    w.matrix(p + "ffn_gate.weight", n_ff, c.n_embd)
    w.matrix(p + "ffn_up.weight", n_ff, c.n_embd)
    w.matrix(p + "ffn_down.weight", c.n_embd, n_ff)
    w.vector(p + "post_ffw_norm.weight", c.n_embd, 1.0, 0.1)
    if c.n_expert:
        # std 1: router logits of spread ~1 after the router input's 1/sqrt(n_embd), so no near ties
        w.matrix(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd, std=1.0)
        w.vector(p + "ffn_gate_inp.scale", c.n_embd, 1.0, 0.1)
        w.vector(p + "pre_ffw_norm_2.weight", c.n_embd, 1.0, 0.1)
        w.vector(p + "post_ffw_norm_1.weight", c.n_embd, 1.0, 0.1)
        w.vector(p + "post_ffw_norm_2.weight", c.n_embd, 1.0, 0.1)
        if c.fused_gate_up:  # the converter's layout (Hugging Face's experts.gate_up_proj)
            w.matrix(p + "ffn_gate_up_exps.weight", 2 * c.n_ff_exp, c.n_embd, c.n_expert)
        else:
            w.matrix(p + "ffn_gate_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert)
            w.matrix(p + "ffn_up_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert)
        w.matrix(p + "ffn_down_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert)
        w.uniform(p + "ffn_down_exps.scale", c.n_expert, 0.5, 1.5)


def _per_layer(w: _Weights, il: int) -> None:
    c, p = w.case, f"blk.{il}."
    if c.n_embd_per_layer:
        w.matrix(p + "inp_gate.weight", c.n_embd_per_layer, c.n_embd)
        w.matrix(p + "proj.weight", c.n_embd, c.n_embd_per_layer)
        w.vector(p + "post_norm.weight", c.n_embd, 1.0, 0.1)
    w.uniform(p + "layer_output_scale.weight", 1, 0.5, 1.5)


def _rope_freqs(c: Gemma4Case) -> np.ndarray:
    """The converter's proportional RoPE factors of the global layers: 1 for the rotated pairs, 1e30
    (no rotation) for the others."""
    n_rot = int(c.head_dim * c.partial_rotary / 2)
    return np.array([1.0] * n_rot + [1e30] * (c.head_dim // 2 - n_rot), dtype=np.float32)


def model_tensors(case: Gemma4Case) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (stored data, type name), in the order they are written. The head is the token
    embedding (Gemma's tied embeddings: no output.weight)."""
    w = _Weights(case)
    w.tensors["rope_freqs.weight"] = (_rope_freqs(case), "F32")
    # std 1/sqrt(n_embd): the embedding scaled by sqrt(n_embd) enters the first layer at ~1 per element
    w.matrix("token_embd.weight", N_VOCAB, case.n_embd, std=1.0 / math.sqrt(case.n_embd))
    if case.n_embd_per_layer:
        n_all = case.n_layer * case.n_embd_per_layer
        w.matrix("per_layer_token_embd.weight", N_VOCAB, n_all, std=1.0 / math.sqrt(case.n_embd_per_layer))
        w.matrix("per_layer_model_proj.weight", n_all, case.n_embd, std=1.0)
        w.vector("per_layer_proj_norm.weight", case.n_embd_per_layer, 1.0, 0.1)
    w.vector("output_norm.weight", case.n_embd, 1.0, 0.1)
    for il in range(case.n_layer):
        _attention(w, il)
        _ffn(w, il)
        _per_layer(w, il)
    return w.tensors


def _write_metadata(w: gguf.GGUFWriter, c: Gemma4Case) -> None:
    w.add_name("Llamba synthetic Gemma 4 model")
    w.add_block_count(c.n_layer)
    w.add_context_length(1024)
    w.add_embedding_length(c.n_embd)
    if c.double_wide_shared and c.n_kv_shared:
        w.add_feed_forward_length([c.n_ff_of(il) for il in range(c.n_layer)])
    else:
        w.add_feed_forward_length(c.n_ff)
    w.add_head_count(c.n_head)
    w.add_head_count_kv([c.layer_dims(il)[1] for il in range(c.n_layer)])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_key_length_swa(c.head_dim_swa)
    w.add_value_length_swa(c.head_dim_swa)
    w.add_rope_freq_base(c.rope_base)
    w.add_rope_freq_base_swa(c.rope_base_swa)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_dimension_count_swa(c.head_dim_swa)
    w.add_sliding_window(c.sliding_window)
    w.add_sliding_window_pattern([c.is_swa(il) for il in range(c.n_layer)])
    w.add_shared_kv_layers(c.n_kv_shared)
    w.add_embedding_length_per_layer_input(c.n_embd_per_layer)
    if c.softcap:
        w.add_final_logit_softcapping(c.softcap)
    if c.n_expert:
        w.add_expert_count(c.n_expert)
        w.add_expert_used_count(c.n_used)
        w.add_expert_feed_forward_length(c.n_ff_exp)
    w.add_file_type({"F32": 0, "Q8_0": 7, "Q4_K_M": 15}[c.types])


def write_gguf(
    case: Gemma4Case, path: Path, tensors: dict[str, tuple[np.ndarray, str]] | None = None
) -> Path:
    """The case's model as a GGUF file at `path` (same case, same bytes); `tensors` replace the case's
    own (a test's other layouts)."""
    w = gguf.GGUFWriter(str(path), "gemma4")
    _write_metadata(w, case)
    _write_vocabulary(w, "gpt-2")
    if case.chat_template:
        from engine.reference_data import reference_file

        w.add_chat_template(reference_file(TEMPLATE).read_text())
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


def prompt_tokens(case: Gemma4Case) -> list[int]:
    """The case's input: seeded token ids, BOS first."""
    rng = np.random.default_rng(zlib.crc32(("tokens:" + case.name).encode()))
    return [BOS, *rng.integers(0, BOS, case.n_tokens - 1).tolist()]


# 26B-A4B's layout: no per-layer embeddings, no shared KV, every layer's FFN beside routed experts (four
# layers: fewer than the dense case's six, so llama.cpp's f16 attention rounding compounds less)
_MOE = Gemma4Case(
    "gemma4-moe",
    layers="SGSG",
    n_embd=256,
    n_head=4,
    head_dim_swa=64,
    head_dim=128,
    n_kv_swa=2,
    n_kv=1,
    n_ff=256,
    n_kv_shared=0,
    n_embd_per_layer=0,
    double_wide_shared=False,
    softcap=30.0,
    n_expert=8,
    n_used=2,
    n_ff_exp=128,
)
_DENSE = Gemma4Case("gemma4-dense", chat_template=True)
# K-quant shapes: rows of whole 256-value super-blocks (the heads as the MoE case's)
_K_WIDE = {"n_embd": 256, "head_dim_swa": 64, "head_dim": 128}

CASES: dict[str, Gemma4Case] = {
    c.name: c
    for c in (
        _DENSE,
        replace(_DENSE, name="gemma4-dense-q8_0", types="Q8_0", chat_template=False),
        _MOE,
        replace(_MOE, name="gemma4-moe-q8_0", types="Q8_0"),
        replace(_MOE, name="gemma4-moe-split-q8_0", types="Q8_0", fused_gate_up=False),
        # the releases' Q4_K_M (E2B/E4B, 26B-A4B)
        replace(
            _DENSE,
            name="gemma4-dense-q4_k_m",
            types="Q4_K_M",
            chat_template=False,
            n_embd_per_layer=256,
            **_K_WIDE,
        ),
        replace(_MOE, name="gemma4-moe-q4_k_m", types="Q4_K_M", n_ff_exp=256),
    )
}
