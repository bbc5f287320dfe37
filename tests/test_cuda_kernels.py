"""Every CUDA kernel against its CPU twin (and a numpy reference), on small shapes.

Without a GPU the kernels run in numba's CUDA simulator: NUMBA_ENABLE_CUDASIM is set and numba's
config re-read before `numba.cuda` is first imported (the CPU tests import numba, never numba.cuda).
With NUMBA_ENABLE_CUDASIM=0 and a GPU present (scripts/gpu-check.sh) the same tests run on the GPU.
The simulator runs one Python thread per CUDA thread, so shapes and block sizes are kept small.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.cuda_sim import cuda, small_launches  # noqa: F401  (sets up the simulator; autouse fixture)

# isort: split
from engine import quant
from engine.backend import cpu_backend
from engine.cpu import matmul as cpu_matmul
from engine.cpu import ops as cpu
from engine.cuda import arrays, sampling
from engine.cuda import matmul as gpu_matmul
from engine.cuda import ops as gpu
from engine.memory.kv_types import quantize_q8_0_reference
from engine.quant import BLOCK_LAYOUTS, QType

RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    """Max error relative to the largest reference magnitude: robust to values near zero."""
    scale = max(float(np.abs(want).max()), 1e-6)
    err = float(np.abs(got.astype(np.float64) - want).max()) / scale
    assert err <= tol, f"relative error {err:.3g} > {tol}"


# ---------------------------------------------------------------------------------------------------
# Element-wise, normalization, RoPE, KV and attention: device arrays in, results compared with the
# CPU kernel run on the same inputs.


def test_rmsnorm_matches_cpu() -> None:
    x, w = rand(5, 96), rand(96)
    want = np.empty_like(x)
    cpu.rmsnorm(x, w, 1e-5, want)
    out = arrays.empty(x.shape)
    gpu.rmsnorm(cuda.to_device(x), cuda.to_device(w), 1e-5, out)
    close(out.copy_to_host(), want, 1e-6)


def test_rmsnorm_in_place_on_host_arrays() -> None:
    """Host arrays work too (uploaded, written back), also with out aliasing x (Gemma's head norms)."""
    x, w = rand(4, 64), rand(64)
    want = np.empty_like(x)
    cpu.rmsnorm(x, w, 1e-6, want)
    gpu.rmsnorm(x, w, 1e-6, x)
    close(x, want, 1e-6)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_matches_cpu(neox: bool) -> None:
    x = rand(5, 3, 32)
    positions = np.array([0, 1, 7, 100, 3000], dtype=np.int32)
    want = x.copy()
    pair_scale = np.linspace(0.2, 1.0, 12).astype(np.float32)  # scaled, and partial: 24 of 32 dims
    cpu.rope(want, positions, 10000.0, neox, pair_scale, 1.1)
    dx = cuda.to_device(x)
    gpu.rope(dx, cuda.to_device(positions), 10000.0, neox, pair_scale, 1.1)
    close(dx.copy_to_host(), want, 2e-5)


def test_store_kv_matches_cpu() -> None:
    k, v = rand(3, 2, 8), rand(3, 2, 8)
    seq_ids = np.array([0, 2, 2], dtype=np.int32)
    positions = np.array([4, 0, 1], dtype=np.int32)
    kc, vc = np.zeros((3, 2, 6, 8), np.float16), np.zeros((3, 2, 6, 8), np.float16)
    cpu.store_kv(k, v, seq_ids, positions, kc, vc)
    dkc, dvc = arrays.zeros(kc.shape, np.float16), arrays.zeros(vc.shape, np.float16)
    gpu.store_kv(cuda.to_device(k), cuda.to_device(v), seq_ids, positions, dkc, dvc)
    np.testing.assert_array_equal(dkc.copy_to_host(), kc)
    np.testing.assert_array_equal(dvc.copy_to_host(), vc)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_gqa_multi_sequence_matches_cpu(window: int) -> None:
    """Two sequences, 4 query heads on 2 kv heads, contexts longer than one block of keys (32 threads
    under the simulator), so the online softmax crosses chunks; with a sliding window of 3."""
    n_seq, n_kv, n_ctx, dim = 2, 2, 70, 16
    kc = rand(n_seq, n_kv, n_ctx, dim).astype(np.float16)
    vc = rand(n_seq, n_kv, n_ctx, dim).astype(np.float16)
    q = rand(4, 4, dim)
    seq_ids = np.array([0, 0, 1, 1], dtype=np.int32)
    positions = np.array([0, 33, 5, 69], dtype=np.int32)
    want = np.empty_like(q)
    cpu.attention(q, kc, vc, seq_ids, positions, window, 0.25, want)
    out = arrays.empty(q.shape)
    gpu.attention(
        cuda.to_device(q), cuda.to_device(kc), cuda.to_device(vc), seq_ids, positions, window, 0.25, out
    )
    close(out.copy_to_host(), want, 1e-5)


def test_store_kv_q8_0_quantizes_bitwise_like_cpu() -> None:
    """Q8_0 keys (with a zero block, a tie and a subnormal scale) next to float16 values."""
    k, v = rand(3, 2, 64) * 3, rand(3, 2, 64)
    k[0, 0, :32] = 0.0
    k[1, 0, :32] = 0.0
    k[1, 0, 0], k[1, 0, 1] = 127.0, 2.5  # d = 1: 2.5 rounds away from zero, to 3
    k[2, 1, 32:] *= 1e-7  # d below float16's smallest normal
    seq_ids = np.array([0, 2, 2], dtype=np.int32)
    positions = np.array([4, 0, 1], dtype=np.int32)
    kc, vc = np.zeros((3, 2, 6, 68), np.uint8), np.zeros((3, 2, 6, 64), np.float16)
    cpu.store_kv(k, v, seq_ids, positions, kc, vc)
    dkc, dvc = arrays.zeros(kc.shape, np.uint8), arrays.zeros(vc.shape, np.float16)
    gpu.store_kv(cuda.to_device(k), cuda.to_device(v), seq_ids, positions, dkc, dvc)
    np.testing.assert_array_equal(dkc.copy_to_host(), kc)
    np.testing.assert_array_equal(dvc.copy_to_host(), vc)


@pytest.mark.parametrize(
    "k_type, v_type", [("q8_0", "q8_0"), pytest.param("f16", "q8_0", marks=pytest.mark.slow)]
)
def test_attention_over_q8_0_cells_matches_cpu(k_type: str, v_type: str) -> None:
    n_seq, n_kv, n_ctx, dim = 2, 1, 40, 32
    cells = {"f16": lambda x: x.astype(np.float16), "q8_0": quantize_q8_0_reference}
    kc = cells[k_type](rand(n_seq, n_kv, n_ctx, dim))
    vc = cells[v_type](rand(n_seq, n_kv, n_ctx, dim))
    q = rand(3, 2, dim)
    seq_ids = np.array([0, 1, 1], dtype=np.int32)
    positions = np.array([0, 33, 39], dtype=np.int32)
    want = np.empty_like(q)
    cpu.attention(q, kc, vc, seq_ids, positions, 0, 0.25, want)
    out = arrays.empty(q.shape)
    gpu.attention(cuda.to_device(q), cuda.to_device(kc), cuda.to_device(vc), seq_ids, positions, 0, 0.25, out)
    close(out.copy_to_host(), want, 1e-5)


def test_q8_0_cells_gather_and_scatter_like_cpu() -> None:
    """A context shift's staging on Q8_0 cells [heads, n_ctx, row]: numbers out, quantized back in."""
    cells = quantize_q8_0_reference(rand(2, 10, 64))
    staged = cpu_backend().gather_cells(cells, 3, 4, 64)
    got = arrays.gather_cells(cuda.to_device(cells), 3, 4, 64)
    np.testing.assert_array_equal(got.copy_to_host(), staged)
    x = rand(4, 2, 64)
    host, dev = cells.copy(), cuda.to_device(cells)
    cpu_backend().scatter_cells(x, host, 5)
    arrays.scatter_cells(cuda.to_device(x), dev, 5)
    np.testing.assert_array_equal(dev.copy_to_host(), host)


def test_activations_match_cpu() -> None:
    """SiLU as the CPU's; GELU as ggml's CUDA backend computes it, the formula (ggml's CPU, and so
    Llamba's, reads a float16 table instead: tests/test_ops.py)."""
    gate, up = rand(3, 40), rand(3, 40)
    silu = np.empty_like(gate)
    cpu.silu_mul(gate, up, silu)
    gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3))) * up
    for gpu_fn, want in ((gpu.silu_mul, silu), (gpu.gelu_mul, gelu)):
        dgate = cuda.to_device(gate)
        gpu_fn(dgate, cuda.to_device(up), dgate)  # in place, as the models call it
        close(dgate.copy_to_host(), want, 1e-6)


