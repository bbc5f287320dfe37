"""llama.cpp's tokenizations on its Qwen3.5 (`qwen35`) and Gemma 4 (`gemma4`) vocabularies.

Run with a Python that has llama-cpp-python 0.3.36 (its vendored llama.cpp, 0c1e570, is the reference), not
Llamba's venv, from the repository root:

    /tmp/llcpp-avx2/bin/python scripts/make_vocab_2026_goldens.py --models LLAMA_CPP/models \\
        -o tests/golden/vocab_2026.json

LLAMA_CPP is llama.cpp's tree (the sdist's `vendor/llama.cpp`); its `models/ggml-vocab-qwen35.gguf` and
`models/ggml-vocab-gemma-4.gguf` are the vocabularies, their `.inp` files llama.cpp's own test strings. To
those come make_pretok_goldens.py's extra strings and seeded mixes, strings for what these two vocabularies
do differently (combining marks in Qwen3.5's letter runs; Gemma 4's escaped spaces, newline runs and byte
fallback), each vocabulary's chat markup, and GPL-3's text (/usr/share/common-licenses/GPL-3, ids only).
Per string, llama_tokenize's ids three ways (`plain`: no BOS, special-token text as text;
`parse_special`; `with_bos`: the vocabulary's BOS rule, special tokens parsed) and `detok`:
llama_detokenize of `with_bos` (special tokens rendered, none removed). Per vocabulary also its BOS, EOS,
add-BOS flag, end-of-generation ids and the ids of every token whose attribute is not NORMAL.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import llama_cpp
from make_pretok_goldens import EXTRA, FUZZ_ATOMS, detokenize

GPL3 = Path("/usr/share/common-licenses/GPL-3")
VOCABS = {"qwen35": "ggml-vocab-qwen35.gguf", "gemma-4": "ggml-vocab-gemma-4.gguf"}
MORE = [
    # combining marks after letters, alone, after spaces and punctuation (Qwen3.5 keeps them in words)
    "हिन्दी भाषा ไทย ภาษา e\u0301 \u0301abc a\u0301\u0302b  \u0301x .\u0301 '\u0301s ﻿\u0301",
    "Zalgo: Z\u0335\u0321a\u0334l\u0336g\u0337o\u0338 t\u0300\u0301\u0302ext ǆ ῼ ᾯ",
    # escaped spaces, newline runs and tabs (Gemma 4 splits only at newlines)
    "  leading\n \n\n  \n\n\ntrailing  \t\t\n\t \u2581 literal\u2581mark",
    '<div class="a"> </div>\n<p> <b>bold</b> </p> a> </b',
    "\x00\x01\x7f \ue000\U000f0000 \U0001fae8 \U0001f9ff \u2028 <0x41> <unused0> [multimodal]",
    "x" * 300 + " " + "ab " * 100,
]
SPECIALS = {
    "qwen35": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|><|endoftext|>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    ],
    "gemma-4": [
        "<bos><|turn>system\n<|think|>You are helpful.<turn|>\n<|turn>user\nHi!<turn|>\n<|turn>model\n"
        "<|channel>thought\nHmm.<channel|>Hello<turn|><eos>",
        '<|tool>declaration:f{description:<|"|>d<|"|>}<tool|><|tool_call>call:f{a:<|"|>x<|"|>}<tool_call|>'
        "<|tool_response>response:f{r:1}<tool_response|><|image|><|audio|><|video|><pad><mask></s>",
    ],
}
MORE_ATOMS = ["\u0301", "\u093f", "\u0e31", "\u2581", "\n\n", " \n", "<", "</", "> </", "\t\t", "\U0001f9ff"]


def fuzz_strings(seed: int, count: int) -> list[str]:
    atoms = [*FUZZ_ATOMS, *MORE_ATOMS]
    rng = random.Random(seed)
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 16))) for _ in range(count)]


def vocab_entry(path: Path, strings: list[str], specials: list[str]) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    rows = []
    for text in [*strings, *specials]:
        data = text.encode("utf-8")
        with_bos = llm.tokenize(data, add_bos=True, special=True)
        rows.append(
            {
                "text": text,
                "plain": llm.tokenize(data, add_bos=False, special=False),
                "parse_special": llm.tokenize(data, add_bos=False, special=True),
                "with_bos": with_bos,
                "detok": detokenize(llm, with_bos),
            }
        )
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    attrs: dict[str, list[int]] = {}
    for tid in range(n_vocab):
        attr = int(llama_cpp.llama_vocab_get_attr(vocab, tid))
        if attr != llama_cpp.LLAMA_TOKEN_ATTR_NORMAL:
            attrs.setdefault(str(attr), []).append(tid)
    return {
        "file": f"models/{path.name}",
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "attrs": attrs,
        "gpl3_with_bos": llm.tokenize(GPL3.read_bytes(), add_bos=True, special=True),
        "tokenize": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="llama.cpp's models/ folder")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    vocabs = {}
    for name, filename in VOCABS.items():
        path = args.models / filename
        inp = path.with_name(filename + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
        strings = [*inp[:-1], *EXTRA, *MORE, *fuzz_strings(seed=26, count=300)]
        vocabs[name] = vocab_entry(path, strings, SPECIALS[name])
    golden = {
        "source": f"llama.cpp 0c1e570 via llama-cpp-python {llama_cpp.__version__} (vocab_only), "
        "scripts/make_vocab_2026_goldens.py",
        "vocabs": vocabs,
    }
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
