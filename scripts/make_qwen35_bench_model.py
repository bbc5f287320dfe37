"""Synthetic Qwen3.5-hybrid GGUFs at real widths, for scripts/bench_qwen35_speed.py (issue 49's speed check).

    .venv/bin/python scripts/make_qwen35_bench_model.py --model 2b          # qwen35, all 24 layers
    .venv/bin/python scripts/make_qwen35_bench_model.py --model a3b [--layers 12]

Two shapes (tests/synthetic_qwen35.py's layouts: the converter's tensor names and orders):

- `2b`: Qwen3.5-2B's widths as assumed from its config family (the 0.8B / 4B / 9B configs' pattern;
  the 2B's own config.json was not at hand): 24 layers, every 4th full attention, n_embd 2048, FFN
  6144, attention 8 query heads / 2 KV heads of head_dim 256 with 64 rotated dimensions (partial rotary
  0.25, interleaved M-RoPE sections [11, 11, 10, 0]), Gated DeltaNet 16 key heads and 16 value heads of
  128 (6144 conv channels), conv kernel 4, a 248320-token vocabulary with tied embeddings (no
  `output.weight`: the head is `token_embd`).
- `a3b`: Qwen3.6-35B-A3B's widths (`qwen35moe`): n_embd 2048, 256 experts of FFN 512 with 8 used plus
  a shared expert of 512 (sigmoid-gated), attention 16 heads / 2 KV heads of 256 (64 rotated), Gated
  DeltaNet 16 key heads / 32 value heads of 128 (8192 conv channels), vocabulary 248320, separate head.
  The release has 40 layers (19 GB in Q4_K_M); `--layers` keeps the first n (default 12: 6.5 GB, so the
  file in the page cache for llama.cpp plus Llamba's packed copy fit this 23 GB machine with room for
  another engineer's tests), every 4th still attention.

Tensor types are llama-quantize's Q4_K_M choices (llama.cpp 0c1e570's llama_tensor_get_type, checked by
quantizing 24- and 12-layer float clones of these files with its llama-quantize): Q4_K by default;
Q6_K for the head (and so for a tied `token_embd`; an untied one stays Q4_K); `attn_v` and the Gated
DeltaNet's `attn_qkv` (one counter over both, so the layer index) and every `ffn_down*` (dense,
routed and shared) in Q6_K on the layers `use_more_bits` picks (the first and last eighth, every third
between); the routers, norms, conv kernels, dt_bias and A float32. Weights are
tests/synthetic_quant_gguf.random_matrix's random K-quant bits with chosen scales; the DeltaNet's gates
as tests/synthetic_qwen35.py draws them (decays spread over (0.27, 0.99)); the vocabulary is its
SentencePiece-style test vocabulary of 248320 tokens (the tokenizer plays no part in the timings).

The files go to ~/.cache/llamba/bench (never into the repository); an existing file of the same name is
kept. Tensors are written one at a time, so the script holds one tensor, not the model, in memory.
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.synthetic_quant_gguf import random_matrix, write_vocabulary  # noqa: E402
from tests.synthetic_qwen35 import Qwen35Case, _write_metadata  # noqa: E402

CACHE = Path.home() / ".cache" / "llamba" / "bench"
N_VOCAB = 248320
A3B_LAYERS = 40  # Qwen3.6-35B-A3B's trunk


def case(model: str, n_layer: int) -> Qwen35Case:
    if model == "2b":
        return Qwen35Case(
            "qwen35-2b-24L", "qwen35", "Q4_K_M", n_layer=24, full_attention_interval=4, n_embd=2048,
            n_head=8, n_kv_head=2, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128,
            n_k_heads=16, n_v_heads=16, n_ff=6144,
        )  # fmt: skip
    return Qwen35Case(
        f"qwen36-35b-a3b-{n_layer}L", "qwen35moe", "Q4_K_M", n_layer=n_layer, full_attention_interval=4,
        n_embd=2048, n_head=16, n_kv_head=2, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
        d_state=128, n_k_heads=16, n_v_heads=32, n_expert=256, n_used=8, n_ff_exp=512, n_ff_shexp=512,
    )  # fmt: skip


def tied(c: Qwen35Case) -> bool:
    return c.arch == "qwen35"


def use_more_bits(il: int, n_layer: int) -> bool:
    """llama-quantize's Q4_K_M layers that get Q6_K for attn_v/attn_qkv and ffn_down."""
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def q4_k_m(name: str, il: int, c: Qwen35Case) -> str:
    """The type llama-quantize's Q4_K_M gives a matrix (see the module's docstring)."""
    if name == "token_embd.weight":
        return "Q6_K" if tied(c) else "Q4_K"
    if name == "output.weight":
        return "Q6_K"
    more = any(k in name for k in ("attn_v.", "attn_qkv.", "ffn_down"))
    return "Q6_K" if more and use_more_bits(il, c.n_layer) else "Q4_K"


Spec = tuple[str, tuple[int, ...], str]  # name, shape rows-first (expert axis leading), type