def test_residual_add_and_scale_match_cpu() -> None:
    x, y = rand(3, 50), rand(3, 50)
    want = x.copy()
    cpu.add_inplace(want, y)
    cpu.scale_inplace(want, 1.5)
    dx = cuda.to_device(x)
    gpu.add_inplace(dx, cuda.to_device(y))
    gpu.scale_inplace(dx, 1.5)
    close(dx.copy_to_host(), want, 1e-7)


def test_add_bias_matches_cpu() -> None:
    x, bias = rand(5, 40), rand(1, 40)[0]
    want = x.copy()
    cpu.add_bias_inplace(want, bias)
    dx = cuda.to_device(x)
    gpu.add_bias_inplace(dx, cuda.to_device(bias))
    close(dx.copy_to_host(), want, 0)


# ---------------------------------------------------------------------------------------------------
# Quantized matmul and get_rows for every block format.


def random_weight(qtype: QType, rows: int, cols: int) -> np.ndarray:
    """Stored GGUF rows of `qtype` with random quants and small, finite f16 scales."""
    if qtype == QType.F32:
        return rand(rows, cols)
    if qtype == QType.F16:
        return rand(rows, cols).astype(np.float16)
    layout = BLOCK_LAYOUTS[qtype]
    nb = cols // layout.block_size
    raw = RNG.integers(0, 256, (rows, nb, layout.type_size), dtype=np.uint8)

    def f16(offset: int, low: float, high: float) -> None:
        values = RNG.uniform(low, high, (rows, nb)).astype(np.float16)
        raw[..., offset : offset + 2] = values.view(np.uint8).reshape(rows, nb, 2)

    scale_at = {QType.Q6_K: 208, QType.Q3_K: 108, QType.Q2_K: 80}.get(qtype, 0)
    f16(scale_at, 0.001, 0.02)
    if qtype == QType.Q2_K:
        f16(82, -0.05, 0.05)  # dmin
    if qtype in (QType.Q4_1, QType.Q5_1, QType.Q4_K, QType.Q5_K):
        f16(2, -0.05, 0.05)  # the block minimum / dmin
    return raw.reshape(rows, -1)


