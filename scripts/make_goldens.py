"""Golden data from llama.cpp for a model: tokenizer, greedy top-k logprobs, perplexity, chat template.

Run it with the Python of a venv that has llama-cpp-python (built from PyPI, outside the repository;
scripts/llama_cpp_bench.py's docstring shows how), not with Llamba's venv. tests/golden/README.md
gives the command that wrote each file; two sets of cases:

- `--cases code` (Qwen2.5-Coder's `qwen2.5-coder.json`): the base strings plus code, whitespace, CJK
  and Qwen's special tokens; code, fill-in-the-middle and ChatML prompts; log-probabilities in float64;
  `chat[]` is llama-server's rendering (`POST /apply-template`, its Jinja engine and polyfills) of a
  few conversations, one with tools and a tool-call history.
- `--cases base` (`smollm2.json`, `gemma3.json`, first written through llama-server's HTTP API): the
  base strings and six plain prompts, log-probabilities as llama-server's `n_probs` reports them
  (`server_logprobs`); with `--chat`, `chat[]` holds llama-server's greedy chat completions.

What it writes (tests/golden/README.md describes the fields):
- `tokenize[]`: each string three ways (parse_special, plain, with_bos), as llama_tokenize gives them;
- `long_text` (code): the token count and a sha256 of the ids of the GPL-3 text (the perplexity text);
- `greedy[]`: the prompts continued greedily (flash attention on, as llama-server runs by default),
  with the log-probability of each chosen token and the top 5;
- `perplexity`: llama-perplexity's method (chunks of 512, second halves scored, 8 chunks) on GPL-3;
- `chat[]`: only with --llama-server.
The model runs on the CPU with 2 threads. Nothing here imports Llamba.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import heapq
import json
import math
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

GPL3 = Path("/usr/share/common-licenses/GPL-3")

# The tokenizer strings of every model's golden file.
BASE_STRINGS = [
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\n\nmany",
    "numbers 1234567890 and 3.14159 and -42",
    "1 12 123 1234 12345 123456",
    "can't won't I'm you're they've we'll she'd",
    "CamelCaseIdentifiers and snake_case_names",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    "<html><body><h1>Title</h1></body></html>",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "Ünïcödé àccents: café, naïve, résumé, Zürich",
    "日本語のテキストと中文文本",
    "Emoji: 😀🎉🚀 and flags 🇫🇷",
    "Русский текст и ελληνικά",
    "مرحبا بالعالم",
    "a" * 50,
    "!!!???...,,,;;;:::",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.com",
    "    indented code block",
    "\n",
    " ",
    "",
    "The year 2026 was the 21st century's 26th year.",
    "Mixed-case WORDS and ALLCAPS and lowercase",
    "e = mc^2, ∑ x_i, ∫ f(x) dx, α β γ",
    "<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>assistant\n",
    "<think>reasoning here</think>answer",
    "Line one.\r\nLine two.\r\n",
    "What is the capital of France?",
    "Once upon a time, there was a little girl who lived in a village near the forest.",
    "Write a haiku about autumn leaves.",
    "Translate to French: I would like a cup of coffee.",
    "\xa0non-breaking\xa0space",
    "zero\u200bwidth\u200bjoiner",
]
BASE_PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "1, 2, 3, 4, 5,",
    "The best way to learn a new language is",
    "Q: What is 2 + 2?\nA:",
]
# The base strings plus code, whitespace runs, CJK and Qwen's specials.
QWEN_STRINGS = [
    "def add(a, b):\n\treturn a + b\n\n\nclass Foo:\n    pass\n",
    "if (x) {\n        y = 1;\n    }\n\n\n\n",
    "   \n\n   \n  x",
    "a  b   c    d\t\te\n \n",
    "trailing spaces   ",
    "\r\n\r\n\r\nwindows line ends\r\n",
    "IT'S, YOU'RE, WE'LL, THEY'VE, I'D, DON'T",
    "x'sy 'll' 'LL",
    "12345678901234567890 3.14e-10 0x1F 1_000_000",
    "中文代码注释：计算斐波那契数列。日本語：関数を定義する。한국어 텍스트",
    "混合mixed文本text123数字",
    "\u3000全角スペース\u3000と\u2009thin\u2009space",
    "e\u0301 n\u0303 combining marks",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, ✔️ check",
    "नमस्ते दुनिया and সালাম and ไทย",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<|endoftext|><|im_end|><|repo_name|>r<|file_sep|>f.py\n<|fim_pad|>",
    "<tool_response>\n42\n</tool_response>",
    "<|im_start|><|im_start|>nested<|im_end|>",
    'import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # comment\nprint(f"{x.shape=}")\n',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "    // indented comment\n\t\t/* tabs */\n",
    "!!!\n\n???\r\n...",
    "ÀÉÎÕÜ àéîõü ß ẞ ﬁ ﬂ",
]

CODE_PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "// Binary search in a sorted array; returns the index or -1.\n"
    "int binary_search(const int *a, int n, int key) {\n",
    "<|fim_prefix|>def is_prime(n):\n    if n < 2:\n        return False\n"
    "<|fim_suffix|>\n    return True\n<|fim_middle|>",
]
CHAT_PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does `git rebase -i HEAD~3` do?",
    "用一句话解释什么是递归。",
]
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chatml(user: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


def load(model: Path, n_ctx: int, logits_all: bool) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        str(model), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2,
        logits_all=logits_all, flash_attn=True, verbose=False,
    )  # fmt: skip


def tokenize_entries(llm: llama_cpp.Llama, texts: list[str]) -> list[dict[str, Any]]:
    def tok(text: str, add_bos: bool, special: bool) -> list[int]:
        return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    return [
        {
            "text": t,
            "parse_special": tok(t, False, True),
            "plain": tok(t, False, False),
            "with_bos": tok(t, True, True),
        }
        for t in texts
    ]


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    x -= x.max()
    return x - math.log(np.exp(x).sum())


def float64_logprobs(row: np.ndarray, ids: list[int]) -> list[float]:
    """The log-probabilities of `ids`: a softmax over the whole vocabulary in float64."""
    lp = log_softmax(row)
    return [float(lp[i]) for i in ids]


LIBM = ctypes.CDLL("libm.so.6")
LIBM.expf.restype = LIBM.logf.restype = ctypes.c_float
LIBM.expf.argtypes = LIBM.logf.argtypes = [ctypes.c_float]


def server_logprobs(row: np.ndarray, ids: list[int], n_top: int = 5) -> list[float]:
    """The log-probabilities of `ids` as llama-server's `n_probs` reports them, to the bit
    (get_token_probabilities in tools/server/server-common.cpp, then logf): float32 throughout, and
    the softmax's sum taken in the order std::partial_sort leaves the logits in, the top `n_top` sorted
    first, then the rest as libstdc++'s heap select left them (each minimum it pops lands where the
    logit that replaced it was). Up to 2.5e-4 above log_softmax's: the small terms are lost against
    the sum. Each term of the sum is exp in float64 rounded to float32 (glibc's expf, correctly rounded,
    gives the same); the reported values use glibc's expf and logf themselves."""
    x = row.astype(np.float32)
    heap = [float(v) for v in x[:n_top]]
    heapq.heapify(heap)
    rest = x[n_top:].copy()
    for i in np.flatnonzero(rest > heap[0]):  # a superset: heap[0] only grows
        if rest[i] > heap[0]:
            rest[i] = heapq.heapreplace(heap, float(rest[i]))
    order = np.concatenate([np.sort(np.asarray(heap, np.float32))[::-1], rest])
    top = order[0]
    terms = np.exp((order - top).astype(np.float64)).astype(np.float32)
    total = np.cumsum(terms, dtype=np.float32)[-1]
    return [float(LIBM.logf(np.float32(LIBM.expf(np.float32(x[i] - top)) / total))) for i in ids]


