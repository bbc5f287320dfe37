"""SYNTHETIC LoRA adapters for a real base model file, laid out as llama.cpp's convert_lora_to_gguf.py
writes them (no real adapter file is reachable from here).

The file is a GGUF with `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha` and the
base's `general.architecture`; per adapted matrix `blk.N.<name>.weight.lora_a` (numpy [rank, n_in],
ggml ne (n_in, rank)) and `.lora_b` (numpy [n_out, rank], ggml ne (rank, n_out)), F32 or F16. The
values are random (a fixed seed) and scaled per matrix so that at scale 1 the low-rank term is about
`strength` of the base matrix's output (by root-mean-square over random inputs): the logits move
visibly, the text stays text. Nothing here was trained: these adapters exist to test the arithmetic.

`task_name` writes llama.cpp's `adapter.lora.task_name` (the name an unnamed adapter is served under as a
model); `invocation_tokens` makes it an activated LoRA (aLoRA): `adapter.alora.invocation_tokens`, a
UINT32 array, as convert_lora_to_gguf.py writes it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from engine.gguf import GGUFFile
from engine.quant import dequantize

# The matrices convert_lora_to_gguf.py adapts in a LLaMA-family layer (its usual target_modules).
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(
    base: Path,
    out: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    seed: int = 0,
    dtype: str = "F32",
    strength: float = 0.08,
    targets: tuple[str, ...] = TARGETS,
    layers: range | None = None,
    task_name: str = "",
    invocation_tokens: tuple[int, ...] = (),
) -> Path:
    """Write a synthetic LoRA adapter for the base GGUF `base` to `out` (dtype F32 or F16); returns `out`."""
    import gguf

    g = GGUFFile(base)
    arch = str(g.metadata["general.architecture"])
    n_layer = int(g.metadata[f"{arch}.block_count"])
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    writer.add_name(f"synthetic LoRA r{rank} seed {seed} for {g.path.name}")
    if task_name:
        writer.add_string(gguf.Keys.Adapter.LORA_TASK_NAME, task_name)
    if invocation_tokens:
        key, uint32 = gguf.Keys.Adapter.ALORA_INVOCATION_TOKENS, gguf.GGUFValueType.UINT32
        writer.add_key_value(key, [int(t) for t in invocation_tokens], gguf.GGUFValueType.ARRAY, uint32)
    np_type = np.float32 if dtype == "F32" else np.float16
    for il in layers if layers is not None else range(n_layer):
        for target in targets:
            name = f"blk.{il}.{target}.weight"
            if name not in g.tensors:
                continue
            t = g.tensors[name]
            n_out, n_in = t.shape
            w = dequantize(t.data, t.ggml_type, (n_out, n_in)) if t.data.dtype == np.uint8 else t.data
            w_rms = float(np.sqrt(np.mean(np.square(np.asarray(w, dtype=np.float64)))))
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            # |W x| ~ sqrt(n_in) w_rms |x|_rms; |(alpha/r) B A x| ~ (alpha/r) sqrt(r) b_sigma |x|_rms
            b_sigma = strength * np.sqrt(n_in) * w_rms / ((alpha / rank) * np.sqrt(rank))
            b = rng.standard_normal((n_out, rank)) * b_sigma
            writer.add_tensor(name + ".lora_a", a.astype(np_type))
            writer.add_tensor(name + ".lora_b", b.astype(np_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
