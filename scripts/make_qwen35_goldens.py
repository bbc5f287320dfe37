"""llama.cpp's logits on the synthetic Qwen3.5-family models of tests/synthetic_qwen35.py ->
tests/golden/qwen35.json.

Run it with Llamba's venv; it writes each seeded GGUF into a scratch folder and has llama.cpp compute
the logits there, in a Python that has llama-cpp-python 0.3.36 (llama.cpp 0c1e570; the worker half,
`--worker`, imports only numpy and llama_cpp):

    .venv/bin/python scripts/make_qwen35_goldens.py --llama-python /tmp/llcpp-avx2/bin/python

llama.cpp runs on the CPU, 2 threads, flash attention off (its float32 softmax path), one sequence of
n_ctx, the whole prompt (80 tokens, so that the conv tail and a long-carried recurrent state matter) in
one batch, every position's logits (`logits`). For the quantized cases also each of the prompt's first
FIRST_TOKENS tokens as the first token of a fresh sequence (`first_logits`): attention over one cell is
exact on both sides, so these isolate the weight formats from llama.cpp's f16 rounding of queries and
probabilities in its attention, which the int8 activations amplify (docs/numerics.md). Each case
records its tokens, n_ctx, the GGUF's sha256 (the test rebuilds the file and checks it is the one
llama.cpp ran) and the logits. `--compare` prints how far Llamba is from the committed logits.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "golden" / "qwen35.json"
FIRST_TOKENS = 16
SOURCE = "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), CPU (AVX2 build), 2 threads, flash attention off"


def worker(folder: Path) -> None:
    """In llama-cpp-python's venv: each job's prompt logits (and first-token logits) beside its GGUF."""
    import llama_cpp

    for job in json.loads((folder / "jobs.json").read_text()):
        llm = llama_cpp.Llama(
            str(folder / f"{job['name']}.gguf"),
            n_ctx=job["n_ctx"],
            n_batch=512,
            n_threads=2,
            n_threads_batch=2,
            logits_all=True,
            flash_attn=False,
            verbose=False,
        )
        llm.eval(job["tokens"])
        np.save(folder / f"{job['name']}.npy", np.array(llm.scores[: len(job["tokens"])], dtype=np.float32))
        if job["first"]:
            first = []
            for token in job["tokens"][:FIRST_TOKENS]:
                llm.reset()
                llm.eval([token])
                first.append(np.array(llm.scores[0], dtype=np.float32))
            np.save(folder / f"{job['name']}.first.npy", np.stack(first))
        print(f"{job['name']}: {llama_cpp.__version__}", file=sys.stderr)


def _b64(logits: np.ndarray) -> str:
    return base64.b64encode(logits.astype("<f4").tobytes()).decode()


def golden_cases(llama_python: str, names: list[str]) -> dict[str, dict]:
    from tests.synthetic_qwen35 import CASES, prompt_tokens, write_gguf

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = [CASES[n] for n in names]
        jobs = [
            {"name": c.name, "n_ctx": c.n_ctx, "tokens": prompt_tokens(c), "first": c.types != "F32"}
            for c in cases
        ]
        digests = {}
        for case in cases:
            path = write_gguf(case, folder / f"{case.name}.gguf")
            digests[case.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        (folder / "jobs.json").write_text(json.dumps(jobs))
        subprocess.run([llama_python, __file__, "--worker", str(folder)], check=True)
        out = {}
        for job in jobs:
            logits = np.load(folder / f"{job['name']}.npy")
            entry = {
                "n_ctx": job["n_ctx"],
                "tokens": job["tokens"],
                "sha256": digests[job["name"]],
                "shape": list(logits.shape),
                "logits_f32_base64": _b64(logits),
            }
            if job["first"]:
                entry["first_logits_f32_base64"] = _b64(np.load(folder / f"{job['name']}.first.npy"))
            out[job["name"]] = entry
    return out


def compare(golden_path: Path) -> None:
    """Llamba's logits on the rebuilt files against the committed ones (the prompt as one batch)."""
    from engine.backend import cpu_backend
    from engine.batch import Batch, BatchPart
    from engine.gguf import GGUFFile
    from engine.models import load_model
    from tests.synthetic_qwen35 import CASES, write_gguf

    golden = json.loads(golden_path.read_text())["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, entry in golden.items():
            model = load_model(GGUFFile(write_gguf(CASES[name], Path(tmp) / "m.gguf")), cpu_backend())
            got = model.forward(
                Batch.of([BatchPart(0, 0, entry["tokens"], "all")]), model.new_cache(1, entry["n_ctx"])
            )
            raw = base64.b64decode(entry["logits_f32_base64"])
            want = np.frombuffer(raw, "<f4").reshape(entry["shape"])
            rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
            top1 = (got.argmax(axis=1) == want.argmax(axis=1)).mean()
            print(f"{name}: relative max {rel.max():.2e} median {np.median(rel):.2e}, top-1 {top1:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python")
    parser.add_argument("--compare", action="store_true", help="Llamba against the committed logits")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    if args.compare:
        compare(args.output)
        return
    from tests.synthetic_qwen35 import CASES

    cases = golden_cases(args.llama_python, list(CASES))
    args.output.write_text(json.dumps({"source": SOURCE, "cases": cases}, indent=1) + "\n")
    print(f"wrote {args.output} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
