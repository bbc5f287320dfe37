"""Golden data from llama.cpp for a model: tokenizer, greedy top-k logprobs, perplexity, chat template.

Run it with the Python of a venv that has llama-cpp-python (built from PyPI, outside the repository;
scripts/llama_cpp_bench.py's docstring shows how), not with Llamba's venv:

    /work/llcpp-venv/bin/python scripts/make_goldens.py -m ~/.cache/llamba/models/X.gguf \\
        --llama-server /work/llcpp-build/server-build/bin/llama-server -o tests/golden/qwen2.5-coder.json

What it writes (tests/golden/README.md describes the fields):
- `tokenize[]`: each string three ways (parse_special, plain, with_bos), as llama_tokenize gives them;
- `long_text`: the token count and a sha256 of the ids of the GPL-3 text (the perplexity text);
- `greedy[]`: code, fill-in-the-middle and chat prompts continued greedily (flash attention on, as
  llama-server runs by default), with the log-probability of each chosen token and the top 5;
- `perplexity`: llama-perplexity's method (chunks of 512, second halves scored, 8 chunks) on GPL-3;
- `chat[]`: llama-server's own rendering (`POST /apply-template`, its Jinja engine and polyfills) of
  a few conversations, one with tools and a tool-call history; only with --llama-server.
The model runs on the CPU with 2 threads. Nothing here imports Llamba.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

GPL3 = Path("/usr/share/common-licenses/GPL-3")
ROOT = Path(__file__).resolve().parents[1]

# The tokenizer strings of the existing goldens, plus code, whitespace runs, CJK and Qwen's specials.
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


def greedy_case(llm: llama_cpp.Llama, prompt: str, n_predict: int) -> dict[str, Any]:
    """Greedy decode one token at a time (llama-server's way), recording each step's top 5."""
    llm.reset()
    prompt_tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    llm.eval(prompt_tokens)
    tokens, logprob, top = [], [], []
    for _ in range(n_predict):
        lp = log_softmax(llm.scores[llm.n_tokens - 1])
        best = np.argsort(-lp, kind="stable")[:5]
        token = int(best[0])
        tokens.append(token)
        logprob.append(float(lp[token]))
        top.append([{"id": int(i), "logprob": float(lp[i])} for i in best])
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
    p.add_argument("--llama-server", type=Path, default=None, help="llama-server binary for the chat section")
    p.add_argument("-n", "--n-predict", type=int, default=32)
    p.add_argument("--chat-only", action="store_true", help="only (re)write the chat section of --out")
    args = p.parse_args()
    if args.chat_only:
        golden = json.loads(args.out.read_text())
        golden["chat"] = chat_cases(args.llama_server, args.model)
        args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
        return
    base = json.loads((ROOT / "tests" / "golden" / "smollm2.json").read_text())
    texts = [e["text"] for e in base["tokenize"]] + QWEN_STRINGS
    llm = load(args.model, 1024, logits_all=True)
    gpl3_ids, long = long_text(llm)
    golden: dict[str, Any] = {
        "model": args.model.name,
        "source": f"llama.cpp 0c1e570 (llama-cpp-python {llama_cpp.__version__}), CPU, 2 threads, flash attn",
        "tokenize": tokenize_entries(llm, texts),
        "long_text": long,
    }
    prompts = CODE_PROMPTS + [chatml(u) for u in CHAT_PROMPTS]
    golden["greedy"] = [greedy_case(llm, prompt, args.n_predict) for prompt in prompts]
    del llm
    golden["perplexity"] = perplexity(load(args.model, 512, logits_all=True), gpl3_ids, 512, 8)
    if args.llama_server is not None:
        golden["chat"] = chat_cases(args.llama_server, args.model)
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {args.out}: perplexity {golden['perplexity']['ppl']:.4f}")


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


def chat_cases(server: Path, model: Path, port: int = 18765) -> list[dict[str, Any]]:
    cmd = [str(server), "-m", str(model), "--port", str(port), "-t", "2", "-c", "2048", "--jinja"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        return [{**case, "prompt": post(port, "/apply-template", case)["prompt"]} for case in CHAT_CASES]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