def greedy_case(
    llm: llama_cpp.Llama,
    prompt: str,
    n_predict: int,
    logprobs: Callable[[np.ndarray, list[int]], list[float]] = float64_logprobs,
) -> dict[str, Any]:
    """Greedy decode one token at a time (llama-server's way), recording each step's top 5 (ranked by
    logit, as both ways of computing log-probabilities rank them)."""
    llm.reset()
    prompt_tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    llm.eval(prompt_tokens)
    tokens, logprob, top = [], [], []
    for _ in range(n_predict):
        row = llm.scores[llm.n_tokens - 1]
        best = [int(i) for i in np.argsort(-row.astype(np.float64), kind="stable")[:5]]
        values = logprobs(row, best)
        token = best[0]
        tokens.append(token)
        logprob.append(values[0])
        top.append([{"id": i, "logprob": v} for i, v in zip(best, values, strict=True)])
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            break
        llm.eval([token])
    content = llm.detokenize(tokens).decode("utf-8", errors="replace")
    return {
        "prompt": prompt,
        "prompt_tokens": prompt_tokens,
        "tokens": tokens,
        "content": content,
        "logprob": logprob,
        "top_logprobs": top,
    }


def perplexity(llm: llama_cpp.Llama, tokens: list[int], n_ctx: int, n_chunks: int) -> dict[str, Any]:
    """llama-perplexity's estimate: each chunk from an empty cache, BOS first when the model adds it,
    rows n_ctx/2 .. n_ctx-2 scored against the next token."""
    first, nll = n_ctx // 2, []
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        if add_bos:
            chunk = [llm.token_bos(), *chunk[1:]]
        llm.reset()
        llm.eval(chunk)
        for i in range(first, n_ctx - 1):
            nll.append(-log_softmax(llm.scores[i])[chunk[i + 1]])
    values = np.asarray(nll)
    ppl = math.exp(values.mean())
    stderr = ppl * values.std(ddof=1) / math.sqrt(len(values))
    return {"text": "GPL-3", "n_ctx": n_ctx, "chunks": n_chunks, "ppl": ppl, "stderr": stderr}


