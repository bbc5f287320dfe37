"""The Gated DeltaNet's CPU kernels: the linear-attention layers of Qwen3.5, Qwen3.5-MoE and Qwen3-Next.

One layer, per token t of sequence s (llama.cpp's ggml_ssm_conv, ggml_gated_delta_net and the graph
around them in its qwen35.cpp / qwen3next.cpp):

- `conv1d_silu`: a causal depthwise convolution of width K over each channel of the Q|K|V projection,
  its window the sequence's last K - 1 inputs (the conv tail, kept in the recurrent state) then x_t;
  summed in float32 from the oldest tap as ggml sums it, then SiLU. The tail keeps the last K - 1 inputs.
- `decay_and_beta`: per value head, g = softplus(alpha + dt_bias) * a (a = -exp(A_log), as the
  converter stores `ssm_a`; softplus as ggml's: x past 20, else logf(1 + expf(x))) and beta =
  sigmoid(b).
- `gated_delta_rule`: the state S (head_k_dim x head_v_dim per value head) decays by exp(g), then
  the delta rule writes v against what S already recalls for k: S = S * exp(g);
  delta = (v - k^T S) * beta; S += k delta^T; and reads out o = (q^T S) / sqrt(head_dim). The 1/sqrt
  scales the read-out, not q, as ggml's fused CPU kernel does (the one llama.cpp runs on the CPU:
  cparams.fused_gdn_ar/ch; its unfused graphs scale q first). Value head h reads key head
  `k_head[h]`: Qwen3.5's converter tiles the value heads (h % n_k_heads), Qwen3-Next groups them
  (h // (n_v / n_k)).
- the L2 norm of q and k heads is `ops.rmsnorm` with llama.cpp's arithmetic for it
  (`l2_norm_weight`, `l2_norm_eps`: rms_norm(x, eps / n) * 1/sqrtf(n)); the output's gated RMS norm
  is `ops.rmsnorm` then `ops.silu_mul` (rms_norm(o) * w * silu(z)); the attention layers' output gate
  is `sigmoid_mul`.

Every sum has one order (each output channel or state column its own float32 accumulator, fed in a
fixed order), so every x86 level with FMA gives the same bits, and a token's result depends only on
its own sequence's tokens before it: bitwise the same in any batch. The recurrent form runs prefill too,
token by token: at Qwen3.5-4B's layer sizes these kernels take 3.1-4.3% of a 512-token prefill step
and 3.0-3.7% of a decode step (scripts/bench_qwen35.py, 2 threads, two runs; the matmuls take most of
the rest), so a chunked form (matmuls over 64-token chunks) is not worth its complexity yet.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit, prange

from engine.cpu.lanes import ORDERED
from engine.cpu.matmul.tiles import _alloca_f32
from engine.cpu.vecmath import exp

_KERNEL = {"cache": True, "nogil": True, "fastmath": ORDERED, "error_model": "numpy"}
F0 = np.float32(0.0)
F1 = np.float32(1.0)
COLS = 32  # state columns a pass keeps its sums for in registers
CONV_CHUNK = 256  # channels per parallel job of the convolution (Qwen3.5-4B: 8192 channels)
SOFTPLUS_LINEAR = np.float32(20.0)  # ggml_compute_softplus_f32 returns x itself past this


def l2_norm_weight(n: int) -> np.ndarray:
    """The weight that makes `ops.rmsnorm` an L2 norm: 1/sqrtf(n) in every column (ggml_scale's factor)."""
    return np.full(n, np.float32(1.0) / np.sqrt(np.float32(n)), dtype=np.float32)


def l2_norm_eps(eps: float, n: int) -> float:
    """llama.cpp's build_gdn_l2_norm eps for `ops.rmsnorm`: eps / n, in float32."""
    return float(np.float32(eps) / np.float32(n))


def conv1d_silu(
    x: np.ndarray, seq_ids: np.ndarray, weight_t: np.ndarray, tail: np.ndarray, out: np.ndarray
) -> None:
    """out[t] = silu(sum_i window_t[i] * weight_t[i]) over channels, window_t = the sequence's last K - 1
    inputs then x[t]; x, out [T, C]; weight_t [K, C] (the file's [C, K] transposed: each tap's channels
    contiguous); tail [n_seq, K - 1, C]: each sequence's last K - 1 inputs, updated in place. A
    sequence's tokens must come in position order (a batch keeps them so)."""
    _conv1d_silu(x, seq_ids, weight_t, tail, out)


# Taps read the batch's own rows where the sequence's run has them and the tail before that, and the tail
# is written once per run: shifting it every token, and loops over [c0, c1) of whole rows rather than
# over slices of the chunk, took 31-55 ms instead of 11 for 512 tokens of 8192 channels (2 threads).
@njit(parallel=True, **_KERNEL)
def _conv1d_silu(
    x: np.ndarray, seq_ids: np.ndarray, w: np.ndarray, tail: np.ndarray, out: np.ndarray
) -> None:
    n_tok, n_ch = x.shape
    for job in prange((n_ch + CONV_CHUNK - 1) // CONV_CHUNK):
        c0 = job * CONV_CHUNK
        c1 = min(c0 + CONV_CHUNK, n_ch)
        start = 0  # the first token of the current sequence's run
        for t in range(n_tok):
            s = seq_ids[t]
            if t > 0 and seq_ids[t - 1] != s:
                start = t
            _conv_token(x, w, tail, out, t, s, start, c0, c1)
            if t + 1 == n_tok or seq_ids[t + 1] != s:
                _keep_tail(x, tail, t, s, start, c0, c1)


@njit(inline="always", **_KERNEL)
def _conv_token(
    x: np.ndarray,
    w: np.ndarray,
    tail: np.ndarray,
    out: np.ndarray,
    t: int,
    s: int,
    start: int,
    c0: int,
    c1: int,
) -> None:
    k, n = w.shape[0] - 1, c1 - c0
    o = out[t, c0:c1]
    for c in range(n):
        o[c] = F0
    for i in range(k):  # taps in order from the oldest input, summed in float32 as ggml_ssm_conv sums
        m = t - k + i
        src = x[m, c0:c1] if m >= start else tail[s, m - start + k, c0:c1]
        wi = w[i, c0:c1]
        for c in range(n):
            o[c] += src[c] * wi[c]
    xr, wl = x[t, c0:c1], w[k, c0:c1]
    for c in range(n):
        acc = o[c] + xr[c] * wl[c]
        o[c] = acc / (F1 + exp(-acc))


@njit(inline="always", **_KERNEL)
def _keep_tail(x: np.ndarray, tail: np.ndarray, t: int, s: int, start: int, c0: int, c1: int) -> None:
    """A run of the sequence ends at t: its last K - 1 inputs become the tail (a run shorter than that
    keeps the old tail's newest rows first; rows are read before they are overwritten)."""
    k, run, n = tail.shape[1], t + 1 - start, c1 - c0
    for i in range(k):
        m = t + 1 - k + i
        src = x[m, c0:c1] if m >= start else tail[s, i + run, c0:c1]
        dst = tail[s, i, c0:c1]
        for c in range(n):
            dst[c] = src[c]


@njit(**_KERNEL)
def decay_and_beta(
    alpha: np.ndarray,
    b: np.ndarray,
    dt_bias: np.ndarray,
    a: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
) -> None:
    """g[t, h] = softplus(alpha[t, h] + dt_bias[h]) * a[h], beta[t, h] = sigmoid(b[t, h]); [T, n_v]."""
    n_tok, n_v = alpha.shape
    for t in range(n_tok):
        for h in range(n_v):
            x = alpha[t, h] + dt_bias[h]
            if x <= SOFTPLUS_LINEAR:  # logf(1 + expf(x)), each step rounded to float32
                x = np.float32(math.log(np.float32(F1 + np.float32(math.exp(x)))))
            g[t, h] = x * a[h]
            beta[t, h] = F1 / (F1 + np.float32(math.exp(-b[t, h])))


@njit(**_KERNEL)
def sigmoid_mul(x: np.ndarray, gate: np.ndarray) -> None:
    """x *= sigmoid(gate), over 2-D arrays (the gated attention's output gate)."""
    rows, dim = x.shape
    for r in range(rows):
        for i in range(dim):
            x[r, i] *= F1 / (F1 + exp(-gate[r, i]))


def gated_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    seq_ids: np.ndarray,
    k_head: np.ndarray,
    state: np.ndarray,
    out: np.ndarray,
) -> None:
    """The delta rule over a batch, token by token in batch order (see the module's docstring).

    q, k [T, n_k, d] (L2-normed), v [T, n_v, d], g and beta [T, n_v], k_head int [n_v] (the key head of
    each value head), state [n_seq, n_v, d (keys), d (values)]: the math's S, a row per key (llama.cpp
    keeps its transpose); updated in place. out [T, n_v, d]."""
    scale = np.float32(1.0) / np.sqrt(np.float32(v.shape[2]))
    _delta_rule(q, k, v, g, beta, seq_ids, k_head, scale, state, out)


# A row per key makes both passes over the state streams of whole rows, each value column its own
# accumulator (summed over the keys in order: the same bits on every level without lane folds). With a
# row per value (ggml's layout, one dot product per row) the rule took 396 ms for 512 tokens of Qwen3.5-4B's
# 32 heads of 128 (2 threads), this way 124 ms.
# Within a sequence's run of tokens, token t's write (S += k delta^T) and read-out wait for token t + 1's
# pass, which applies them to each row before decaying it: one pass over the state a token instead of
# two, the same numbers in the same order (outputs and states bitwise the two passes' on every level),
# the run's last token written by a pass of its own. Each pass walks 32 state columns at a time, its
# sums on the stack (registers) rather than in the output arrays, which LLVM could not keep in registers
# beside the state's stores. 512 tokens of 32 heads of 128, one thread, thread CPU time (Xeon VM of
# 2026-12-06, load 4-6): two passes 57-59 ms; one pass 46 ms; one pass in 32-column chunks 28-33 ms (64
# columns 41-44; 16 columns 241, not vectorized); avx2 53.5 against 54.6, portable 69.6 against 87.1.
@njit(parallel=True, **_KERNEL)
def _delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    seq_ids: np.ndarray,
    k_head: np.ndarray,
    scale: np.float32,
    state: np.ndarray,
    out: np.ndarray,
) -> None:
    n_tok, n_v, dv = v.shape
    # One job per value head: its state stays in cache over the batch's tokens.
    for h in prange(n_v):
        kh = k_head[h]
        delta = np.empty(dv, np.float32)  # the previous token's, while its write is pending
        recall = np.empty(dv, np.float32)
        for t in range(n_tok):
            s = seq_ids[t]
            decay = np.float32(math.exp(g[t, h]))
            if t > 0 and seq_ids[t - 1] == s:  # token t - 1's write and read-out, then t's decay and recall
                _write_read_decay_recall(
                    state[s, h], delta, k[t - 1, kh], q[t - 1, kh], out[t - 1, h], decay, k[t, kh], recall
                )
                _scale(out[t - 1, h], scale)
            else:
                _decay_recall(state[s, h], decay, k[t, kh], recall)
            b, vt = beta[t, h], v[t, h]
            for j in range(dv):
                delta[j] = (vt[j] - recall[j]) * b
            if t + 1 == n_tok or seq_ids[t + 1] != s:  # the run's last token: its write now
                _write_read(state[s, h], delta, k[t, kh], q[t, kh], out[t, h])
                _scale(out[t, h], scale)


