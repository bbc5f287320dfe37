"""A synthetic gpt-oss GGUF whose tokenizer is gpt-oss's own: o200k_harmony, and llama.cpp's harmony
chat template, so that the server renders, tokenizes and parses harmony chats as it would for the real
gpt-oss-20b; only the weights are random.

How it is built:

- weights: tests/synthetic_moe_gguf.py's gpt-oss layout (llama.cpp's tensor names, attention and expert
  biases, sinks, a sliding window every other layer, YaRN; MXFP4 experts and Q8_0 for the other
  matrices, as the gpt-oss release ships) at small widths (64-wide embedding, 4 query heads of 64 on 2
  kv heads, 8 experts of 64, 4 used), with an embedding and output head as wide as the real
  vocabulary (201,088 rows);
- vocabulary: o200k_base, gpt-oss's base vocabulary, from tests/data/vocab/gpt-4o.gguf.xz (its first
  199,998 tokens, byte-level BPE written as GPT-2 characters, and its 446,189 merges derived from the
  ranks: gpt-oss-20b's GGUF has as many), pre-tokenizer `gpt-4o` as in gpt-oss's GGUF. Its Phi-4-mini
  added tokens are dropped and o200k_harmony's special tokens put in their place at gpt-oss's ids
  (tiktoken's `o200k_harmony`): `<|startoftext|>` 199998, `<|endoftext|>` 199999, `<|return|>` 200002,
  `<|constrain|>` 200003, `<|channel|>` 200005, `<|start|>` 200006, `<|end|>` 200007, `<|message|>`
  200008, `<|call|>` 200012, `<|endofprompt|>` 200018, and `<|reserved_N|>` for every other id up to
  201,087, all CONTROL as the converter writes them;
- special ids as gpt-oss-20b's GGUF has them: BOS 199998, EOS 200002 (`<|return|>`), padding 199999,
  no EOT key and no add_bos_token key (llama.cpp's default for `gpt-4o`: no BOS). At load, llama.cpp
  (and engine/text/tokenizer.py after it) makes `<|channel|>`, `<|message|>`, `<|start|>`,
  `<|constrain|>` and `<|end|>` user-defined (rendered in the output) and keeps `<|return|>`, `<|call|>`
  and `<|endoftext|>` as end-of-generation, `<|end|>` not;
- chat template: llama.cpp's models/templates/openai-gpt-oss-120b.jinja (engine/reference_data.py), as
  `tokenizer.chat_template`.

The same template text gives the same bytes.
"""

from __future__ import annotations

import functools
import lzma
import tempfile
from pathlib import Path

import gguf

from engine.gguf import GGUFFile
from tests.synthetic_moe_gguf import MoeCase, write_gguf

VOCAB_FILE = Path(__file__).resolve().parent / "data" / "vocab" / "gpt-4o.gguf.xz"
N_BASE = 199_998  # o200k_base's ranked byte sequences
N_VOCAB = 201_088  # o200k_harmony
SPECIAL = {
    "<|startoftext|>": 199_998,
    "<|endoftext|>": 199_999,
    "<|return|>": 200_002,
    "<|constrain|>": 200_003,
    "<|channel|>": 200_005,
    "<|start|>": 200_006,
    "<|end|>": 200_007,
    "<|message|>": 200_008,
    "<|call|>": 200_012,
    "<|endofprompt|>": 200_018,
}
BOS, EOS, PAD = SPECIAL["<|startoftext|>"], SPECIAL["<|return|>"], SPECIAL["<|endoftext|>"]
TEMPLATE = "models/templates/openai-gpt-oss-120b.jinja"  # under llama.cpp's root (reference data)

CASE = MoeCase(
    "gpt-oss-harmony",
    "gpt-oss",
    "MXFP4",
    n_embd=64,
    n_head=4,
    n_kv_head=2,
    head_dim=64,
    n_expert=8,
    n_used=4,
    n_ff_exp=64,
    qkv_bias=True,
    sliding_window=8,
    rope_base=150000.0,
    n_vocab=N_VOCAB,
)


@functools.cache
def harmony_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of o200k_harmony as gpt-oss's GGUF holds them."""
    with tempfile.TemporaryDirectory() as folder:  # the reader maps a file
        path = Path(folder) / "gpt-4o.gguf"
        path.write_bytes(lzma.decompress(VOCAB_FILE.read_bytes()))
        # engine/gguf.py's reader: 1 s where gguf's GGUFReader takes 15 s of CPU on these 646k strings
        meta = GGUFFile(path).metadata
        base, merges = list(meta["tokenizer.ggml.tokens"][:N_BASE]), list(meta["tokenizer.ggml.merges"])
    by_id = {i: text for text, i in SPECIAL.items()}
    specials = [by_id.get(i, f"<|reserved_{i}|>") for i in range(N_BASE, N_VOCAB)]
    normal, control = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
    types = [normal] * N_BASE + [control] * len(specials)
    return base + specials, types, merges


def _write_vocabulary(w: gguf.GGUFWriter, template: str) -> None:
    tokens, types, merges = harmony_vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_pad_token_id(PAD)
    w.add_chat_template(template)


def write_harmony_gguf(path: Path, template: str) -> Path:
    """The synthetic gpt-oss model with o200k_harmony and `template` (llama.cpp's harmony template's
    text) as a GGUF file at `path`."""
    return write_gguf(CASE, path, vocabulary=lambda w: _write_vocabulary(w, template))
