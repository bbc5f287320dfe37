"""llama.cpp's tokenizations of the pre-tokenizer test strings on the vocabularies in tests/data/vocab/.

Run with a Python that has llama-cpp-python (its vendored llama.cpp is the reference), not Llamba's venv:

    /work/llcpp-venv/bin/python scripts/make_pretok_goldens.py --inp PATH/ggml-vocab-llama-bpe.gguf.inp \\
        -o tests/golden/pretokenizers.json

`--inp` is llama.cpp's own test-string file (models/ggml-vocab-*.gguf.inp: code, CJK, Khmer, emoji,
whitespace runs, digit runs, contractions). To it are added strings for the case-splitting pre-tokenizers
(camelCase, capitals, combining marks, slashes), each vocabulary's special tokens, and seeded random mixes
of the same kinds of pieces. Each vocabulary's entry gives, per string, llama_tokenize's ids three ways
(`plain`: no BOS, special-token text as text; `parse_special`; `with_bos`: the vocabulary's BOS rule and
special tokens parsed) and `detok`: llama_detokenize of `with_bos` (special tokens rendered, none removed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import lzma
import random
import tempfile
from pathlib import Path

import llama_cpp

VOCAB_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "vocab"
VOCABS = ("llama-bpe", "tekken", "gpt-4o")
EXTRA = [
    "HTTPServer parseJSONString getHTTPResponseCode XMLHttpRequest iPhone McDonald's",
    "ALL CAPS DON'T WON'T I'M HE'S we'Re THEY'LL you'D",
    "e\u0301cole cafe\u0301 n\u0303 Ãbc ÉCOLE école École ÀÉÎÕÜ àéîõü ǅungla ǈ Ǆ",
    "path/to//file.txt\n// comment\n/* block */\nhttps://example.com/a/b?c=d&e=f",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\r\n",
    "日本語のテキスト、中文文本。한국어 텍스트 Ελληνικά Ωμέγα ΑΒΓ αβγ Русский ТЕКСТ",
    "١٢٣ ٤٥٦٧ ½ ¾ ² ³ Ⅻ 12345678901234567890 3.14159 -42 1e10 0x1F",
    "tabs\t\tand\u00a0nbsp\u2003em\u3000ideographic \u2028line \u0085nel  \n\n  end  ",
    "emoji 😀🎉🚀🇫🇷👨‍👩‍👧 ❤️ ✨ mixed😀text",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ''' x'y",
    "a\u200bb\u200cc\u200dd\ufeffe \u0301 \u20dd",
    # Llama 3 tokens its merges do not rebuild (llama.cpp's ignore_merges takes the word whole).
    " việc hợp nhiều điều jeho mektedir Việt ngoài nhiên lardan biệt",
]
SPECIALS = {
    "llama-bpe": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"],
    "tekken": ['<s>[INST] Hello [/INST] Hi!</s>[TOOL_CALLS][{"name": "f"}]</s>'],
    "gpt-4o": ["<|system|>You are helpful.<|end|><|user|>Hi!<|end|><|assistant|>"],
}
FUZZ_ATOMS = [
    "a", "Ab", "ABC", "xY", "é", "É", "e\u0301", "ß", "日本", "한", "Ω", "ж", " ", "  ", "   ", "\t", "\n",
    "\r\n", "\xa0", "\u3000", "1", "42", "1234", "٣", "½", "'", "'s", "'LL", "'re", ".", ",!", "-", "/", "//",
    "_", "😀", "🦙", "\u200d", "\u0301", "<", ">", "{", "}", "()", "$", "\\", "#",
]  # fmt: skip


def fuzz_strings(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FUZZ_ATOMS) for _ in range(rng.randint(1, 16))) for _ in range(count)]


def detokenize(llm: llama_cpp.Llama, ids: list[int]) -> str:
    vocab = llm._model.vocab
    array = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 32 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, array, len(ids), buf, size, False, True)
    if n < 0:
        raise RuntimeError("detokenize buffer too small")
    return buf.raw[:n].decode("utf-8", errors="replace")


def vocab_entry(name: str, strings: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.gguf"
        path.write_bytes(lzma.decompress((VOCAB_DIR / f"{name}.gguf.xz").read_bytes()))
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        rows = []
        for text in [*strings, *SPECIALS[name]]:
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
        return {"file": f"tests/data/vocab/{name}.gguf.xz", "tokenize": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inp", type=Path, required=True, help="llama.cpp's ggml-vocab-llama-bpe.gguf.inp")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    inp = args.inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    strings = [*inp, *EXTRA, *fuzz_strings(seed=22, count=300)]
    golden = {
        "source": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (vocab_only)",
        "vocabs": {name: vocab_entry(name, strings) for name in VOCABS},
    }
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