@njit(inline="always", **_KERNEL)
def _scale(o: np.ndarray, scale: np.float32) -> None:
    for j in range(o.shape[0]):
        o[j] *= scale


@njit(inline="always", **_KERNEL)
def _write_read_decay_recall(
    S: np.ndarray,
    delta: np.ndarray,
    k_prev: np.ndarray,
    q_prev: np.ndarray,
    out_prev: np.ndarray,
    decay: np.float32,
    k: np.ndarray,
    recalled: np.ndarray,
) -> None:
    """_write_read of the previous token then _decay_recall of this one, in one pass over S: each row is
    the same numbers, summed in the same order, as the two passes give."""
    acc = carray(_alloca_f32(64), (2, COLS))
    n = S.shape[1]
    for c0 in range(0, n - n % COLS, COLS):
        _fused_cols(S, delta, k_prev, q_prev, out_prev, decay, k, recalled, acc, c0, COLS)
    if n % COLS:
        _fused_cols(S, delta, k_prev, q_prev, out_prev, decay, k, recalled, acc, n - n % COLS, n % COLS)


@njit(inline="always", **_KERNEL)
def _fused_cols(S, delta, k_prev, q_prev, out_prev, decay, k, recalled, acc, c0, width) -> None:  # type: ignore[no-untyped-def]
    for j in range(width):
        acc[0, j] = F0
        acc[1, j] = F0
    for i in range(S.shape[0]):
        row, kp, qp, ki = S[i, c0 : c0 + width], k_prev[i], q_prev[i], k[i]
        for j in range(width):
            r = row[j] + kp * delta[c0 + j]
            acc[0, j] += r * qp
            r = r * decay
            row[j] = r
            acc[1, j] += r * ki
    for j in range(width):
        out_prev[c0 + j] = acc[0, j]
        recalled[c0 + j] = acc[1, j]


