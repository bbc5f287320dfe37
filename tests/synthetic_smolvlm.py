"""A SYNTHETIC SmolVLM text model: the real SmolLM2-135M-Instruct (Q4_1) with SmolVLM's 128 added tokens.

SmolVLM-256M's text model is a SmolLM2-135M-sized llama whose vocabulary is SmolLM2's 49152 tokens plus
128 added ones (49280), among them what mtmd's idefics3 path looks up or writes around an image:
`<global-img>` (49152), `<row_R_col_C>` for R, C in 1..6 (49153..49188, row-major),
`<fake_token_around_image>` (49189), `<image>` (49190) and `<end_of_utterance>` (49279); the ids are
SmolVLM's as published tokenizer configs and code quote them, the 88 between (49191..49278) are named
`<|reserved_special_token_K|>` here as placeholders. No SmolVLM text model is reachable from here, so this
file is SmolLM2's, every tensor and key kept, the vocabulary extended: the added tokens are CONTROL (the
converter's type for special added tokens), and their token_embd rows are copies of seeded random rows
of SmolLM2's own (Q4_1 rows copied byte for byte: the same norms as real tokens). SmolLM2 ties its output
to token_embd, so the logits have 49280 entries too. The bytes depend only on the base file and seed.

    .venv/bin/python -m tests.synthetic_smolvlm OUT.gguf [BASE.gguf]
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

MODELS = Path.home() / ".cache" / "llamba" / "models"
BASE = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
N_BASE, N_VOCAB = 49152, 49280
CONTROL = int(gguf.TokenType.CONTROL)
# Fields the writer sets itself, or that this file rewrites.
OWN_FIELDS = ("general.architecture", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


def added_tokens() -> list[str]:
    """SmolVLM's 128 added tokens in id order (from 49152)."""
    rows = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    added = ["<global-img>", *rows, "<fake_token_around_image>", "<image>"]
    added += [f"<|reserved_special_token_{k}|>" for k in range(N_VOCAB - N_BASE - len(added) - 1)]
    return [*added, "<end_of_utterance>"]


def write_smolvlm_text(path: str | Path, base: str | Path = BASE, seed: int = 0) -> Path:
    """Write the extended model to `path`; returns it."""
    path = Path(path)
    reader = gguf.GGUFReader(str(base))
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    assert len(tokens) == N_BASE, len(tokens)
    w = gguf.GGUFWriter(str(path), str(reader.fields["general.architecture"].contents()))
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in OWN_FIELDS:
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if f.name == "general.name":
            value = "synthetic SmolVLM text (SmolLM2-135M-Instruct + SmolVLM's added tokens)"
        if f.name.endswith(".vocab_size"):
            value = N_VOCAB
        w.add_key_value(f.name, value, f.types[0], sub_type=sub)
    w.add_token_list([*tokens, *added_tokens()])
    w.add_token_types([*types, *[CONTROL] * (N_VOCAB - N_BASE)])
    rng = np.random.default_rng(seed)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name == "token_embd.weight":  # raw rows (bytes) of the quantized matrix
            assert data.shape[0] == N_BASE, data.shape
            data = np.concatenate([data, data[rng.integers(256, N_BASE, N_VOCAB - N_BASE)]])
        assert t.name != "output.weight", "SmolLM2 ties its output: an untied one would need rows too"
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    write_smolvlm_text(sys.argv[1], *(sys.argv[2:3] or [BASE]))
