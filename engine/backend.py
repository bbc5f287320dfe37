"""The kernel set a model runs on. Models call kernels only through a Backend, so CPU and CUDA swap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger("engine")
DEVICES = ("auto", "cpu", "cuda")


# numpy versions of the array and sampling hooks (the CPU backend's).


def _empty(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.empty(shape, dtype)


def _zeros(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    # Written once up front (as llama.cpp clears its KV buffer): pages the OS would otherwise fault in
    # lazily, one by one inside the decode loop, cost ~2.5 ms a step on a fresh cache.
    out = np.empty(shape, dtype)
    out.fill(0)
    return out


def _take_rows(x: np.ndarray, rows: Any) -> np.ndarray:
    return x[np.asarray(rows)]


def _split_cols(x: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    # Plain slicing: np.split costs ~10 us a call, a few hundred microseconds a decode step.
    parts, start = [], 0
    for n in sizes:
        parts.append(np.ascontiguousarray(x[:, start : start + n]))
        start += n
    return parts


# KV cells ([n_layer, n_seq, n_kv_heads, n_ctx, head_dim] caches): host copies for the prompt cache and
# slot files, and the float32 staging a context shift rotates keys in.


def _read_cells(cache: np.ndarray, seq_id: int, n: int) -> np.ndarray:
    return np.ascontiguousarray(cache[:, seq_id, :, :n])


def _write_cells(cache: np.ndarray, seq_id: int, cells: np.ndarray) -> None:
    cache[:, seq_id, :, : cells.shape[2]] = cells


def _gather_cells(cells: np.ndarray, start: int, n: int, head_dim: int) -> np.ndarray:
    if cells.dtype == np.uint8:  # q8_0 (engine/memory/kv_types.py)
        from engine.cpu.kv_cells import gather_q8_0

        out = np.empty((n, cells.shape[0], head_dim), np.float32)
        gather_q8_0(cells.view(np.int8), start, out)
        return out
    return np.ascontiguousarray(cells[:, start : start + n, :].transpose(1, 0, 2), dtype=np.float32)


def _scatter_cells(x: np.ndarray, cells: np.ndarray, start: int) -> None:
    if cells.dtype == np.uint8:
        from engine.cpu.kv_cells import scatter_q8_0

        scatter_q8_0(np.ascontiguousarray(x), cells.view(np.int8), start)
        return
    cells[:, start : start + x.shape[0], :] = x.transpose(1, 0, 2)


def _argmax(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=1).astype(np.int32)


def _top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.argsort(-x, axis=1, kind="stable")[:, :k].astype(np.int32)
    top = x.max(axis=1, keepdims=True)
    lse = (top[:, 0] + np.log(np.exp(x - top).sum(axis=1))).astype(np.float32)
    return ids, np.take_along_axis(x, ids, 1), lse


def _combine_experts(parts: list[np.ndarray], rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    # llama.cpp's order: each expert's output times its weight (rounded), then added rank by rank.
    y = parts[0] if len(parts) == 1 else np.concatenate(parts)
    out = y[rows[:, 0]] * weights[:, :1]
    for i in range(1, rows.shape[1]):
        out += y[rows[:, i]] * weights[:, i : i + 1]
    return out


def _on_host(
    fn: Callable[..., np.ndarray], download: Callable[[Any], np.ndarray], upload: Callable[[Any], Any]
) -> Callable[..., Any]:
    """A numpy function over a device backend's arrays: its arrays in, its result out, by copies."""

    def host(a: Any) -> Any:
        if isinstance(a, list):
            return [host(x) for x in a]
        return a if isinstance(a, np.ndarray) else download(a)

    def run(*args: Any) -> Any:
        return upload(fn(*[host(a) for a in args]))

    return run


def _lock_host_weights(weights: list[Any]) -> Any:
    from engine.mlock import lock_packed_weights

    return lock_packed_weights(weights)


def _weights_not_on_host(weights: list[Any]) -> None:
    return None