def long_text(llm: llama_cpp.Llama) -> tuple[list[int], dict[str, Any]]:
    ids = llm.tokenize(GPL3.read_bytes(), add_bos=True, special=False)
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    return ids, {
        "text": "GPL-3",
        "add_special": True,
        "parse_special": False,
        "count": len(ids),
        "sha256": digest,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--cases", choices=["code", "base"], default="code", help="which strings and prompts")
    p.add_argument("--name", help="the file's `model` field (default: the model file's name)")
    p.add_argument("--llama-server", type=Path, default=None, help="llama-server binary for the chat section")
    p.add_argument("--chat", action="store_true", help="base cases: llama-server's greedy chat replies too")
    p.add_argument("-n", "--n-predict", type=int, default=32)
    p.add_argument("--chat-only", action="store_true", help="only (re)write the chat section of --out")
    args = p.parse_args()
    if args.chat_only:
        golden = json.loads(args.out.read_text())
        chat = chat_replies if args.cases == "base" else chat_cases
        golden["chat"] = chat(args.llama_server, args.model)
    else:
        golden = (base_golden if args.cases == "base" else code_golden)(args)
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    if "perplexity" in golden:
        print(f"wrote {args.out}: perplexity {golden['perplexity']['ppl']:.4f}")


def code_golden(args: argparse.Namespace) -> dict[str, Any]:
    llm = load(args.model, 1024, logits_all=True)
    gpl3_ids, long = long_text(llm)
    golden: dict[str, Any] = {
        "model": args.name or args.model.name,
        "source": f"llama.cpp 0c1e570 (llama-cpp-python {llama_cpp.__version__}), CPU, 2 threads, flash attn",
        "tokenize": tokenize_entries(llm, BASE_STRINGS + QWEN_STRINGS),
        "long_text": long,
    }
    prompts = CODE_PROMPTS + [chatml(u) for u in CHAT_PROMPTS]
    golden["greedy"] = [greedy_case(llm, prompt, args.n_predict) for prompt in prompts]
    del llm
    golden["perplexity"] = perplexity(load(args.model, 512, logits_all=True), gpl3_ids, 512, 8)
    if args.llama_server is not None:
        golden["chat"] = chat_cases(args.llama_server, args.model)
    return golden


def base_golden(args: argparse.Namespace) -> dict[str, Any]:
    """SmolLM2's and Gemma 3's files: the base strings and prompts, llama-server's log-probabilities,
    and (`--chat`) llama-server's greedy chat replies; the perplexity reference last."""
    llm = load(args.model, 1024, logits_all=True)
    golden: dict[str, Any] = {
        "model": args.name or args.model.name,
        "source": (
            f"llama.cpp 0c1e570 (llama-cpp-python {llama_cpp.__version__}"
            f"{'; chat: its llama-server' if args.chat else ''}), CPU, 2 threads, flash attn, "
            "log-probabilities as llama-server's n_probs"
        ),
        "tokenize": tokenize_entries(llm, BASE_STRINGS),
    }
    order = ["prompt", "prompt_tokens", "tokens", "content", "top_logprobs", "logprob"]  # the first files'
    cases = [greedy_case(llm, prompt, args.n_predict, server_logprobs) for prompt in BASE_PROMPTS]
    golden["greedy"] = [{key: case[key] for key in order} for case in cases]
    gpl3_ids = long_text(llm)[0]
    del llm
    if args.chat:
        golden["chat"] = chat_replies(args.llama_server, args.model)
    golden["perplexity"] = perplexity(load(args.model, 512, logits_all=True), gpl3_ids, 512, 8)
    return golden


# -- llama-server's template rendering --------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TOOL_HISTORY = [
    {"role": "system", "content": "You answer with tools when they help."},
    {"role": "user", "content": "Weather in Paris and in Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "東京"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 24}'},
    {"role": "assistant", "content": "Paris 18°C, Tokyo 24°C."},
    {"role": "user", "content": "Thanks!"},
]  # fmt: skip
CHAT_CASES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]},
    {"messages": TOOL_HISTORY, "tools": [WEATHER_TOOL]},
    {"messages": TOOL_HISTORY[1:4]},
]  # fmt: skip


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@contextlib.contextmanager
def llama_server(server: Path, *args: str, port: int = 18765) -> Iterator[int]:
    """llama-server on `port` with `args` (2 threads), healthy; its port."""
    cmd = [str(server), "--port", str(port), "-t", "2", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def chat_cases(server: Path, model: Path) -> list[dict[str, Any]]:
    with llama_server(server, "-m", str(model), "-c", "2048", "--jinja") as port:
        return [{**case, "prompt": post(port, "/apply-template", case)["prompt"]} for case in CHAT_CASES]


# SmolLM2's chat cases: its own template, answered greedily by llama-server (24 tokens at most).
BASE_CHAT_CASES: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
]  # fmt: skip


def chat_replies(server: Path, model: Path) -> list[dict[str, Any]]:
    """Each case's rendering and llama-server's greedy reply, asked in turn of one server with its
    default slots (`usage.prompt_tokens_details.cached_tokens` is what its slots held: not compared)."""
    cases = []
    with llama_server(server, "-m", str(model), "--jinja") as port:
        for messages in BASE_CHAT_CASES:
            prompt = post(port, "/apply-template", {"messages": messages})["prompt"]
            body = {"messages": messages, "temperature": 0, "max_tokens": 24}
            reply = post(port, "/v1/chat/completions", body)
            content = reply["choices"][0]["message"]["content"]
            cases.append(
                {"messages": messages, "prompt": prompt, "greedy_reply": content, "usage": reply["usage"]}
            )
    return cases


if __name__ == "__main__":
    main()
