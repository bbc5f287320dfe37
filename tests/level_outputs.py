"""Digests of the float kernels' outputs and of three real models' hidden states, for comparing levels.

    LLAMBA_CPU_LEVEL=avx2 .venv/bin/python -m tests.level_outputs

Prints one line per kernel (and per model): its name and the sha256 of its float32 outputs on fixed
random inputs. tests/test_cpu_levels.py runs it on every level the machine executes and compares: every
sum in these kernels adds in one order (engine/cpu/lanes.py), so the levels that contract multiplies and
adds into FMAs alike (avx2 and up) must give the same bits, and so must a whole model. The models' lines
are what issue 48 was about: Gemma 3's states differed between avx512-vnni and avx2 in their attention.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from engine.batch import Batch, BatchPart
from engine.cpu import delta_net, ops
from engine.cpu.encoder_attention import encoder_attention
from engine.cpu.experts import swiglu_oai
from engine.cpu.sinks import apply_sinks
from engine.llm import LLM
from engine.model_files import resolve

RNG = np.random.default_rng(11)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def norms() -> str:
    x, w = rand(70, 640, scale=3), rand(640)
    small, large = np.empty((5, 640), np.float32), np.empty_like(x)
    ops.rmsnorm(x[:5], w, 1e-6, small)
    ops.rmsnorm(x, w, 1e-6, large)  # rows enough for the parallel loop
    return digest(small, large)


def activations() -> str:
    gate, up = rand(6, 300, scale=4), rand(6, 300)
    outs = []
    for fn in (ops.silu_mul, ops.gelu_mul):
        out = np.empty_like(gate)
        fn(gate, up, out)
        outs.append(out)
    oai = gate.copy()
    swiglu_oai(oai, up, 1.702, 7.0)
    return digest(*outs, oai)


def rope() -> str:
    x = rand(7, 4, 64)
    ops.rope(x, np.arange(7) * 97, 10000.0, True, np.ones(32, np.float32), 1.0)
    y = rand(7, 4, 64)
    ops.rope(y, np.arange(7) * 97, 1e6, False, np.linspace(0.5, 1, 24).astype(np.float32), 1.1)
    return digest(x, y)


def cells(x: np.ndarray, cell_type: str) -> np.ndarray:
    """x[n_seq, n_kv, n_ctx, dim] as cache cells: float16, or Q8_0 bytes written by the store's quantizer."""
    if cell_type == "f16":
        return x.astype(np.float16)
    n_seq, n_kv, n_ctx, dim = x.shape
    out = np.zeros((n_seq, n_kv, n_ctx, dim // 32 * 34), np.uint8)
    for s in range(n_seq):
        rows = np.ascontiguousarray(x[s].transpose(1, 0, 2))  # [n_ctx, n_kv, dim], as a batch's keys
        ops.store_kv(rows, rows, np.full(n_ctx, s), np.arange(n_ctx), out, out.copy())
    return out


def attention(cell_type: str) -> Callable[[], str]:
    """Several sequences, contexts past a key chunk (merged partial results), a window, prefill and
    decode tokens in one call, on f16 or q8_0 cells; then gpt-oss's sinks over the same scores."""

    def run() -> str:
        n_seq, n_kv, n_ctx, dim, n_heads = 2, 2, 600, 64, 8
        k_cache = cells(rand(n_seq, n_kv, n_ctx, dim), cell_type)
        v_cache = cells(rand(n_seq, n_kv, n_ctx, dim), cell_type)
        seq_ids = np.array([0, 0, 0, 1, 1], np.int64)
        positions = np.array([3, 4, 5, 300, 599], np.int64)
        q, sinks = rand(5, n_heads, dim), rand(n_heads)
        outs = []
        for window in (0, 256):
            out = np.empty_like(q)
            ops.attention(q, k_cache, v_cache, seq_ids, positions, window, 0.125, out)
            outs.append(out.copy())
            apply_sinks(q, k_cache, seq_ids, positions, window, 0.125, sinks, out)
            outs.append(out)
        return digest(*outs)

    return run


def delta_net_kernels() -> str:
    """The Gated DeltaNet's conv (two sequences, one a single token past its tail) and delta rule (value
    heads sharing key heads, one sequence deep into its state)."""
    seq_ids = np.array([0, 0, 0, 1], np.int32)
    x, weight_t, tail = rand(4, 300), rand(4, 300, scale=0.5), rand(2, 3, 300)
    conv = np.empty_like(x)
    delta_net.conv1d_silu(x, seq_ids, weight_t, tail, conv)
    q, k, v = rand(4, 2, 64, scale=0.125), rand(4, 2, 64, scale=0.125), rand(4, 4, 64)
    g, beta = -np.abs(rand(4, 4)), np.full((4, 4), 0.6, np.float32)
    state, out = rand(2, 4, 64, 64, scale=0.3), np.empty((4, 4, 64), np.float32)
    delta_net.gated_delta_rule(q, k, v, g, beta, seq_ids, np.arange(4) % 2, state, out)
    return digest(conv, tail, out, state)


def encoder_kernels() -> str:
    """LayerNorm (serial and parallel rows), GELU, and the encoder attention over three inputs packed in
    one call: plain, causal, with a symmetric window, with ALiBi."""
    x, w, b = rand(70, 384, scale=3), rand(384), rand(384)
    small, large, act = np.empty((5, 384), np.float32), np.empty_like(x), np.empty_like(x)
    ops.layernorm(x[:5], w, b, 1e-12, small)
    ops.layernorm(x, w, b, 1e-12, large)
    ops.gelu(x, act)
    lengths = [3, 40, 300]
    spans = np.concatenate(
        [[[s, s + n]] * n for s, n in zip(np.cumsum([0, *lengths[:-1]]), lengths, strict=True)]
    )
    positions = np.concatenate([np.arange(n) for n in lengths])
    q, k, v = rand(343, 4, 32), rand(343, 2, 32), rand(343, 2, 32)
    outs = [small, large, act]
    for causal, window, slopes in ((False, 0, 0.0), (True, 0, 0.0), (False, 8, 0.0), (False, 0, 0.5)):
        out = np.empty_like(q)
        encoder_attention(q, k, v, spans, positions, causal, window, np.full(4, slopes, np.float32), 0.2, out)
        outs.append(out)
    return digest(*outs)


def model(name: str) -> Callable[[], str]:
    """A real model's final hidden states and last logits for a short prompt, in one batch."""

    def run() -> str:
        llm = LLM.load(str(resolve(name)))
        tokens = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog.", True, True)
        hidden = llm.model.run(
            Batch.of([BatchPart(0, 0, tokens, "none", want_hidden=True)]), llm.new_cache(1, 64)
        ).hidden
        logits = llm.model.run(Batch.of([BatchPart(0, 0, tokens, "last")]), llm.new_cache(1, 64)).logits
        return digest(hidden, logits)

    return run


OUTPUTS: dict[str, Callable[[], str]] = {
    "rmsnorm": norms,
    "activations": activations,
    "rope": rope,
    "attention-f16": attention("f16"),
    "attention-q8_0": attention("q8_0"),
    "delta-net": delta_net_kernels,
    "encoders": encoder_kernels,
    "smollm2": model("smollm2"),
    "gemma3": model("gemma3"),
    "all-minilm-l6-v2": model("all-minilm-l6-v2"),  # an encoder: its hidden states (it has no logits)
}


if __name__ == "__main__":
    for name, fn in OUTPUTS.items():
        print(name, fn())