# MXFP4 (gpt-oss's experts) has no CUDA kernel yet: a CUDA backend refuses gpt-oss at load.
FORMATS = [q for q in QType if q != QType.MXFP4]
# The three real models' formats (SmolLM2 Q4_1; Gemma 3 and Qwen2.5 Q5_0, Q8_0, Q4_K, Q6_K) and F32 run in
# the default suite; the simulator takes 10-40 s a format, so the others are `slow` (make test-all).
MODEL_FORMATS = {QType.F32, QType.Q4_1, QType.Q5_0, QType.Q8_0, QType.Q4_K, QType.Q6_K}


def by_use(qtype: QType) -> Any:
    return pytest.param(qtype, id=qtype.name, marks=() if qtype in MODEL_FORMATS else pytest.mark.slow)


@pytest.mark.parametrize("qtype", [by_use(q) for q in FORMATS])
def test_matmul_matches_reference_and_cpu(qtype: QType) -> None:
    """40 rows (a partial second group of 32), 512 columns (two K-quant super-blocks); one decode token
    and a batch of 9 (a full and a partial 8-token tile)."""
    rows, cols = 40, 512
    data = random_weight(qtype, rows, cols)
    w_ref = quant.dequantize(data, qtype, (rows, cols)).astype(np.float64)
    w_gpu = gpu_matmul.pack_weight(data, qtype, (rows, cols))
    w_cpu = quant.pack_weight(data, qtype, (rows, cols))
    for n_tok in (1, 9):
        x = rand(n_tok, cols)
        want = x.astype(np.float64) @ w_ref.T
        out = arrays.empty((n_tok, rows))
        gpu_matmul.matmul(cuda.to_device(x), w_gpu, out)
        got = out.copy_to_host()
        close(got, want, 1e-5)
        cpu_out = np.empty((n_tok, rows), np.float32)
        cpu_matmul.matmul(x, w_cpu, cpu_out)
        close(got, cpu_out, 2e-2)  # the CPU rounds activations to int8 for the 4-6 bit formats


