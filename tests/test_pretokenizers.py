"""The pre-tokenizers of Llama 3 (`llama-bpe`), Mistral Nemo (`tekken`), Phi-4 (`gpt-4o`) against llama.cpp.

Each runs on a real vocabulary-only GGUF (tests/data/vocab/, see its README: llama.cpp's own file for
Llama 3, built from PyPI-shipped rank tables for the other two) and must give llama.cpp's token ids for
every string of tests/golden/pretokenizers.json (llama.cpp's test strings, case-splitting and special-token
strings, 300 seeded random mixes), and llama.cpp's text back."""

from __future__ import annotations

import lzma
import random
import re
from pathlib import Path

import gguf
import pytest
import regex

from engine.gguf import GGUFFile, UnsupportedModelError
from engine.llm import LLM
from engine.text.tokenizer import _PRE_TOKENIZERS, Tokenizer
from tests.conftest import load_golden
from tests.synthetic_gguf import CASES, write_gguf

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "tokenizers are Python: no kernel runs"

VOCAB_DIR = Path(__file__).resolve().parent / "data" / "vocab"
VOCABS = ("llama-bpe", "tekken", "gpt-4o")
VARIANTS = {"plain": (False, False), "parse_special": (False, True), "with_bos": (True, True)}


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden("pretokenizers")["vocabs"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    """The vocabularies' tokenizers, each decompressed and loaded once (on first use)."""

    class Loaded(dict[str, Tokenizer]):
        def __missing__(self, name: str) -> Tokenizer:
            path = tmp_path_factory.mktemp("vocab") / f"{name}.gguf"
            path.write_bytes(lzma.decompress((VOCAB_DIR / f"{name}.gguf.xz").read_bytes()))
            self[name] = Tokenizer.from_gguf(GGUFFile(path))
            return self[name]

    return Loaded()


@pytest.fixture(params=VOCABS)
def vocab(request: pytest.FixtureRequest, tokenizers: dict[str, Tokenizer]) -> tuple[str, Tokenizer]:
    return request.param, tokenizers[request.param]


def test_token_ids_equal_llama_cpp(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    name, tok = vocab
    rows = golden[name]["tokenize"]
    assert len(rows) > 350
    mismatches = []
    for row in rows:
        for variant, (add_special, parse_special) in VARIANTS.items():
            got = tok.encode(row["text"], add_special=add_special, parse_special=parse_special)
            if got != row[variant]:
                mismatches.append((row["text"], variant, got, row[variant]))
    assert mismatches == []


def test_detokenized_text_equals_llama_cpp(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    # llama_detokenize with special tokens rendered: BOS and specials come back as text, and Llama 3's
    # clean-up (" ," -> ",") applies as there.
    name, tok = vocab
    mismatches = [
        (row["text"], tok.decode(row["with_bos"]), row["detok"])
        for row in golden[name]["tokenize"]
        if tok.decode(row["with_bos"]) != row["detok"]
    ]
    assert mismatches == []


def test_pieces_give_the_text_back(vocab: tuple[str, Tokenizer], golden: dict) -> None:
    """Encoding loses nothing: the tokens' bytes, joined, are the text's (no clean-up involved)."""
    name, tok = vocab
    for row in golden[name]["tokenize"]:
        ids = tok.encode(row["text"], add_special=False, parse_special=False)
        assert b"".join(tok.token_to_piece(t) for t in ids) == row["text"].encode("utf-8")


def test_llama_cpp_shipped_expectations(tokenizers: dict[str, Tokenizer]) -> None:
    """llama.cpp's own test file for its Llama 3 vocabulary (models/ggml-vocab-llama-bpe.gguf.inp/.out)
    with its test's settings: no BOS, special-token text as text."""
    path = VOCAB_DIR / "ggml-vocab-llama-bpe.gguf"
    texts = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")[: len(texts)]
    assert len(texts) == 46
    tok = tokenizers["llama-bpe"]
    got = [tok.encode(t, add_special=False, parse_special=False) for t in texts]
    assert got == [[int(i) for i in line.split()] for line in expected]


def test_vocabulary_flags(vocab: tuple[str, Tokenizer]) -> None:
    # BOS rules llama.cpp attaches to the pre-tokenizer name (none of the files says add_bos_token) and the
    # end-of-generation tokens found by text.
    name, tok = vocab
    tokens = tok.tokens
    expected = {
        "llama-bpe": (True, "<|begin_of_text|>", {"<|end_of_text|>", "<|eot_id|>"}),
        "tekken": (True, "<s>", {"</s>"}),
        "gpt-4o": (False, "<|endoftext|>", {"<|endoftext|>", "<|end|>"}),
    }[name]
    assert (tok.add_bos, tokens[tok.bos_id]) == expected[:2]
    assert expected[2] <= {tokens[t] for t in tok.eog_ids}


def test_unknown_pre_tokenizer_fails_at_load_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "unknown-pre.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("no-such-pre")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_types([1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="unsupported BPE pre-tokenizer 'no-such-pre'"):
        Tokenizer.from_gguf(GGUFFile(path))


def test_model_with_an_unknown_pre_tokenizer_fails_to_load_naming_it(tmp_path: Path) -> None:
    # A whole (synthetic) model: the load stops at the vocabulary, before any weight is packed, with one
    # line that names the pre-tokenizer and lists the supported ones.
    path = write_gguf(CASES["qwen3"], tmp_path / "model.gguf", pre="no-such-pre")
    with pytest.raises(UnsupportedModelError) as failure:
        LLM.load(str(path))
    message = str(failure.value)
    assert message.startswith("unsupported BPE pre-tokenizer 'no-such-pre'") and "\n" not in message
    assert all(name in message for name in VOCABS)


# -- the case-splitting regexes equal llama.cpp's way of running them ---------------------------------------
# llama.cpp runs tekken's and gpt-4o's adapted regexes (llama-vocab.cpp) with std::regex on a "collapsed"
# text: ASCII stays, other white space becomes \v, other numbers 0xD1, other letters 0xD2, anything else
# another byte; \p{L} and \p{N} become those bytes plus the ASCII ranges, \s the C locale's six spaces.
# Written out that way here (Python's re with re.ASCII has the same \s), it must split every text as the
# single Unicode regex of engine/text/tokenizer.py does.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA_CPP_REGEXES = {
    "tekken": r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?"
    r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt-4o": rf"[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}])([^a-z]))*((?=[\p{{L}}])([^A-Z]))+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}])([^a-z]))+((?=[\p{{L}}])([^A-Z]))*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_UNICODE_WS = frozenset("\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}


def _collapse(text: str) -> str:
    def one(ch: str) -> str:
        if ord(ch) < 128:
            return ch
        if ch in _UNICODE_WS:
            return "\x0b"
        if regex.match(r"\p{N}", ch):
            return "\xd1"
        return "\xd2" if regex.match(r"\p{L}", ch) else "\xd0"

    return "".join(one(ch) for ch in text)


def _collapsed_regex(expr: str) -> re.Pattern[str]:
    inside = re.sub(r"\[([^\]]*)\]", lambda m: "[" + m.group(1).replace(r"\p{L}", "\xd2A-Za-z") + "]", expr)
    inside = re.sub(r"\[([^\]]*)\]", lambda m: "[" + m.group(1).replace(r"\p{N}", "\xd10-9") + "]", inside)
    outside = inside.replace(r"\p{L}", "[\xd2A-Za-z]").replace(r"\p{N}", "[\xd10-9]")
    return re.compile(outside, re.ASCII)


def _llama_cpp_split(expr: re.Pattern[str], text: str) -> list[str]:
    collapsed = _collapse(text)
    words, end = [], 0
    for m in expr.finditer(collapsed):
        if m.start() > end:
            words.append(text[end : m.start()])  # llama.cpp keeps unmatched stretches as words
        words.append(text[m.start() : m.end()])
        end = m.end()
    return words + ([text[end:]] if end < len(text) else [])


_CASE_ATOMS = [
    "a", "Ab", "ABC", "xY", "é", "É", "e\u0301", "ß", "ǅ", "日本", "Ω", "ж", "Ж", " ", "  ", "\t", "\n",
    "\r\n", "\xa0", "\u3000", "\u2003", "1", "1234", "٣", "½", "'", "'s", "'LL", "'re", "'D", ".", ",!", "/",
    "//", "😀", "\u200d", "\u0301", "\x85", "\x1c", "_", "-",
]  # fmt: skip


@pytest.mark.parametrize("name", ["tekken", "gpt-4o"])
def test_case_splitting_regex_equals_llama_cpp_collapsed_run(name: str) -> None:
    ours = regex.compile(_PRE_TOKENIZERS[name].pattern)
    theirs = _collapsed_regex(_LLAMA_CPP_REGEXES[name])
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(_CASE_ATOMS) for _ in range(rng.randint(1, 14)))
        assert ours.findall(text) == _llama_cpp_split(theirs, text), repr(text)
