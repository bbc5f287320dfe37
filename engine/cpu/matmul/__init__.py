"""Quantized matrix multiplication and embedding lookup on the CPU: out[T, N] = x[T, K] @ W.T.

Weights come repacked by engine.quant.pack_weight: groups of 32 rows, each field row-interleaved, so
the 32 rows of a group sit in the lanes of one vector. For every weight position a kernel loads the
32 rows' quants, unpacks them once, and multiplies them by the broadcast activation of each token of
a tile of up to 8 tokens, keeping 32 per-row sums per token in vector registers: no horizontal sums.
Each weight byte is read from memory once per call (decode, T small, is bound by that) and decoded
once per tile of 8 tokens (prefill, bound by arithmetic).

Integer path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K; IQ4_NL, IQ4_XS): the activations are quantized
once per call to int8 values exactly as llama.cpp's q8_0/q8_1/q8_K blocks (`activations`). On every
x86 level but portable (engine/cpu/isa.py) the tiles sum on byte dot products, LLVM-IR intrinsics
(`intrinsics`) whose instructions engine/cpu/simd.py emits for the level: AVX-512 VNNI's or AVX-VNNI's
vpdpbusd/vpdpwssd, AVX2's vpmaddubsw + vpmaddwd. The portable tiles multiply and add int16 lanes
(int32 for IQ4 and Q8_0), which LLVM vectorizes for any target. Every level gives the same integer sums.
Half a block's products always fit int16; the weight and activation scales are applied per half
block in float, the block minimum (Q4_1, Q4_0's -8) once per block through the activation sum. Q4_K,
Q5_K and Q6_K scale in llama.cpp's order instead: each (sub-)block's integer sum times its integer
scale, added in int32 over the 256-weight super-block, then one float scaling (mins likewise).

Float path (F16, BF16, F32; `floats`): the weights are converted to float per position (once per token
tile) and multiplied by the unquantized activations with FMAs (BF16's rounded to bf16 first). On the
256-bit FMA levels in panels of 16 rows by up to 6 tokens (`panel_sums`, vcvtph2ps for F16), which the
encoder attention reuses for its two products; the same bits as the tiles.

One compiled signature per type: the tile sizes (8, 4, 2, 1 tokens) are inlined into the kernel with
constant loop bounds (`tiles`), and the parallel loop runs over row groups only. A module per format
family (`q4`, `q4k`, `q5`, `q5k`, `iq4`, `k16` for Q2_K/Q3_K, `q6k`, `q8`, `floats`), the embedding
lookups (`rows`), and the table from weight type to kernel (`dispatch`). The comments in the tile code
say which loop shapes LLVM vectorizes and which it does not (measured, not guessed).
"""

from __future__ import annotations

from engine.cpu.matmul.activations import (
    ACT_Q8_0,
    ACT_Q8_1,
    ACT_Q8_K,
    ACTIVATIONS,
    first_largest,
    quantize_activations,
)
from engine.cpu.matmul.dispatch import CHUNKED_MIN_BYTES, VNNI_MIN_TOKENS, get_rows, matmul
from engine.cpu.matmul.intrinsics import BYTE_DOT
from engine.cpu.matmul.tiles import f16_to_f32

__all__ = [
    "ACTIVATIONS",
    "ACT_Q8_0",
    "ACT_Q8_1",
    "ACT_Q8_K",
    "BYTE_DOT",
    "CHUNKED_MIN_BYTES",
    "VNNI_MIN_TOKENS",
    "f16_to_f32",
    "first_largest",
    "get_rows",
    "matmul",
    "quantize_activations",
]