def test_matmul_default_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real launch shape (8 and 4 K slices) once, with more blocks than slices."""
    monkeypatch.setattr(gpu_matmul, "SPLITS", {1: 8, 8: 4})
    rows, cols = 32, 32 * 12
    data = random_weight(QType.Q4_1, rows, cols)
    w_ref = quant.dequantize(data, QType.Q4_1, (rows, cols)).astype(np.float64)
    w_gpu = gpu_matmul.pack_weight(data, QType.Q4_1, (rows, cols))
    for n_tok in (1, 3):
        x = rand(n_tok, cols)
        out = np.empty((n_tok, rows), np.float32)
        gpu_matmul.matmul(x, w_gpu, out)  # host arrays: uploaded and written back
        close(out, x.astype(np.float64) @ w_ref.T, 1e-5)


def test_matmul_float_with_ragged_columns() -> None:
    """F32 rows whose length is no multiple of 32: the last block of columns is partial."""
    rows, cols = 8, 45
    data = rand(rows, cols)
    x = rand(2, cols)
    out = np.empty((2, rows), np.float32)
    gpu_matmul.matmul(x, gpu_matmul.pack_weight(data, QType.F32, (rows, cols)), out)
    close(out, x.astype(np.float64) @ data.T.astype(np.float64), 1e-6)


@pytest.mark.parametrize("qtype", FORMATS, ids=[q.name for q in FORMATS])
def test_get_rows_matches_cpu(qtype: QType) -> None:
    rows, cols = 40, 512
    data = random_weight(qtype, rows, cols)
    ids = np.array([0, 39, 5, 33], dtype=np.int32)
    want = np.empty((len(ids), cols), np.float32)
    cpu_matmul.get_rows(quant.pack_weight(data, qtype, (rows, cols)), ids, want)
    out = arrays.empty(want.shape)
    gpu_matmul.get_rows(gpu_matmul.pack_weight(data, qtype, (rows, cols)), ids, out)
    np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-6, atol=1e-7)


def test_weights_stay_quantized_on_the_device() -> None:
    data = random_weight(QType.Q4_0, 64, 256)
    w = gpu_matmul.pack_weight(data, QType.Q4_0, (64, 256))
    assert w.qs.dtype == np.uint8 and w.qs.shape == (2, 8 * 16 * 32)
    assert w.d.dtype == np.float16
    assert w.nbytes == quant.pack_weight(data, QType.Q4_0, (64, 256)).nbytes


# ---------------------------------------------------------------------------------------------------
# LoRA's low-rank term (engine/cuda/lora.py): numpy reference, the CPU twin, batch independence, uploads.


def _lora_reference(x: np.ndarray, rows: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float, f16: bool):  # type: ignore[no-untyped-def]
    """scale * B (A x[rows]) in float64, F16 adapters' inputs (x, then A x) rounded to float16 first."""
    xr = x[rows].astype(np.float64)
    if f16:
        xr = xr.astype(np.float16).astype(np.float64)
    t = (xr @ a.T.astype(np.float64)).astype(np.float32)
    if f16:
        t = t.astype(np.float16)
    return (t.astype(np.float64) @ b.T.astype(np.float64)) * scale


