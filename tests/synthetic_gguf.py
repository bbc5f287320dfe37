"""Small seeded GGUF models of each architecture, written as llama.cpp's converter writes them.

Random float32 weights (std 1/sqrt(fan-in), norms near 1), two layers, a 320-token byte-level BPE
vocabulary (GPT-2's 256 byte symbols, 62 merges, BOS/EOS), and each family's metadata and tensor names
(llama.cpp's src/llama-arch.cpp and its conversion/*.py). The same name always gives the same bytes, so
`scripts/make_arch_goldens.py` (llama.cpp's logits, committed) and tests/test_archs.py (Llamba's) run
the very same model without committing it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

N_VOCAB = 320
BOS, EOS = N_VOCAB - 2, N_VOCAB - 1


@dataclass(frozen=True)
class Shape:
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_kv_head: int = 2
    head_dim: int = 32
    n_ff: int = 256
    n_ctx_train: int = 1024


@dataclass(frozen=True)
class ArchCase:
    """One synthetic model: its name (the seed), architecture, shape, extra metadata and extra tensors."""

    name: str
    arch: str
    shape: Shape = Shape()
    rope_base: float = 10000.0
    metadata: dict[str, Any] = field(default_factory=dict)  # keys without the "<arch>." prefix
    explicit_head_dim: bool = False  # write attention.key_length/value_length (head_dim != n_embd / n_head)
    tied_output: bool = False  # no output.weight: the head is the token embedding
    extra: Callable[[ArchCase, np.random.Generator], dict[str, np.ndarray]] | None = None
    n_ctx: int = 256  # the context llama.cpp and Llamba run it with (llama.cpp pads to 256)
    n_tokens: int = 32


def byte_symbols() -> list[str]:
    """GPT-2's byte -> printable symbol table (bytes_to_unicode)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types, merges: 256 bytes, 62 two-letter merges, BOS and EOS (control)."""
    letters = "etaoinshrd"
    pairs = [a + b for a in letters for b in letters][: N_VOCAB - 256 - 2]
    tokens = [*byte_symbols(), *pairs, "<|bos|>", "<|eos|>"]
    types = [1] * (N_VOCAB - 2) + [3, 3]  # normal, control
    return tokens, types, [f"{p[0]} {p[1]}" for p in pairs]


def _matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def layer_tensors(case: ArchCase, rng: np.random.Generator, il: int) -> dict[str, np.ndarray]:
    s = case.shape
    p = f"blk.{il}."
    q_dim, kv_dim = s.n_head * s.head_dim, s.n_kv_head * s.head_dim
    out = {p + "attn_norm.weight": _norm(rng, s.n_embd)}
    if case.arch == "phi3":  # fused Q|K|V and gate|up, as the phi3 converter writes them
        out[p + "attn_qkv.weight"] = _matrix(rng, q_dim + 2 * kv_dim, s.n_embd)
    else:
        out[p + "attn_q.weight"] = _matrix(rng, q_dim, s.n_embd)
        out[p + "attn_k.weight"] = _matrix(rng, kv_dim, s.n_embd)
        out[p + "attn_v.weight"] = _matrix(rng, kv_dim, s.n_embd)
    if case.arch == "qwen3":
        out[p + "attn_q_norm.weight"] = _norm(rng, s.head_dim)
        out[p + "attn_k_norm.weight"] = _norm(rng, s.head_dim)
    out[p + "attn_output.weight"] = _matrix(rng, s.n_embd, q_dim)
    out[p + "ffn_norm.weight"] = _norm(rng, s.n_embd)
    if case.arch == "phi3":
        out[p + "ffn_up.weight"] = _matrix(rng, 2 * s.n_ff, s.n_embd)
    else:
        out[p + "ffn_gate.weight"] = _matrix(rng, s.n_ff, s.n_embd)
        out[p + "ffn_up.weight"] = _matrix(rng, s.n_ff, s.n_embd)
    out[p + "ffn_down.weight"] = _matrix(rng, s.n_embd, s.n_ff)
    return out


def model_tensors(case: ArchCase) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    s = case.shape
    tensors = {"token_embd.weight": rng.standard_normal((N_VOCAB, s.n_embd)).astype(np.float32)}
    tensors["output_norm.weight"] = _norm(rng, s.n_embd)
    if not case.tied_output:
        tensors["output.weight"] = _matrix(rng, N_VOCAB, s.n_embd)
    for il in range(s.n_layer):
        tensors |= layer_tensors(case, rng, il)
    if case.extra is not None:
        tensors |= case.extra(case, rng)
    return tensors


def _write_metadata(w: gguf.GGUFWriter, case: ArchCase) -> None:
    s, a = case.shape, case.arch
    # Not the case's name: llama.cpp sets Phi-3 token attributes by a name containing "phi3" and then
    # needs Phi-3's own special tokens.
    w.add_name("Llamba synthetic model")
    w.add_block_count(s.n_layer)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_kv_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(case.rope_base)
    if case.explicit_head_dim:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    if a in ("llama", "mistral3"):
        w.add_vocab_size(N_VOCAB)
        w.add_rope_dimension_count(s.head_dim)
    for key, value in case.metadata.items():
        full = f"{a}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, value)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def _write_vocabulary(w: gguf.GGUFWriter, pre: str) -> None:
    tokens, types, merges = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_add_bos_token(False)


