"""llama.cpp's intermediate tensors for one prompt (its `cb_eval` hook), saved by name to an .npz.

For finding where another engine first departs from llama.cpp: feed each op llama.cpp's own input and
compare outputs (docs/numerics.md, Embeddings, was traced this way). Run it with a venv that has
llama-cpp-python:

    /work/llcpp-venv/bin/python -m scripts.llama_cpp_trace MODEL.gguf out.npz "The prompt."

Every float32 tensor the graph computes is kept, shaped [ne3, ne2, ne1, ne0] as ggml orders it; a name
seen again gets `#1`, `#2`. `__tokens` holds the prompt's tokens (BOS added). Nothing here imports Llamba.
"""

from __future__ import annotations

import ctypes
import sys

import llama_cpp
import numpy as np

GGML_TYPE_F32 = 0


class GgmlTensor(ctypes.Structure):
    """The head of ggml's `struct ggml_tensor` (ggml.h), up to its name."""

    _fields_ = [
        ("type", ctypes.c_int32),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int32),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def tensor_array(t: GgmlTensor) -> np.ndarray:
    """A copy of a float32 tensor's values, following its strides (views and permutes included)."""
    ne, nb = list(t.ne), list(t.nb)
    span = sum((n - 1) * b for n, b in zip(ne, nb, strict=True)) + 4
    raw = np.frombuffer((ctypes.c_uint8 * span).from_address(t.data), np.uint8)
    shape, strides = (ne[3], ne[2], ne[1], ne[0], 4), (nb[3], nb[2], nb[1], nb[0], 1)
    values = np.lib.stride_tricks.as_strided(raw, shape, strides).copy()  # ggml reuses the memory later
    return values.view(np.float32)[..., 0]


def trace(path: str, text: str) -> dict[str, np.ndarray]:
    captured: dict[str, np.ndarray] = {}

    @llama_cpp.ggml_backend_sched_eval_callback
    def observe(pointer: int, ask: bool, _user: int) -> bool:
        t = ctypes.cast(pointer, ctypes.POINTER(GgmlTensor)).contents
        if not ask and t.type == GGML_TYPE_F32:
            name, k = t.name.decode(), 0
            while (key := name if k == 0 else f"{name}#{k}") in captured:
                k += 1
            captured[key] = tensor_array(t)
        return True  # when asked: yes, show me every tensor

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 512, 2, 2
    params.embeddings, params.pooling_type = True, llama_cpp.LLAMA_POOLING_TYPE_NONE
    params.cb_eval = observe
    ctx = llama_cpp.llama_init_from_model(model, params)
    data = text.encode()
    buffer = (llama_cpp.llama_token * 512)()
    n = llama_cpp.llama_tokenize(
        llama_cpp.llama_model_get_vocab(model), data, len(data), buffer, 512, True, True
    )
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    for i in range(n):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = buffer[i], i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, 1
    batch.n_tokens = n
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")
    captured["__tokens"] = np.array(buffer[:n])
    return captured


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    path, out, text = sys.argv[1:]
    captured = trace(path, text)
    np.savez(out, **captured)  # type: ignore[arg-type]
    print(f"{len(captured) - 1} tensors -> {out}")


if __name__ == "__main__":
    main()
