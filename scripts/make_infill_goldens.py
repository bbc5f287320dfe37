"""llama-server's greedy /infill answers on Qwen2.5-Coder, the reference tests/test_infill_server.py
compares against. Nothing here imports Llamba; it needs only a llama-server binary:

    python scripts/make_infill_goldens.py --llama-server /work/llcpp-build/server-build/bin/llama-server \\
        -m ~/.cache/llamba/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -o tests/golden/infill.json

The server runs with one slot of 4096 tokens and its default batch (2048), as the test's Llamba server
does, so both lay out the same prompt (the extra chunks' share depends on those sizes).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

CASES = [
    {"input_prefix": "def fibonacci(n):\n    ", "input_suffix": "\n    return a\n"},
    {"input_prefix": "import math\n\ndef area(r):\n    return ", "input_suffix": "\n\nprint(area(2))\n"},
    {
        "input_prefix": "function greet(name) {\n  ",
        "input_suffix": "\n}\n\ngreet('world');\n",
        "prompt": "console",
    },
    {
        "input_prefix": "from utils import clamp\n\ndef scale(x):\n    ",
        "input_suffix": "\n",
        "input_extra": [
            {"filename": "utils.py", "text": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"}
        ],
    },
    {
        "input_prefix": "#include <stdio.h>\n\nint main(void) {\n    ",
        "input_suffix": "\n    return 0;\n}\n",
        "input_extra": [{"text": "// a note without a file name\n"}],
    },
]
REQUEST = {"n_predict": 32, "temperature": 0.0, "top_k": 1, "cache_prompt": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as reply:
        return json.loads(reply.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    port = free_port()
    cmd = [args.llama_server, "-m", args.model, "-c", "4096", "-np", "1", "-t", "2", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if urllib.request.urlopen(base + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        cases = []
        for case in CASES:
            reply = post(base + "/infill", {**case, **REQUEST, "return_tokens": True, "n_probs": 2})
            top2 = [
                [p["logprob"] for p in step["top_logprobs"][:2]] for step in reply["completion_probabilities"]
            ]
            cases.append({"request": case, "content": reply["content"], "tokens": reply["tokens"],
                          "tokens_evaluated": reply["tokens_evaluated"], "top2_logprobs": top2})  # fmt: skip
        doc = {"model": Path(args.model).name, "request": REQUEST, "cases": cases}
        Path(args.out).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
