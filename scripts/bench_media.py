"""Image speed against llama.cpp (issue 51): one 896x896 image's encode, and an image question's time to
first token, Llamba and llama.cpp alternating on the same files.

    .venv/bin/python scripts/bench_media.py --llama-python /tmp/llcpp-avx2/bin/python [--rounds 3]

The projector is SYNTHETIC (tests/synthetic_mmproj.py, preset "gemma3-4b": Gemma 3 4B's vision widths,
27 layers, F16; it projects to 640 so the real Gemma 3 270M reads its rows), written once to
~/.cache/llamba/bench. The image is llama.cpp's tools/mtmd/test-1.jpeg (any size: gemma3 resizes to
896x896, 4096 patches, 256 tokens out).

1. Encode: Llamba's `Projector.encode_image` in this process (the machine's own level, 2 threads) against
   mtmd_encode_chunk through llama-cpp-python (`--llama-python`; `--lib DIR` points LLAMA_CPP_LIB_PATH
   at another build's libs, e.g. the native one `make llama-server` builds), alternating, Llamba after
   one warm-up (its kernels load), llama.cpp without (nothing to compile; one encode takes minutes at
   these widths); each round's seconds and the median ratio.
2. Time to first token: llamba-server and llama-server (`--llama-server`, run with LLAMA_ARG_REPACK=0)
   on the same files, a chat with the image and `max_tokens` 1, a new image each request (one pixel
   changed: nothing cached on either side), alternating; wall time of each request, the median ratio.

Check the load (printed) before reading the figures.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.reference_data import reference_dir, reference_file  # noqa: E402
from tests.synthetic_mmproj import write_gemma3_mmproj  # noqa: E402

BENCH = Path.home() / ".cache" / "llamba" / "bench"
MODEL = Path.home() / ".cache" / "llamba" / "models" / "gemma-3-270m-q4_k_m.gguf"
LLAMA_SERVER = reference_dir() / "llama-server-build" / "bin" / "llama-server"

MTMD_ENCODE = r"""
import ctypes, sys, time, llama_cpp, llama_cpp.mtmd_cpp as mtmd
model_path, mmproj, image, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params(); mp.use_extra_bufts = False
model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
params = mtmd.mtmd_context_params_default(); params.use_gpu = False; params.n_threads = 2
params.print_timings = False
ctx = mtmd.mtmd_init_from_file(mmproj.encode(), model, params)
bitmap = mtmd.mtmd_helper_bitmap_init_from_file(ctx, image.encode(), False)
text = mtmd.mtmd_default_marker()
inp = mtmd.mtmd_input_text(text, len(text), False, True)
chunks = mtmd.mtmd_input_chunks_init()
assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
every = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))]
image = mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE
chunk = next(c for c in every if mtmd.mtmd_input_chunk_get_type(c) == image)  # not <start_of_image>
for _ in range(rounds):  # no warm-up: nothing is compiled, and one encode takes minutes at 4B widths
    t = time.perf_counter(); assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
    print(time.perf_counter() - t, flush=True)
"""


def report(what: str, other: str, ours: list[float], theirs: list[float]) -> None:
    mine, its = statistics.median(ours), statistics.median(theirs)
    print(f"{what}: median Llamba {mine:.2f} s, {other} {its:.2f} s, speed ratio {its / mine:.2f}x")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def llama_cpp_encode(python: str, lib: Path | None, mmproj: Path, image: Path, rounds: int) -> list[float]:
    env = dict(os.environ, LLAMA_ARG_REPACK="0", OMP_WAIT_POLICY="PASSIVE")
    if lib is not None:  # llama_cpp finds libllama there, llama_cpp.mtmd_cpp its libmtmd by its own variable
        env["LLAMA_CPP_LIB_PATH"] = env["MTMD_CPP_LIB"] = str(lib)
    args = [python, "-c", MTMD_ENCODE, str(MODEL), str(mmproj), str(image), str(rounds)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout
    return [float(line) for line in out.split()]


def bench_encode(args: argparse.Namespace, mmproj: Path, image: Path) -> None:
    from engine.backend import select_backend
    from engine.media.mmproj import load_projector

    projector = load_projector(mmproj, select_backend("cpu", 2))
    data = image.read_bytes()
    projector.encode_image(data)  # warm-up: compiles or loads the kernels
    ours, theirs = [], []
    for _ in range(args.rounds):
        t = time.perf_counter()
        projector.encode_image(data)
        ours.append(time.perf_counter() - t)
        theirs += llama_cpp_encode(args.llama_python, args.lib, mmproj, image, 1)
        print(f"  encode: Llamba {ours[-1]:.2f} s, llama.cpp {theirs[-1]:.2f} s  ({uptime()})", flush=True)
    report("encode 896x896", "llama.cpp", ours, theirs)


def image_variant(image: Path, i: int) -> str:
    """The image with pixel (0, 0) set to i: new bytes, so neither server has it cached."""
    from PIL import Image

    img = Image.open(image).convert("RGB")
    img.putpixel((0, 0), (i % 256, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def start(cmd: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd + ["--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not start")


def first_token_s(port: int, url: str) -> float:
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in this image?"},
    ]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "cache_prompt": False}
    t = time.perf_counter()
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    return time.perf_counter() - t


def bench_first_token(args: argparse.Namespace, mmproj: Path, image: Path) -> None:
    common = ["-m", str(MODEL), "--mmproj", str(mmproj), "-c", "2048", "-np", "1"]
    env = dict(os.environ, LLAMA_ARG_REPACK="0", OMP_WAIT_POLICY="PASSIVE")
    theirs_proc = start([str(args.llama_server), *common, "-t", "2"], 8481, env)
    ours_proc = start([sys.executable, "-m", "server", *common], 8482)
    try:
        first_token_s(8481, image_variant(image, 255))  # warm-up
        first_token_s(8482, image_variant(image, 254))
        ours, theirs = [], []
        for i in range(args.rounds):
            theirs.append(first_token_s(8481, image_variant(image, 2 * i)))
            ours.append(first_token_s(8482, image_variant(image, 2 * i + 1)))
            print(
                f"  first token: Llamba {ours[-1]:.2f} s, llama-server {theirs[-1]:.2f} s  ({uptime()})",
                flush=True,
            )
    finally:
        theirs_proc.terminate()
        ours_proc.terminate()
    report("time to first token", "llama-server", ours, theirs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python 0.3.36")
    p.add_argument("--lib", type=Path, help="LLAMA_CPP_LIB_PATH for it (another build's libs)")
    p.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip", choices=["encode", "first-token"], action="append", default=[])
    args = p.parse_args()
    BENCH.mkdir(parents=True, exist_ok=True)
    mmproj = BENCH / "mmproj-gemma3-4b-widths.gguf"
    if not mmproj.exists():
        write_gemma3_mmproj(mmproj, "gemma3-4b")
    image = reference_file("tools/mtmd/test-1.jpeg")
    print(uptime(), np.__version__)
    if "encode" not in args.skip:
        bench_encode(args, mmproj, image)
    if "first-token" not in args.skip:
        bench_first_token(args, mmproj, image)


if __name__ == "__main__":
    main()