@dataclass(frozen=True)
class Backend:
    name: str  # as llama-bench's "backend" column shows it
    pack_weight: Callable[..., Any]
    matmul: Callable[..., None]
    get_rows: Callable[..., None]
    rmsnorm: Callable[..., None]
    rope: Callable[..., None]
    store_kv: Callable[..., None]
    attention: Callable[..., None]
    silu_mul: Callable[..., None]
    gelu_mul: Callable[..., None]
    add_inplace: Callable[..., None]
    add_bias_inplace: Callable[..., None]
    scale_inplace: Callable[..., None]
    # Array hooks: where activations, norm weights and the KV cache live. The defaults are numpy; the
    # CUDA backend's return device arrays, so a model that allocates through them stays on the GPU.
    empty: Callable[..., Any] = _empty
    zeros: Callable[..., Any] = _zeros
    upload: Callable[[Any], Any] = np.asarray  # host array -> backend array (norm weights, indices)
    download: Callable[[Any], np.ndarray] = np.asarray  # backend array -> host (logits, picks)
    take_rows: Callable[[Any, Any], Any] = _take_rows
    split_cols: Callable[[Any, list[int]], list[Any]] = _split_cols
    # Sampling where the logits are: argmax(logits) -> ids; top_k(logits, k) -> (ids, logits, lse).
    argmax: Callable[[Any], np.ndarray] = _argmax
    top_k: Callable[[Any, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = _top_k
    # KV cells. read_cells(cache, seq, n) -> host [n_layer, n_kv_heads, n, head_dim] of the first n cells;
    # write_cells(cache, seq, host cells) replaces them (cells are the cache type's raw elements).
    # gather_cells(cells, start, n, head_dim) -> float32 [n, n_kv_heads, head_dim] of one layer's
    # sequence ([n_kv_heads, n_ctx, row]), in the RoPE kernel's layout; scatter_cells(x, cells, start)
    # writes such rows back as cells (quantized for q8_0) from `start` on.
    read_cells: Callable[[Any, int, int], np.ndarray] = _read_cells
    write_cells: Callable[[Any, int, np.ndarray], None] = _write_cells
    gather_cells: Callable[[Any, int, int, int], Any] = _gather_cells
    scatter_cells: Callable[[Any, Any, int], None] = _scatter_cells
    # lock_weights(packed weights) -> engine.mlock.LockResult, or None where they are not in host memory.
    lock_weights: Callable[[list[Any]], Any] = _lock_host_weights
    # Mixture of experts. pack_experts(parts, qtype, (n_expert, rows, cols)) -> (the packed weights that
    # hold them, one weight per expert, prepare(expert ids) to run before a kernel reads those experts, or
    # None), parts the stored 3-D tensors fused along their rows (gate|up); None packs each expert with
    # pack_weight at once. combine_experts(parts,
    # rows[T, k], weights[T, k]) -> out[T, n]: with y the parts' rows one after another, out[t] = the sum
    # over i of y[rows[t, i]] * weights[t, i], the products added in rank order (llama.cpp's); rows and
    # weights are host arrays.
    pack_experts: Callable[..., tuple[list[Any], list[Any], Any]] | None = None
    # experts_matmul(x, whole, rows, runs, out) -> bool: every run (expert, start, end) of x's sorted rows
    # through its expert of `whole` (pack_experts' one matrix of `rows`-row experts) in one call; False
    # where the weight's format has no such kernel. None: a matmul per expert.
    experts_matmul: Callable[..., bool] | None = None
    combine_experts: Callable[..., Any] = _combine_experts
    # The router's matmul (pack_router(data, qtype, shape), router_logits(x, w, out)); None: pack_weight
    # and matmul. Its logits choose the experts: the CPU's are bitwise independent of the batch.
    pack_router: Callable[..., Any] | None = None
    router_logits: Callable[..., None] | None = None

    # gpt-oss: apply_sinks(q, k_cache, seq_ids, positions, window, scale, sinks, out) scales attention's
    # output by each head's sink share; swiglu_oai(gate, up, alpha, limit) in place. None: not built for
    # this backend (the model refuses to load).
    attention_sinks: Callable[..., None] | None = None
    swiglu_oai: Callable[..., None] | None = None
    # The Gated DeltaNet's kernels (Qwen3.5, Qwen3-Next): a module with conv1d_silu, decay_and_beta,
    # gated_delta_rule, sigmoid_mul, l2_norm_weight, l2_norm_eps (engine/cpu/delta_net.py). None: not
    # built for this backend (the model refuses to load).
    delta_net: Any | None = None
    # Encoders (BERT and kin, engine/models/encoder.py): layernorm(x, weight, bias, eps, out) with an
    # optional weight and bias, gelu(x, out), and encoder_attention(q, k, v, spans, positions, causal,
    # window, slopes, scale, out), each token over its own input's rows in the pass. None: not built for
    # this backend (an encoder refuses to load).
    layernorm: Callable[..., None] | None = None
    gelu: Callable[..., None] | None = None
    encoder_attention: Callable[..., None] | None = None
    # LoRA adapters (engine/lora.py): lora_add(x, rows, weight, scale, out, col) adds scale * B (A x) of a
    # LoraWeight over x's rows into out[rows, col:] (engine/cpu/lora.py, engine/cuda/lora.py). None: not
    # built for this backend (adapters are refused at load, in one line).
    lora_add: Callable[..., None] | None = None

    def pack_router_weight(self, data: Any, qtype: int, shape: tuple[int, int]) -> Any:
        return (self.pack_router or self.pack_weight)(data, qtype, shape)

    def router_matmul(self, x: Any, w: Any, out: Any) -> None:
        (self.router_logits or self.matmul)(x, w, out)

    def pack_expert_weights(
        self, parts: list[Any], qtype: int, shape: tuple[int, int, int]
    ) -> tuple[list[Any], list[Any], Callable[[np.ndarray], None] | None]:
        """(the packed weights that hold 3-D expert tensors' experts, fused along the rows; one weight per
        expert; prepare(expert ids) to call before those experts are read, or None)."""
        if self.pack_experts is not None:
            return self.pack_experts(parts, qtype, shape)
        data = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        each = [self.pack_weight(data[e], qtype, shape[1:]) for e in range(shape[0])]
        return each, each, None


def cpu_backend(n_threads: int | None = None) -> Backend:
    import numba

    from engine.cpu import delta_net, matmul, ops
    from engine.cpu.encoder_attention import encoder_attention
    from engine.cpu.experts import (
        combine_experts,
        pack_experts_for_cpu,
        pack_router_for_cpu,
        router_logits,
        swiglu_oai,
    )
    from engine.cpu.lora import lora_add
    from engine.cpu.matmul.experts import experts_matmul
    from engine.cpu.records import pack_weight_for_cpu
    from engine.cpu.sinks import apply_sinks

    if n_threads:
        numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
    return Backend(
        name="CPU",
        pack_weight=pack_weight_for_cpu,
        **_kernels(matmul, ops),
        pack_experts=pack_experts_for_cpu,
        experts_matmul=experts_matmul,
        pack_router=pack_router_for_cpu,
        router_logits=router_logits,
        combine_experts=combine_experts,
        attention_sinks=apply_sinks,
        swiglu_oai=swiglu_oai,
        delta_net=delta_net,
        layernorm=ops.layernorm,
        gelu=ops.gelu,
        encoder_attention=encoder_attention,
        lora_add=lora_add,
    )


# The kernels every backend takes by name from its `ops` module (matmul/get_rows come from `matmul`).
_OP_NAMES = (
    "rmsnorm",
    "rope",
    "store_kv",
    "attention",
    "silu_mul",
    "gelu_mul",
    "add_inplace",
    "add_bias_inplace",
    "scale_inplace",
)


def _kernels(matmul: Any, ops: Any) -> dict[str, Any]:
    return {"matmul": matmul.matmul, "get_rows": matmul.get_rows} | {n: getattr(ops, n) for n in _OP_NAMES}


def cuda_backend() -> Backend:
    """The numba-cuda kernels: weights uploaded once at pack time, arrays allocated on the device."""
    from engine.cuda import arrays, lora, matmul, ops, sampling

    return Backend(
        name="CUDA",
        pack_weight=matmul.pack_weight,
        **_kernels(matmul, ops),
        empty=arrays.empty,
        zeros=arrays.zeros,
        upload=arrays.upload,
        download=arrays.download,
        take_rows=arrays.take_rows,
        split_cols=arrays.split_cols,
        argmax=sampling.argmax,
        top_k=sampling.top_k,
        read_cells=arrays.read_cells,
        write_cells=arrays.write_cells,
        gather_cells=arrays.gather_cells,
        scatter_cells=arrays.scatter_cells,
        lock_weights=_weights_not_on_host,
        combine_experts=_on_host(_combine_experts, arrays.download, arrays.upload),
        lora_add=lora.lora_add,
    )


def cuda_unavailable() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can (a GPU, or the simulator)."""
    try:
        from numba import cuda
    except Exception as exc:  # numba built without CUDA support, a broken install
        return f"numba.cuda cannot be imported ({exc})"
    try:
        if not cuda.is_available():
            return "no CUDA GPU or driver found"
        from engine.cuda.devices import nvvm_missing

        return nvvm_missing()
    except Exception as exc:
        return f"CUDA initialisation failed ({exc})"


def select_backend(device: str = "cpu", n_threads: int | None = None, n_gpu_layers: int = -1) -> Backend:
    """`device` auto|cpu|cuda; auto and cuda fall back to the CPU, with one log line, where CUDA cannot
    run. n_gpu_layers 0 means the CPU; any other value offloads the whole model (no partial offload)."""
    if device not in DEVICES:
        raise ValueError(f"unknown device '{device}' (available: {', '.join(DEVICES)})")
    if device == "cpu" or n_gpu_layers == 0:
        return cpu_backend(n_threads)
    reason = cuda_unavailable()
    if reason is None:
        return cuda_backend()
    log.warning("cuda_unavailable_using_cpu", device=device, reason=reason, backend="CPU")
    return cpu_backend(n_threads)


def list_devices() -> list[str]:
    """`--list-devices` lines: one per GPU, '  <name>: <description> (<total> MiB, <free> MiB free)'."""
    if cuda_unavailable() is not None:
        return ["  (none)"]
    from engine.cuda.devices import gpus

    lines = [f"  {g.name}: {g.description} ({g.total_mib} MiB, {g.free_mib} MiB free)" for g in gpus()]
    return lines or ["  (none)"]