def tensor_specs(c: Qwen35Case) -> list[Spec]:
    """Every tensor in write order (tests/synthetic_qwen35.py's)."""
    specs: list[Spec] = [("token_embd.weight", (N_VOCAB, c.n_embd), q4_k_m("token_embd.weight", -1, c))]
    specs.append(("output_norm.weight", (c.n_embd,), "F32"))
    if not tied(c):
        specs.append(("output.weight", (N_VOCAB, c.n_embd), "Q6_K"))
    key_dim, value_dim = c.n_k_heads * c.d_state, c.n_v_heads * c.d_state
    for il in range(c.n_layer):
        p = f"blk.{il}."

        def matrix(name: str, *shape: int, il: int = il, p: str = p) -> Spec:
            return (p + name, shape, q4_k_m(p + name, il, c))

        specs.append((p + "attn_norm.weight", (c.n_embd,), "F32"))
        if c.recurrent(il):
            specs += [
                matrix("attn_qkv.weight", 2 * key_dim + value_dim, c.n_embd),
                matrix("attn_gate.weight", value_dim, c.n_embd),
                (p + "ssm_conv1d.weight", (c.conv_channels, c.d_conv), "F32"),
                (p + "ssm_dt.bias", (c.n_v_heads,), "F32"),
                (p + "ssm_a", (c.n_v_heads,), "F32"),
                matrix("ssm_beta.weight", c.n_v_heads, c.n_embd),
                matrix("ssm_alpha.weight", c.n_v_heads, c.n_embd),
                (p + "ssm_norm.weight", (c.d_state,), "F32"),
                matrix("ssm_out.weight", c.n_embd, value_dim),
            ]
        else:
            q = c.n_head * c.head_dim
            specs += [
                matrix("attn_q.weight", 2 * q, c.n_embd),  # per head: query rows, then gate rows
                matrix("attn_k.weight", c.n_kv_head * c.head_dim, c.n_embd),
                matrix("attn_v.weight", c.n_kv_head * c.head_dim, c.n_embd),
                (p + "attn_q_norm.weight", (c.head_dim,), "F32"),
                (p + "attn_k_norm.weight", (c.head_dim,), "F32"),
                matrix("attn_output.weight", c.n_embd, q),
            ]
        specs.append((p + "post_attention_norm.weight", (c.n_embd,), "F32"))
        if not c.moe:
            specs += [
                matrix("ffn_gate.weight", c.n_ff, c.n_embd),
                matrix("ffn_up.weight", c.n_ff, c.n_embd),
                matrix("ffn_down.weight", c.n_embd, c.n_ff),
            ]
            continue
        specs += [
            (p + "ffn_gate_inp.weight", (c.n_expert, c.n_embd), "F32"),
            matrix("ffn_gate_exps.weight", c.n_expert, c.n_ff_exp, c.n_embd),
            matrix("ffn_up_exps.weight", c.n_expert, c.n_ff_exp, c.n_embd),
            matrix("ffn_down_exps.weight", c.n_expert, c.n_embd, c.n_ff_exp),
            (p + "ffn_gate_inp_shexp.weight", (c.n_embd,), "F32"),
            matrix("ffn_gate_shexp.weight", c.n_ff_shexp, c.n_embd),
            matrix("ffn_up_shexp.weight", c.n_ff_shexp, c.n_embd),
            matrix("ffn_down_shexp.weight", c.n_embd, c.n_ff_shexp),
        ]
    return specs


def vector(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """A float vector as tests/synthetic_qwen35.py draws it for its role."""
    if name.endswith("ssm_dt.bias"):
        return (-1.0 + 0.5 * rng.standard_normal(n)).astype(np.float32)
    if name.endswith("ssm_a"):  # A in (0.02, 1): per-token decays over (0.27, 0.99)
        return (-np.exp(rng.uniform(math.log(0.02), 0.0, n))).astype(np.float32)
    if name.endswith("ffn_gate_inp_shexp.weight"):
        return (rng.standard_normal(n) / math.sqrt(n)).astype(np.float32)
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # norms: about 1


def make(name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """The tensor's stored data (rows, bytes per row; float32 for F32), seeded by its name."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if len(shape) == 1:
        return vector(name, shape[0], rng)
    cols = shape[-1]
    if name.endswith("ssm_conv1d.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    std = 1.0 if name == "token_embd.weight" else 1.0 / math.sqrt(cols)
    if kind == "F32":
        return (rng.standard_normal(shape) * std).astype(np.float32)
    rows = math.prod(shape[:-1])
    chunk = 16384  # rows per random_matrix call: its float copy for the spread stays ~130 MB
    parts = [random_matrix(rng, kind, min(chunk, rows - r), cols, std) for r in range(0, rows, chunk)]
    return np.concatenate(parts).reshape(*shape[:-1], -1)


def write(path: Path, c: Qwen35Case) -> None:
    w = gguf.GGUFWriter(str(path), c.arch)
    _write_metadata(w, c)
    write_vocabulary(w, N_VOCAB)
    specs = tensor_specs(c)
    for name, shape, kind in specs:
        qtype = gguf.GGMLQuantizationType[kind]
        block, size = gguf.constants.GGML_QUANT_SIZES[qtype]
        nbytes = math.prod(shape[:-1]) * shape[-1] // block * size
        stored = (*shape[:-1], shape[-1] // block * size) if kind != "F32" else shape
        w.add_tensor_info(name, stored, np.dtype(np.float32 if kind == "F32" else np.uint8), nbytes, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in specs:
        w.write_tensor_data(make(name, shape, kind))
        print(name, kind, flush=True)
    w.close()


def model_path(model: str, n_layer: int, out: Path = CACHE) -> Path:
    return out / f"{case(model, n_layer).name}-q4_k_m.gguf"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("2b", "a3b"), required=True)
    p.add_argument("--layers", type=int, default=12, help="a3b: layers kept of the release's 40 (default 12)")
    p.add_argument("--out", type=Path, default=CACHE)
    args = p.parse_args()
    if not 1 <= args.layers <= A3B_LAYERS:
        p.error(f"--layers must be 1-{A3B_LAYERS}")
    c = case(args.model, args.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    path = model_path(args.model, args.layers, args.out)
    if not path.exists():
        tmp = path.with_suffix(".part")
        write(tmp, c)
        tmp.rename(path)
    print(path)


if __name__ == "__main__":
    main()
