"""A synthetic mixture-of-experts GGUF with Qwen3-30B-A3B's widths, for scripts/bench_moe.py.

    .venv/bin/python scripts/make_moe_bench_model.py [--layers 16] [--out DIR]

Qwen3-30B-A3B's shape (its config.json): n_embd 2048, 128 experts of FFN width 768, 8 used with
normalised weights, 32 query heads and 4 KV heads of head_dim 128 with Q/K norms, a 151936-token vocabulary;
only the layer count is smaller (48 in the release: 16.5 GB of Q4_K experts, more than this 23 GB machine
holds twice, once in the page cache for llama.cpp and once for Llamba). Tensor types as the Q4_K_M
release: every expert Q4_K (the release keeps some layers' ffn_down_exps in Q6_K; the acceptance asks
Q4_K experts), attn_v and the output head Q6_K, the other matrices Q4_K, router and norms float32.
Weights are tests/synthetic_quant_gguf.random_matrix's random K-quant bits with chosen scales; the
vocabulary is its SentencePiece-style one (the tokenizer plays no part in the timings).

The file goes to ~/.cache/llamba/bench (never committed) as qwen3moe-a3b-<layers>L-q4_k_m.gguf; an
existing file of that name is kept. The tensors are written one at a time (GGUFWriter's tensor infos
first, then each tensor's data), so the script holds one tensor, not the model, in memory.
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

from tests.synthetic_moe_gguf import MoeCase, _write_metadata  # noqa: E402
from tests.synthetic_quant_gguf import random_matrix, write_vocabulary  # noqa: E402

CACHE = Path.home() / ".cache" / "llamba" / "bench"
N_VOCAB = 151936


def case(n_layer: int) -> MoeCase:
    """Qwen3-30B-A3B's widths with n_layer layers."""
    return MoeCase(
        f"qwen3moe-a3b-{n_layer}L",
        "qwen3moe",
        "Q4_K_M",
        n_layer=n_layer,
        n_embd=2048,
        n_head=32,
        n_kv_head=4,
        head_dim=128,
        n_expert=128,
        n_used=8,
        n_ff_exp=768,
    )


def tensor_specs(c: MoeCase) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape rows-first with the expert axis leading, type) of every tensor, in write order."""
    q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    specs = [
        ("token_embd.weight", (N_VOCAB, c.n_embd), "Q4_K"),
        ("output_norm.weight", (c.n_embd,), "F32"),
        ("output.weight", (N_VOCAB, c.n_embd), "Q6_K"),
    ]
    for il in range(c.n_layer):
        p = f"blk.{il}."
        specs += [
            (p + "attn_norm.weight", (c.n_embd,), "F32"),
            (p + "attn_q.weight", (q, c.n_embd), "Q4_K"),
            (p + "attn_k.weight", (kv, c.n_embd), "Q4_K"),
            (p + "attn_v.weight", (kv, c.n_embd), "Q6_K"),
            (p + "attn_q_norm.weight", (c.head_dim,), "F32"),
            (p + "attn_k_norm.weight", (c.head_dim,), "F32"),
            (p + "attn_output.weight", (c.n_embd, q), "Q4_K"),
            (p + "ffn_norm.weight", (c.n_embd,), "F32"),
            (p + "ffn_gate_inp.weight", (c.n_expert, c.n_embd), "F32"),
            (p + "ffn_gate_exps.weight", (c.n_expert, c.n_ff_exp, c.n_embd), "Q4_K"),
            (p + "ffn_up_exps.weight", (c.n_expert, c.n_ff_exp, c.n_embd), "Q4_K"),
            (p + "ffn_down_exps.weight", (c.n_expert, c.n_embd, c.n_ff_exp), "Q4_K"),
        ]
    return specs


def make(name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """The tensor's stored data (rows, bytes per row; float32 for F32), seeded by its name."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if len(shape) == 1:  # norms: about 1
        return (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
    cols = shape[-1]
    std = 1.0 if name == "token_embd.weight" else 1.0 / math.sqrt(cols)
    if kind == "F32":
        return (rng.standard_normal(shape) * std).astype(np.float32)
    rows = math.prod(shape[:-1])
    chunk = 16384  # rows per random_matrix call: its float copy for the spread stays ~100 MB
    parts = [random_matrix(rng, kind, min(chunk, rows - r), cols, std) for r in range(0, rows, chunk)]
    return np.concatenate(parts).reshape(*shape[:-1], -1)


def write(path: Path, c: MoeCase) -> None:
    w = gguf.GGUFWriter(str(path), c.arch)
    _write_metadata(w, c, None)
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
        print(name, flush=True)
    w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--out", type=Path, default=CACHE)
    args = p.parse_args()
    c = case(args.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{c.name}-q4_k_m.gguf"
    if not path.exists():
        tmp = path.with_suffix(".part")
        write(tmp, c)
        tmp.rename(path)
    print(path)


if __name__ == "__main__":
    main()
