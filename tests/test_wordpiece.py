"""WordPiece (`bert` vocabularies) against llama.cpp: its own test strings for bge's vocabulary
(models/ggml-vocab-bert-bge.gguf with .inp/.out from the reference cache, llama.cpp 0c1e570), the
special tokens an input gets, and the normaliser's rules one by one. The 100 mixed sentences on the two
real encoders' vocabularies are in tests/test_encoders.py."""

from __future__ import annotations

import pytest

from engine.gguf import GGUFFile
from engine.reference_data import ReferenceDataError, reference_file
from engine.text.tokenizer import Tokenizer
from engine.text.wordpiece import split_words
from tests.conftest import require

# tests/conftest.py EVERY_LEVEL: nothing here reads tests/golden, and no kernel runs.
CLS, SEP, UNK = 101, 102, 100


def reference(name: str) -> str:
    try:
        return str(reference_file(f"models/{name}"))
    except ReferenceDataError as exc:
        require(f"llama.cpp's reference files could not be fetched: {exc}")
        raise  # (not reached)


@pytest.fixture(scope="module")
def bge() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(reference("ggml-vocab-bert-bge.gguf")))


def test_llama_cpps_own_cases(bge: Tokenizer) -> None:
    """test-tokenizer-0's strings and ids: no special tokens added, none parsed."""
    with open(reference("ggml-vocab-bert-bge.gguf.inp"), encoding="utf-8") as f:
        inputs = f.read().split("\n__ggml_vocab_test__\n")
    with open(reference("ggml-vocab-bert-bge.gguf.out"), encoding="utf-8") as f:
        outputs = f.read().split("\n")
    assert len(inputs) == 47
    for text, ids in zip(inputs, outputs, strict=False):
        assert bge.encode(text, False, False) == [int(t) for t in ids.split()], text


def test_an_input_gets_cls_and_sep(bge: Tokenizer) -> None:
    assert bge.encode("Hello world", True, True) == [CLS, 7592, 2088, SEP]
    assert bge.encode("", True, True) == [CLS, SEP]
    # special tokens in the text are parsed (llama-server's tokenize_input_subprompt), unless told not to
    assert bge.encode("a [SEP] b", True, True) == [CLS, 1037, SEP, 1038, SEP]
    assert SEP not in bge.encode("a [SEP] b", False, False)
    assert bge.sep_id == SEP and bge.add_bos and bge.add_sep and not bge.add_eos


def test_the_normaliser() -> None:
    assert split_words("Héllo,  WORLD!") == ["hello", ",", "world", "!"]
    assert split_words("東京は") == ["東", "京", "は"]  # CJK ideographs alone, kana joined
    assert split_words("a\u200bb\x00c\ufffd") == ["abc"]  # format and control characters vanish
    assert split_words("x\u0301y") == ["xy"]  # combining marks too, when accents are stripped
    assert split_words("Héllo", lowercase=False, strip_accents=False) == ["Héllo"]
    assert split_words("$5 + €6") == ["$", "5", "+", "€6"]  # ASCII symbols alone, others not
    assert split_words("İ") == ["i"]  # the simple lower-case mapping, one code point


def test_a_word_without_pieces_is_one_unknown(bge: Tokenizer) -> None:
    assert bge.encode("hello \U0001f680\U0001f680 world", False, False) == [7592, UNK, 2088]


def test_decoding_cleans_spaces_up(bge: Tokenizer) -> None:
    ids = bge.encode("Hello, world! It's me.", True, True)
    assert bge.decode(ids) == "[CLS] hello, world! it's me.[SEP]"
    assert bge.decode(ids[1:-1], render_special=False) == " hello, world! it's me."
