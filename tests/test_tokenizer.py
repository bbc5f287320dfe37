"""Tokenizers against llama.cpp's own output (golden data) on the two real models, plus the invariants
the fast paths rely on (folded pre-tokenizer regex, SPM segment cache) checked against direct versions."""

from __future__ import annotations

import random

import pytest
import regex

from engine.gguf import GGUFFile
from engine.text.tokenizer import (
    _GPT2_PATTERN,
    SPM_SPACE,
    IncrementalDecoder,
    Tokenizer,
    _BpeModel,
    _SpmModel,
)
from tests.conftest import gpl3_text, load_golden

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "tokenizers are Python: no kernel runs"

MODELS = ("smollm2", "gemma3")
# Rare characters (hieroglyph, Gothic, alchemical) fall back to byte tokens in Gemma's vocabulary too.
MULTIBYTE_TEXT = "Emoji 😀🎉🚀🇫🇷, CJK 日本語のテキストと中文文本, café naïve, Ελληνικά ∑∫ ☃ 𓀀𐌰🜁ꙮ"


@pytest.fixture(scope="module")
def smollm2_tok(smollm2_gguf: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def gemma3_tok(gemma3_gguf: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(gemma3_gguf)


@pytest.fixture(params=MODELS)
def model_tok(request: pytest.FixtureRequest) -> tuple[str, Tokenizer]:
    return request.param, request.getfixturevalue(f"{request.param}_tok")


# -- golden data from llama.cpp ---------------------------------------------------------------------------

VARIANTS = {"parse_special": (False, True), "plain": (False, False), "with_bos": (True, True)}


def test_golden_tokenize(model_tok: tuple[str, Tokenizer]) -> None:
    name, tok = model_tok
    entries = load_golden(name)["tokenize"]
    assert entries
    mismatches = []
    for entry in entries:
        for variant, (add_special, parse_special) in VARIANTS.items():
            got = tok.encode(entry["text"], add_special=add_special, parse_special=parse_special)
            if got != entry[variant]:
                mismatches.append((entry["text"], variant, got, entry[variant]))
    assert not mismatches


def test_golden_round_trip(model_tok: tuple[str, Tokenizer]) -> None:
    # Every golden string survives encode -> decode on both models (no normalization happens in either
    # algorithm, and byte fallback covers every character).
    name, tok = model_tok
    for entry in load_golden(name)["tokenize"]:
        text = entry["text"]
        assert tok.decode(tok.encode(text, add_special=False)) == text
        assert tok.decode(entry["parse_special"]) == text
        # Special-token texts tokenized as plain text come back even when specials are not rendered.
        assert tok.decode(entry["plain"], render_special=False) == text
        bos = [tok.bos_id] if tok.add_bos else []
        assert entry["with_bos"][: len(bos)] == bos
        assert tok.decode(entry["with_bos"][len(bos) :]) == text


def test_golden_chat_prompt_lengths(smollm2_tok: Tokenizer) -> None:
    chats = load_golden("smollm2")["chat"]
    assert chats
    for chat in chats:
        ids = smollm2_tok.encode(chat["prompt"], add_special=True, parse_special=True)
        assert len(ids) == chat["usage"]["prompt_tokens"]
        assert ids[0] == 1  # <|im_start|>, parsed as a special token


# -- special tokens and pieces ----------------------------------------------------------------------------


def test_smollm2_special_tokens(smollm2_tok: Tokenizer) -> None:
    tok = smollm2_tok
    assert (tok.n_vocab, tok.bos_id, tok.eos_id, tok.add_bos) == (49152, 1, 2, False)
    # <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp takes it for the FIM repo token, an EOG).
    assert tok.eog_ids == {0, 2, 4}
    assert tok.is_control(1) and not tok.is_control(tok.encode("Hello")[0])
    assert tok.encode("<|im_start|>user<|im_end|>", add_special=True) == [1, 4093, 2]
    assert 1 not in tok.encode("<|im_start|>", parse_special=False)
    assert tok.token_to_piece(1) == b"<|im_start|>"
    assert tok.token_to_piece(1, render_special=False) == b""
    assert tok.token_to_piece(tok.tokens.index("Ġworld")) == b" world"


def test_gemma3_special_tokens(gemma3_tok: Tokenizer) -> None:
    tok = gemma3_tok
    assert (tok.n_vocab, tok.bos_id, tok.eos_id, tok.add_bos) == (262144, 2, 1, True)
    # <eos>, <end_of_turn>, and "</s>" (an HTML tag in Gemma's vocabulary that llama.cpp's text rules
    # also take for an end-of-generation token).
    assert tok.eog_ids == {1, 106, 212}
    assert tok.encode("") == [2] and tok.encode("", add_special=False) == []
    turn = tok.encode("<start_of_turn>user\n", add_special=False)
    assert turn[0] == 105 and turn[-1] == 107
    # USER_DEFINED tokens ("\n", runs of spaces, HTML tags) are cut out even without parse_special.
    assert tok.encode("a\n\nb", add_special=False, parse_special=False)[1] == 108
    assert 105 not in tok.encode("<start_of_turn>", parse_special=False)
    assert tok.token_to_piece(105) == b"<start_of_turn>"
    assert tok.token_to_piece(105, render_special=False) == b""
    assert tok.token_to_piece(107, render_special=False) == b"\n"
    assert tok.token_to_piece(tok.tokens.index("<0x41>")) == b"A"
    assert tok.token_to_piece(tok.tokens.index(SPM_SPACE + "Hello")) == b" Hello"


def test_out_of_range_tokens(smollm2_tok: Tokenizer) -> None:
    with pytest.raises(ValueError):
        smollm2_tok.decode([5, smollm2_tok.n_vocab])
    with pytest.raises(ValueError):
        smollm2_tok.token_to_piece(-1)


def test_lone_surrogates_do_not_crash(model_tok: tuple[str, Tokenizer]) -> None:
    _, tok = model_tok
    assert tok.decode(tok.encode("a\ud800b", add_special=False)) == "a\ufffdb"


# -- incremental decoding ---------------------------------------------------------------------------------


def test_incremental_decoder_holds_back_split_characters(model_tok: tuple[str, Tokenizer]) -> None:
    _, tok = model_tok
    ids = tok.encode(MULTIBYTE_TEXT, add_special=False)
    # The text must really split characters across tokens, or the test proves nothing.
    assert any(_is_partial_utf8(tok.token_to_piece(t)) for t in ids)
    decoder = IncrementalDecoder(tok)
    chunks = [decoder.push(t) for t in ids]
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert "".join(chunks) + decoder.flush() == tok.decode(ids) == MULTIBYTE_TEXT


def test_incremental_decoder_render_special(smollm2_tok: Tokenizer) -> None:
    ids = smollm2_tok.encode("<|im_start|>user\nHi<|im_end|>")
    plain, rendered = IncrementalDecoder(smollm2_tok), IncrementalDecoder(smollm2_tok, render_special=True)
    assert "".join(plain.push(t) for t in ids) == "user\nHi"
    assert "".join(rendered.push(t) for t in ids) == "<|im_start|>user\nHi<|im_end|>"


def test_incremental_decoder_flushes_incomplete_character(gemma3_tok: Tokenizer) -> None:
    decoder = IncrementalDecoder(gemma3_tok)
    assert decoder.push(gemma3_tok.tokens.index("<0xF0>")) == ""
    assert decoder.push(gemma3_tok.tokens.index("<0x9F>")) == ""
    assert decoder.flush() == "\ufffd"


def _is_partial_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# -- the fast paths equal the direct algorithms -----------------------------------------------------------

_FUZZ_ATOMS = [
    "a", "Zq", "é", "日本", " ", "  ", "   ", "\t", "\n", "\r\n", "\xa0", "1", "42", "٣", "½", "'", "'s",
    "'ll", "'re", ".", ",!", "-", "_", "😀", "\u200b", "\u0301", "<", ">", "/", "</", "> </", "\u3000",
]  # fmt: skip


def _fuzz_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_FUZZ_ATOMS) for _ in range(rng.randint(1, 14))) for _ in range(count)]


