"""An agent loop's prompt re-processing, turn by turn: what `timings.prompt_n` a server reports when a chat
resends its whole growing history (a 6-turn chat, ~2,000 tokens by the end, by default).

On a model with recurrent layers (Qwen3.5's Gated DeltaNet) the state cannot be cut back to a shorter
prefix; without checkpoints every turn whose history re-renders differently from what the model
generated processes the whole prompt again. Run it against Llamba and llama-server on the same file:

    python scripts/agent_loop.py --binary .venv/bin/llamba-server -m MODEL.gguf
    python scripts/agent_loop.py --binary LLAMA_SERVER -m MODEL.gguf --binary-args "-nr"

One JSON line per turn (prompt_n, cache_n, the prompt's length, the user message's new tokens), then a
summary. Greedy, a fixed reply length, the same user messages (slices of a fixed text) every run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import httpx

TEXT = (
    "The licenses for most software and other practical works are designed to take away your freedom to "
    "share and change the works. By contrast, the GNU General Public License is intended to guarantee your "
    "freedom to share and change all versions of a program, to make sure it remains free software for all "
    "its users. When we speak of free software, we are referring to freedom, not price. Our General Public "
    "Licenses are designed to make sure that you have the freedom to distribute copies of free software "
    "(and charge for them if you wish), that you receive source code or can get it if you want it, that you "
    "can change the software or use pieces of it in new free programs, and that you know you can do these "
    "things. To protect your rights, we need to prevent others from denying you these rights or asking you "
    "to surrender the rights. Therefore, you have certain responsibilities if you distribute copies of the "
    "software, or if you modify it: responsibilities to respect the freedom of others. "
)


def user_message(turn: int, words: int) -> str:
    """A user turn: `words` words of the text from a turn-dependent offset."""
    all_words = (TEXT * 8).split()
    start = (turn * 37) % (len(all_words) - words)
    return f"Turn {turn + 1}. Summarise this: " + " ".join(all_words[start : start + words])


def run_chat(url: str, turns: int, words: int, n_predict: int) -> list[dict[str, int]]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a careful assistant."}]
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": user_message(turn, words)})
            body = {"messages": messages, "max_tokens": n_predict, "temperature": 0, "seed": 1}
            reply = client.post("/v1/chat/completions", json=body)
            reply.raise_for_status()
            data = reply.json()
            timings = data["timings"]
            new = client.post("/tokenize", json={"content": messages[-1]["content"]}).json()["tokens"]
            rows.append(
                {
                    "turn": turn + 1,
                    "prompt_n": timings["prompt_n"],
                    "cache_n": timings["cache_n"],
                    "prompt_tokens": data["usage"]["prompt_tokens"],
                    "user_tokens": len(new),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            message = data["choices"][0]["message"]
            messages.append({"role": "assistant", "content": message.get("content") or ""})
    return rows


def start(binary: str, model: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    args = [binary, "-m", str(model), "-np", "1", "-c", "8192", "--port", str(port), "--host", "127.0.0.1"]
    proc = subprocess.Popen([*args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{binary} exited with {proc.returncode}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{binary} did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server")
    parser.add_argument("--binary", help="start this llama-server-compatible binary on -m")
    parser.add_argument("-m", "--model", type=Path)
    parser.add_argument("--port", type=int, default=8397)
    parser.add_argument("--binary-args", default="", help="more flags for the binary (space-separated)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--words", type=int, default=220, help="words per user message")
    parser.add_argument("--n-predict", type=int, default=48)
    args = parser.parse_args()
    proc = start(args.binary, args.model, args.port, args.binary_args.split()) if args.binary else None
    try:
        rows = run_chat(args.url or f"http://127.0.0.1:{args.port}", args.turns, args.words, args.n_predict)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    reprocessed = sum(r["prompt_n"] for r in rows[1:])
    print(
        json.dumps(
            {
                "turns": len(rows),
                "prompt_n_after_first": reprocessed,
                "final_prompt": rows[-1]["prompt_tokens"],
            }
        )
    )


if __name__ == "__main__":
    main()