def write_gguf(case: ArchCase, path: Path, pre: str = "gpt-2") -> Path:
    """The case's model as a GGUF file at `path` (same name, same bytes); `pre` is its pre-tokenizer."""
    w = gguf.GGUFWriter(str(path), case.arch)
    _write_metadata(w, case)
    _write_vocabulary(w, pre)
    for name, data in model_tensors(case).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def prompt_tokens(case: ArchCase) -> list[int]:
    """The case's input: seeded token ids, BOS first."""
    rng = np.random.default_rng(zlib.crc32(("tokens:" + case.name).encode()))
    return [BOS, *rng.integers(0, BOS, case.n_tokens - 1).tolist()]


# -- the cases -----------------------------------------------------------------------------------------


def llama3_rope_freqs(case: ArchCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`rope_freqs.weight` as the llama converter computes it from Llama 3's rope_scaling (factor 8,
    low/high frequency factors 1 and 4), with an original context of 64 so that the tiny model's
    pairs fall in all three bands (kept, ramped, divided by the factor)."""
    dim, base = case.shape.head_dim, case.rope_base
    factor, low, high, old_ctx = 8.0, 1.0, 4.0, 64
    factors = []
    for freq in 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float32) / dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            factors.append(1.0)
        elif wavelen > old_ctx / low:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return {"rope_freqs.weight": np.array(factors, dtype=np.float32)}


def llama_biases(case: ArchCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The optional biases llama.cpp's llama loader takes: Q/K/V, attention output, gate, up, down."""
    s = case.shape
    sizes = {
        "attn_q": s.n_head * s.head_dim,
        "attn_k": s.n_kv_head * s.head_dim,
        "attn_v": s.n_kv_head * s.head_dim,
        "attn_output": s.n_embd,
        "ffn_gate": s.n_ff,
        "ffn_up": s.n_ff,
        "ffn_down": s.n_embd,
    }
    return {
        f"blk.{il}.{name}.bias": (0.5 * rng.standard_normal(n)).astype(np.float32)
        for il in range(s.n_layer)
        for name, n in sizes.items()
    }


def phi3_long_rope(case: ArchCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """LongRoPE's per-pair factors over the rotated dimensions (rope.dimension_count / 2)."""
    half = int(case.metadata["rope.dimension_count"]) // 2
    short = (1.0 + rng.uniform(0.0, 0.5, half)).astype(np.float32)
    long = (1.0 + rng.uniform(0.0, 8.0, half)).astype(np.float32)
    return {"rope_factors_short.weight": short, "rope_factors_long.weight": long}


def _phi3(name: str, n_ctx: int) -> ArchCase:
    orig, train = 256, 1024
    return ArchCase(
        name,
        "phi3",
        Shape(n_ctx_train=train),
        metadata={
            "rope.dimension_count": 24,  # partial rotary, as Phi-4-mini (3/4 of head_dim)
            "rope.scaling.original_context_length": orig,
            "rope.scaling.attn_factor": math.sqrt(1 + math.log(train / orig) / math.log(orig)),
            "attention.sliding_window": 16,  # ignored by llama.cpp (Phi SWA disabled), and by Llamba
        },
        extra=phi3_long_rope,
        n_ctx=n_ctx,
    )


LINEAR_X4 = {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}

CASES: dict[str, ArchCase] = {
    c.name: c
    for c in (
        ArchCase(
            "qwen3", "qwen3", Shape(head_dim=64), rope_base=1e6, explicit_head_dim=True, tied_output=True
        ),
        ArchCase("llama3-rope-scaling", "llama", rope_base=500000.0, extra=llama3_rope_freqs),
        ArchCase("llama-linear-rope", "llama", metadata=LINEAR_X4),
        ArchCase("llama-biases", "llama", extra=llama_biases),
        # Mistral 7B / Nemo convert to `llama`: base 1e6, and Nemo's head_dim (128 under 5120) is not
        # n_embd / n_head: key_length and rope.dimension_count say it.
        ArchCase("mistral-nemo-style", "llama", Shape(head_dim=64), rope_base=1e6, explicit_head_dim=True),
        ArchCase(
            "ministral3",
            "mistral3",
            rope_base=1e6,
            metadata={
                "rope.scaling.type": "yarn",
                "rope.scaling.factor": 16.0,
                "rope.scaling.original_context_length": 12,  # small: the temperature applies from 12 on
                "rope.scaling.yarn_beta_fast": 32.0,
                "rope.scaling.yarn_beta_slow": 1.0,
                "rope.scaling.yarn_log_multiplier": 0.5,
                "attention.temperature_scale": 0.1,
            },
        ),
        _phi3("phi3-short-rope", 256),
        _phi3("phi3-long-rope", 512),
    )
}

UNSUPPORTED = ArchCase("falcon-unsupported", "falcon")