_WS = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)
_LETTER = regex.compile(r"\p{L}")
_NUMBER = regex.compile(r"\p{N}")


def _smollm_reference_split(text: str) -> list[str]:
    """llama.cpp's two stages written out directly: `\\p{N}` splits the text into digits and the runs
    between them, then its hand-written gpt2 matcher runs inside each run."""
    words = []
    for run in regex.split(r"(\p{N})", text):
        if run:
            words.extend(_gpt2_matcher(run))
    return words


def _gpt2_matcher(s: str) -> list[str]:
    def letter(i: int) -> bool:
        return i < len(s) and bool(_LETTER.match(s[i]))

    def number(i: int) -> bool:
        return i < len(s) and bool(_NUMBER.match(s[i]))

    def space(i: int) -> bool:
        return i < len(s) and s[i] in _WS

    def other(i: int) -> bool:
        return i < len(s) and not (letter(i) or number(i) or space(i))

    out, pos = [], 0
    while pos < len(s):
        start = pos
        if s[pos] == "'" and pos + 1 < len(s) and s[pos + 1] in "stmd":
            pos += 2
        elif s[pos] == "'" and s[pos + 1 : pos + 3] in ("re", "ve", "ll"):
            pos += 3
        else:
            head = pos + 1 if s[pos] == " " else pos
            kind = next((f for f in (letter, number, other) if f(head)), None)
            if kind is not None:
                pos = head
                while kind(pos):
                    pos += 1
            else:
                n = 0
                while space(pos + n):
                    n += 1
                pos += n - 1 if n > 1 and pos + n < len(s) else max(n, 1)
        out.append(s[start:pos])
    return out


