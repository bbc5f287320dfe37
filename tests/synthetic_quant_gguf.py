"""Small synthetic llama GGUFs with random weights in one tensor type, written deterministically.

`write_llama_gguf(path, qtype, seed)` writes a 2-layer llama (256 wide, 512-token SentencePiece
vocabulary, tied embeddings) whose every matrix (token embedding/head included) is stored in `qtype`;
norms are F32. The same (qtype, seed) gives the same bytes, so a test can rebuild the file that
scripts/make_quant_goldens.py gave llama.cpp (its sha256 is recorded with llama.cpp's logits).

Weights: types the `gguf` package quantizes (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are
quantized from normal values; for the others (K-quants, IQ4) the quants and sub-block scales are
random bits and only the f16 super-block scales are chosen, so that the weights have the wanted
spread and about zero mean (dmin is set to the mean quant times d).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES


@dataclass(frozen=True)
class SyntheticShape:
    n_layer: int = 2
    n_embd: int = 256
    n_ff: int = 512
    n_head: int = 4
    n_kv_head: int = 2
    n_vocab: int = 512
    n_ctx: int = 256


SHAPE = SyntheticShape()
# Types the gguf package can quantize from floats.
_GGUF_QUANTIZES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
# Random-bit types: byte offsets of the f16 scale d and of the f16 dmin, and the mean unsigned quant
# (dmin = mean * d centres the weights of a sub-block whose scale and min are equal on average).
_RANDOM_FIELDS: dict[str, tuple[int, int | None, float]] = {
    "Q2_K": (80, 82, 1.5),
    "Q3_K": (108, None, 0.0),
    "Q4_K": (0, 2, 7.5),
    "Q5_K": (0, 2, 15.5),
    "Q6_K": (208, None, 0.0),
    "IQ4_NL": (0, None, 0.0),
    "IQ4_XS": (0, None, 0.0),
}


def _set_f16(raw: np.ndarray, offset: int, values: np.ndarray) -> None:
    raw[..., offset : offset + 2] = values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def random_matrix(rng: np.random.Generator, type_name: str, rows: int, cols: int, std: float) -> np.ndarray:
    """Stored rows (rows, bytes per row; float types as their dtype) of a random matrix of the type."""
    qtype = GGMLQuantizationType[type_name]
    if type_name in _GGUF_QUANTIZES:
        weights = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if type_name == "F32":
            return weights
        if type_name == "F16":
            return weights.astype(np.float16)
        return gguf_quants.quantize(weights, qtype)
    d_at, dmin_at, mean_q = _RANDOM_FIELDS[type_name]
    block, size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{type_name} rows hold whole blocks of {block}, not {cols} values")
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, raw.shape[:2]).astype(np.float32)
    dmin = mean_q * d * rng.uniform(0.9, 1.1, raw.shape[:2]).astype(np.float32)
    _set_f16(raw, d_at, d)
    if dmin_at is not None:
        _set_f16(raw, dmin_at, dmin)
    spread = float(gguf_quants.dequantize(raw.reshape(rows, -1), qtype).std())
    _set_f16(raw, d_at, d * (std / spread))
    if dmin_at is not None:
        _set_f16(raw, dmin_at, dmin * (std / spread))
    return raw.reshape(rows, -1)


def write_vocabulary(w: GGUFWriter, n_vocab: int) -> None:
    """The SentencePiece-style test vocabulary (`_vocabulary`) with its special ids: unk 0, bos 1, eos 2."""
    tokens, scores, types = _vocabulary(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def _vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style: <unk>, <s>, </s>, the 256 byte tokens, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, byte
    tokens += [f"\u2581w{i}" for i in range(n_vocab - len(tokens))]
    types += [1] * (n_vocab - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, types


def _metadata(w: GGUFWriter, s: SyntheticShape, type_name: str) -> None:
    w.add_name(f"synthetic-llama-{type_name}")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_kv_head)
    w.add_rope_dimension_count(s.n_embd // s.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s.n_vocab)
    write_vocabulary(w, s.n_vocab)


def _add(w: GGUFWriter, name: str, data: np.ndarray, type_name: str) -> None:
    if data.dtype in (np.float32, np.float16):
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType[type_name])


def write_llama_gguf(path: Path, type_name: str, seed: int = 0, shape: SyntheticShape = SHAPE) -> Path:
    """Write the synthetic model with every matrix in `type_name` (a GGMLQuantizationType name)."""
    rng = np.random.default_rng(seed)
    s = shape
    head_dim = s.n_embd // s.n_head
    w = GGUFWriter(str(path), "llama")
    _metadata(w, s, type_name)

    def matrix(name: str, rows: int, cols: int, std: float) -> None:
        _add(w, name, random_matrix(rng, type_name, rows, cols, std), type_name)

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(s.n_embd)).astype(np.float32))

    matrix("token_embd.weight", s.n_vocab, s.n_embd, 0.25)
    norm("output_norm.weight")
    for il in range(s.n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        matrix(p + "attn_q.weight", s.n_embd, s.n_embd, 2.0 / np.sqrt(s.n_embd))
        matrix(p + "attn_k.weight", s.n_kv_head * head_dim, s.n_embd, 2.0 / np.sqrt(s.n_embd))
        matrix(p + "attn_v.weight", s.n_kv_head * head_dim, s.n_embd, 1.0 / np.sqrt(s.n_embd))
        matrix(p + "attn_output.weight", s.n_embd, s.n_embd, 1.0 / np.sqrt(s.n_embd))
        norm(p + "ffn_norm.weight")
        matrix(p + "ffn_gate.weight", s.n_ff, s.n_embd, 1.0 / np.sqrt(s.n_embd))
        matrix(p + "ffn_up.weight", s.n_ff, s.n_embd, 1.0 / np.sqrt(s.n_embd))
        matrix(p + "ffn_down.weight", s.n_embd, s.n_ff, 1.0 / np.sqrt(s.n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
