"""An image question on llama-server and on llamba-server, side by side (issue 51): the same real Gemma 3
270M, the same SYNTHETIC projector (tests/synthetic_mmproj.py, "tiny"), the same template (llama.cpp's
google-gemma-2-2b-it.jinja: the 270M file has none, and the two servers' defaults for a Gemma without one
differ), greedy, one token with its top 10 log-probabilities, for llama.cpp's test-1.jpeg and a gradient.

    .venv/bin/python scripts/compare_media_llama_server.py [--llama-server PATH]

Prints each server's prompt token count, top 5, whether the top token agrees and the largest
|delta log-probability| over the tokens both list. llama-server runs flash attention (its CPU default),
which alone moves these log-probabilities by up to 0.46 on this prompt (tests/test_media_gemma3.py).
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.reference_data import reference_dir, reference_file  # noqa: E402
from tests.synthetic_mmproj import write_gemma3_mmproj  # noqa: E402

MODEL = Path.home() / ".cache" / "llamba" / "models" / "gemma-3-270m-q4_k_m.gguf"
LLAMA_SERVER = reference_dir() / "llama-server-build" / "bin" / "llama-server"


def ask(port: int, image: Path) -> tuple[dict[int, float], int]:
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in this image?"},
    ]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
    body |= {"logprobs": True, "top_logprobs": 10}
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300).json()
    top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return {t["id"]: t["logprob"] for t in top}, reply["usage"]["prompt_tokens"]


def answers(cmd: list[str], port: int, images: dict[str, Path], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return {name: ask(port, path) for name, path in images.items()}
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="llamba-media-"))
    mmproj = write_gemma3_mmproj(folder / "mmproj-tiny.gguf", "tiny")
    template = reference_file("models/templates/google-gemma-2-2b-it.jinja")
    images = {
        "test1": reference_file("tools/mtmd/test-1.jpeg"),
        "gradient": ROOT / "tests/golden/mmproj_gradient.png",
    }
    common = ["-m", str(MODEL), "--mmproj", str(mmproj), "-c", "2048", "--chat-template-file", str(template)]
    env = dict(os.environ, LLAMA_ARG_REPACK="0", OMP_WAIT_POLICY="PASSIVE")
    theirs = answers([str(args.llama_server), *common, "-t", "2", "--jinja"], 8492, images, env)
    ours = answers([sys.executable, "-m", "server", *common], 8493, images)
    for name in images:
        (ref, n_ref), (mine, n_mine) = theirs[name], ours[name]
        common_ids = [t for t in ref if t in mine]
        gap = max(abs(ref[t] - mine[t]) for t in common_ids)
        print(f"{name}: prompt tokens llama-server {n_ref}, Llamba {n_mine}")
        print(f"  llama-server top 5 {[(t, round(v, 3)) for t, v in list(ref.items())[:5]]}")
        print(f"  Llamba       top 5 {[(t, round(v, 3)) for t, v in list(mine.items())[:5]]}")
        print(f"  top token agrees: {next(iter(ref)) == next(iter(mine))}; max |delta logprob| over the"
              f" {len(common_ids)} tokens both list: {gap:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