def test_smollm_pre_tokenizer_equals_two_stage_split(smollm2_tok: Tokenizer) -> None:
    pre = smollm2_tok._model._pre  # the single folded regex
    for text in _fuzz_texts(seed=1, count=3000):
        assert pre.findall(text) == _smollm_reference_split(text), repr(text)


def test_gpt2_pre_tokenizer_equals_llama_matcher() -> None:
    pre = regex.compile(_GPT2_PATTERN)
    for text in _fuzz_texts(seed=3, count=3000):
        assert pre.findall(text) == _gpt2_matcher(text), repr(text)


def _naive_bpe(ranks: dict[tuple[str, str], int], syms: list[str]) -> list[str]:
    """Merge the lowest-ranked adjacent pair, leftmost first, rescanning every time."""
    while True:
        pairs = [(ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(syms, syms[1:], strict=False))]
        ranked = [(r, i) for r, i in pairs if r is not None]
        if not ranked:
            return syms
        _, i = min(ranked)
        syms[i : i + 2] = [syms[i] + syms[i + 1]]


def test_bpe_merge_equals_naive(smollm2_tok: Tokenizer) -> None:
    model = smollm2_tok._model
    assert isinstance(model, _BpeModel)
    rng = random.Random(4)
    alphabet = "abcdeilnorstĠ"
    for _ in range(2000):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
        assert model._merge(list(word)) == _naive_bpe(model._ranks, list(word)), word


def test_spm_segmentation_equals_whole_text(gemma3_tok: Tokenizer) -> None:
    model = gemma3_tok._model
    assert isinstance(model, _SpmModel)
    for text in _fuzz_texts(seed=2, count=1500):
        segmented: list[int] = []
        model.encode(text, segmented)
        assert segmented == list(model._encode_segment(text.replace(" ", SPM_SPACE))), repr(text)


# -- long texts -------------------------------------------------------------------------------------------
# How fast the tokenizers build and encode is measured by scripts/bench_text.py, not asserted here.


def test_a_fresh_tokenizer_encodes_like_a_warm_one(
    model_tok: tuple[str, Tokenizer], request: pytest.FixtureRequest
) -> None:
    """The caches the fast paths fill (BPE words, SPM segments) change no result: a tokenizer built just
    now (cold caches) and the module's (warm from every other test) agree on a long text, both ways."""
    name, warm = model_tok
    text = gpl3_text()
    cold = Tokenizer.from_gguf(request.getfixturevalue(f"{name}_gguf"))
    ids = cold.encode(text)
    assert len(ids) > 5000
    assert warm.encode(text) == ids
    assert cold.decode(ids[1:] if cold.add_bos else ids) == text
    prompt = text[: len(text) * 2000 // len(ids)]  # about 2,000 tokens, a typical long prompt
    assert 1800 < len(warm.encode(prompt)) < 2200