@njit(inline="always", **_KERNEL)
def _decay_recall(S: np.ndarray, decay: np.float32, k: np.ndarray, recalled: np.ndarray) -> None:
    """S *= decay; recalled = k . S (what S holds for the key k)."""
    acc = carray(_alloca_f32(32), (COLS,))
    n = S.shape[1]
    for c0 in range(0, n - n % COLS, COLS):
        _decay_recall_cols(S, decay, k, recalled, acc, c0, COLS)
    if n % COLS:
        _decay_recall_cols(S, decay, k, recalled, acc, n - n % COLS, n % COLS)


@njit(inline="always", **_KERNEL)
def _decay_recall_cols(S, decay, k, recalled, acc, c0, width) -> None:  # type: ignore[no-untyped-def]
    for j in range(width):
        acc[j] = F0
    for i in range(S.shape[0]):
        row, ki = S[i, c0 : c0 + width], k[i]
        for j in range(width):
            r = row[j] * decay
            row[j] = r
            acc[j] += r * ki
    for j in range(width):
        recalled[c0 + j] = acc[j]


@njit(inline="always", **_KERNEL)
def _write_read(S: np.ndarray, delta: np.ndarray, k: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """S += k delta^T; out = q . S."""
    acc = carray(_alloca_f32(32), (COLS,))
    n = S.shape[1]
    for c0 in range(0, n - n % COLS, COLS):
        _write_read_cols(S, delta, k, q, out, acc, c0, COLS)
    if n % COLS:
        _write_read_cols(S, delta, k, q, out, acc, n - n % COLS, n % COLS)


@njit(inline="always", **_KERNEL)
def _write_read_cols(S, delta, k, q, out, acc, c0, width) -> None:  # type: ignore[no-untyped-def]
    for j in range(width):
        acc[j] = F0
    for i in range(S.shape[0]):
        row, ki, qi = S[i, c0 : c0 + width], k[i], q[i]
        for j in range(width):
            r = row[j] + ki * delta[c0 + j]
            row[j] = r
            acc[j] += r * qi
    for j in range(width):
        out[c0 + j] = acc[j]
