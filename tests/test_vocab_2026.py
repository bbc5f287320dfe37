"""The Qwen3.5 (`qwen35`) and Gemma 4 (`gemma4`) vocabularies against llama.cpp.

Both are llama.cpp's own vocabulary-only files (models/ggml-vocab-qwen35.gguf, -gemma-4.gguf of the
llama-cpp-python 0.3.36 sdist, llama.cpp 0c1e570). Qwen3.5's is in tests/data/vocab/ (xz); Gemma 4's
(15.8 MB) is not committed: it comes from the reference cache (engine/reference_data.py), a missing one
skips outside CI and fails under CI=true. Each must encode llama.cpp's own test strings
(tests/data/vocab/ggml-vocab-*.gguf.inp/.out) exactly, and every string of tests/golden/vocab_2026.json
(scripts/make_vocab_2026_goldens.py: those strings plus mixes, chat markup, GPL-3) three ways, decode
back to llama.cpp's text, and carry llama.cpp's BOS, end-of-generation and token-attribute tables.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import gguf
import pytest

from engine.gguf import GGUFFile
from engine.reference_data import ReferenceDataError, reference_file
from engine.text.tokenizer import SPM_SPACE, Tokenizer
from tests.conftest import gpl3_text, load_golden, require

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "tokenizers are Python: no kernel runs"

VOCAB_DIR = Path(__file__).resolve().parent / "data" / "vocab"
VOCABS = ("qwen35", "gemma-4")
VARIANTS = {"plain": (False, False), "parse_special": (False, True), "with_bos": (True, True)}


def vocab_file(name: str, tmp: Path) -> Path:
    if name == "qwen35":
        path = tmp / "qwen35.gguf"
        path.write_bytes(lzma.decompress((VOCAB_DIR / "qwen35.gguf.xz").read_bytes()))
        return path
    try:
        return reference_file(f"models/ggml-vocab-{name}.gguf")
    except ReferenceDataError as exc:
        require(f"llama.cpp's reference files could not be fetched: {exc}")
        raise  # (not reached: require() does not return when given a reason)


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden("vocab_2026")["vocabs"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    class Loaded(dict[str, Tokenizer]):
        def __missing__(self, name: str) -> Tokenizer:
            self[name] = Tokenizer.from_gguf(GGUFFile(vocab_file(name, tmp_path_factory.mktemp("vocab"))))
            return self[name]

    return Loaded()


@pytest.fixture(params=VOCABS)
def vocab(request: pytest.FixtureRequest, tokenizers: dict[str, Tokenizer]) -> tuple[str, Tokenizer]:
    return request.param, tokenizers[request.param]


def test_llama_cpp_shipped_expectations(vocab: tuple[str, Tokenizer]) -> None:
    """llama.cpp's test-tokenizer-0 on its own files: no BOS, special-token text as text."""
    name, tok = vocab
    path = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    texts = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")[: len(texts)]
    assert len(texts) == {"qwen35": 50, "gemma-4": 45}[name]
    got = [tok.encode(t, add_special=False, parse_special=False) for t in texts]
    assert got == [[int(i) for i in line.split()] for line in expected]


def test_token_ids_equal_llama_cpp(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    name, tok = vocab
    rows = golden[name]["tokenize"]
    assert len(rows) > 360
    mismatches = [
        (row["text"], variant, got, row[variant])
        for row in rows
        for variant, (add_special, parse_special) in VARIANTS.items()
        if (got := tok.encode(row["text"], add_special=add_special, parse_special=parse_special))
        != row[variant]
    ]
    assert mismatches == []


def test_long_text_equals_llama_cpp(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    # Gemma 4 merges whole lines: a long one crosses many of the segment cuts Llamba caches by.
    name, tok = vocab
    assert tok.encode(gpl3_text()) == golden[name]["gpl3_with_bos"]


def test_detokenized_text_equals_llama_cpp(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    # llama_detokenize with special tokens rendered; Gemma 4's vocabulary keeps llama.cpp's BPE clean-up
    # (" ," -> ","), Qwen3.5's does not.
    name, tok = vocab
    mismatches = [
        (row["text"], tok.decode(row["with_bos"]), row["detok"])
        for row in golden[name]["tokenize"]
        if tok.decode(row["with_bos"]) != row["detok"]
    ]
    assert mismatches == []


def test_pieces_give_the_text_back(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    """Encoding loses nothing: the tokens' bytes, joined, are the text's; Gemma 4 reads U+2581 as the
    space it escapes spaces to, and its byte-fallback tokens rebuild what no token spells."""
    name, tok = vocab
    for row in golden[name]["tokenize"]:
        ids = tok.encode(row["text"], add_special=False, parse_special=False)
        text = row["text"].replace(SPM_SPACE, " ") if name == "gemma-4" else row["text"]
        assert b"".join(tok.token_to_piece(t) for t in ids) == text.encode("utf-8")


def test_vocabulary_flags_equal_llama_cpp(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    # Gemma 4: BOS added (llama.cpp forces it), `<eos>`, `<turn|>`, `<|tool_response>` end a generation and
    # `</s>` is ordinary text; Qwen3.5: no BOS, `<|endoftext|>`, `<|im_end|>` and `</s>` end it.
    name, tok = vocab
    entry = golden[name]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (entry["bos"], entry["eos"], entry["add_bos"])
    assert sorted(tok.eog_ids) == entry["eog"]
    attrs: dict[str, list[int]] = {}
    for tid in range(tok.n_vocab):
        if (attr := int(tok.attr(tid))) != 4:  # NORMAL
            attrs.setdefault(str(attr), []).append(tid)
    assert attrs == entry["attrs"]


def test_a_gemma4_file_gets_bos_whatever_it_says(tmp_path: Path) -> None:
    """llama.cpp turns a Gemma 4 file's add_bos_token false into true (its workaround, llama-vocab.cpp),
    and merges whole lines: here `a▁b` is one token, a merge across the space."""
    path = tmp_path / "tiny-gemma4.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma4")
    tokens = ["<pad>", "<eos>", "<bos>", "a", "\u2581", "b", "a\u2581", "a\u2581b", "\n", "<0x21>"]
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3, 1, 1, 1, 1, 1, 1, 6])
    writer.add_token_merges(["a \u2581", "a\u2581 b"])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tok = Tokenizer.from_gguf(GGUFFile(path))
    assert tok.add_bos and tok.encode("a b\n!") == [2, 7, 8, 9]
    assert tok.decode([2, 7, 8, 9]) == "<bos>a b\n!"