@pytest.mark.parametrize("f16", [False, True])
def test_lora_add_matches_numpy_and_cpu(f16: bool) -> None:
    from engine.cpu.lora import lora_add as cpu_lora_add
    from engine.cuda.lora import lora_add
    from engine.lora import LoraWeight

    x, base = rand(6, 80), rand(6, 40)
    w = LoraWeight(rand(4, 80) / 10, rand(30, 4) / 10, f16)
    rows = np.array([0, 2, 5], dtype=np.int64)
    out = cuda.to_device(base)
    lora_add(cuda.to_device(x), rows, w, 0.75, out, 7)
    got = out.copy_to_host()
    want = base.astype(np.float64)
    want[rows, 7:37] += _lora_reference(x, rows, w.a, w.b, 0.75, f16)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    untouched = [1, 3, 4]
    np.testing.assert_array_equal(got[untouched], base[untouched])
    np.testing.assert_array_equal(got[:, :7], base[:, :7])
    np.testing.assert_array_equal(got[:, 37:], base[:, 37:])
    on_cpu = base.copy()
    cpu_lora_add(x, rows, w, 0.75, on_cpu, 7)
    np.testing.assert_allclose(got, on_cpu, rtol=1e-5, atol=1e-6)


def test_lora_add_rows_are_batch_independent_and_weights_uploaded_once() -> None:
    """A row's bits do not depend on the rows sharing its call; A and B go to the device once per weight,
    and leave with it; host x and out work too (uploaded, written back)."""
    from engine.cuda import lora
    from engine.lora import LoraWeight

    x = rand(9, 70)
    w = LoraWeight(rand(3, 70), rand(20, 3), False)
    alone, together = np.zeros((9, 20), np.float32), np.zeros((9, 20), np.float32)
    lora.lora_add(x, np.array([4]), w, 2.0, alone, 0)
    first = lora.uploaded(w)
    lora.lora_add(x, np.arange(9), w, 2.0, together, 0)
    np.testing.assert_array_equal(alone[4], together[4])
    assert lora.uploaded(w)[0] is first[0] and lora.uploaded(w)[1] is first[1]
    key = id(w)
    del w
    import gc

    gc.collect()
    assert key not in lora._DEVICE


# ---------------------------------------------------------------------------------------------------
# Array hooks and sampling.


def test_array_hooks() -> None:
    x = rand(4, 10)
    dx = arrays.upload(x)
    np.testing.assert_array_equal(arrays.download(arrays.take_rows(dx, np.array([3, 0]))), x[[3, 0]])
    parts = arrays.split_cols(dx, [2, 3, 5])
    for got, want in zip(parts, np.split(x, [2, 5], axis=1), strict=True):
        np.testing.assert_array_equal(arrays.download(got), want)
    assert not arrays.download(arrays.zeros((3, 70))).any()


def test_softmax_matches_numpy() -> None:
    x = rand(3, 100) * 4
    out = np.empty_like(x)
    sampling.softmax(x, out)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    close(out, e / e.sum(1, keepdims=True), 1e-6)


def test_argmax_first_maximum() -> None:
    x = rand(4, 300)
    x[1, 7] = x[1, 250] = 99.0  # a tie: the lower id wins, as np.argmax
    np.testing.assert_array_equal(sampling.argmax(cuda.to_device(x)), np.argmax(x, axis=1))


def test_top_k_ids_values_and_logsumexp() -> None:
    x = np.round(rand(3, 500) * 2, 1)  # rounded: many ties, resolved to the lower id
    k = 10
    ids, vals, lse = sampling.top_k(x, k)
    want = np.argsort(-x, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want, 1))
    ref = np.log(np.exp(x.astype(np.float64)).sum(1))
    np.testing.assert_allclose(lse, ref, rtol=1e-5)
