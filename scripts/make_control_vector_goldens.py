"""llama.cpp's logits under the SYNTHETIC control vectors of tests/synthetic_control_vector.py ->
tests/golden/control_vector.json.

Run it with Llamba's venv; it writes each seeded control vector into a scratch folder (its sha256 is
recorded: the test writes it again and checks it is the file llama.cpp ran) and has llama.cpp apply them to
the real base model in a Python that has llama-cpp-python 0.3.36 (llama.cpp 0c1e570; the worker half,
`--worker`, imports only numpy and llama_cpp):

    .venv/bin/python scripts/make_control_vector_goldens.py --llama-python /tmp/llcpp-avx2/bin/python

llama-cpp-python binds llama_set_adapter_cvec (libllama) but not common's control vector loader, so this
script reads the files with gguf-py's GGUFReader (not Llamba's reader) and sums them as
common_control_vector_load does (each file's direction.N times its scale, into a buffer of n_embd per layer
from layer 1, the files added in order), and the worker hands that buffer to llama_set_adapter_cvec with
the layer range as common_init_from_params resolves it (start <= 0: 1, end <= 0: n_layer). Per case: the
prompt evaluated in one batch, then STEPS greedy decode steps one token each; each step's TOP_K best ids
with their log-probabilities (a float64 log-softmax of llama.cpp's logits) and the id picked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "golden" / "control_vector.json"
TOP_K = 20
STEPS = 8
SOURCE = "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), CPU (AVX2 build), 2 threads, flash attention off"
PROMPT = "The capital of France is a city where"
MODEL = "smollm2"
# case -> the files (write_control_vector keyword arguments, scale) and the layer range (-1: the default)
CASES: dict[str, dict] = {
    "single": {"files": [({"seed": 0}, 1.0)], "range": [-1, -1]},
    "summed_range": {"files": [({"seed": 0}, 0.5), ({"seed": 1}, -1.5)], "range": [3, 20]},
}


def _top(logits: np.ndarray) -> list[list[float]]:
    x = logits.astype(np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    ids = np.argsort(-logits, kind="stable")[:TOP_K]
    return [[int(i), float(x[i] - lse)] for i in ids]


def worker(folder: Path) -> None:
    """In llama-cpp-python's venv: each job's steps, written beside its buffer."""
    import ctypes

    import llama_cpp

    for job in json.loads((folder / "jobs.json").read_text()):
        llm = llama_cpp.Llama(
            job["model"], n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2, logits_all=True,
            flash_attn=False, verbose=False,
        )  # fmt: skip
        data = np.ascontiguousarray(np.load(folder / f"{job['key']}.npy"), dtype=np.float32)
        n_layer = llama_cpp.llama_model_n_layer(llm.model)
        start, end = job["range"]
        start, end = (start if start > 0 else 1), (end if end > 0 else n_layer)
        ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        assert llama_cpp.llama_set_adapter_cvec(llm.ctx, ptr, data.size, job["n_embd"], start, end) == 0
        tokens = llm.tokenize(job["prompt"].encode(), add_bos=True, special=False)
        llm.eval(tokens)
        steps = []
        for _ in range(STEPS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            pick = int(np.argmax(logits))
            steps.append({"top": _top(logits), "id": pick})
            llm.eval([pick])
        (folder / f"{job['key']}.json").write_text(json.dumps({"tokens": tokens, "steps": steps}))
        print(f"{job['key']}: {llama_cpp.__version__}", file=sys.stderr)
        del llm


def summed(files: list[tuple[Path, float]]) -> tuple[np.ndarray, int]:
    """common_control_vector_load's buffer, read with gguf-py: n_embd values per layer from layer 1."""
    from gguf import GGUFReader

    total, n_embd = np.zeros(0, np.float32), -1
    for path, scale in files:
        cur = np.zeros(0, np.float32)
        for t in GGUFReader(path).tensors:
            layer = int(t.name.split(".")[1])
            d = np.asarray(t.data, np.float32)
            n_embd = d.size
            if cur.size < n_embd * layer:
                cur = np.concatenate([cur, np.zeros(n_embd * layer - cur.size, np.float32)])
            cur[n_embd * (layer - 1) : n_embd * layer] += d * np.float32(scale)
        if total.size < cur.size:
            total = np.concatenate([total, np.zeros(cur.size - total.size, np.float32)])
        total[: cur.size] += cur
    return total, n_embd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--llama-python", default="/tmp/llcpp-avx2/bin/python")
    ap.add_argument("-o", "--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from engine.model_files import resolve
    from tests.synthetic_control_vector import write_control_vector
    from tests.synthetic_lora import sha256

    golden = {"source": SOURCE, "prompt": PROMPT, "top_k": TOP_K, "model": MODEL, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder, jobs, files = Path(tmp), [], {}
        base = resolve(MODEL)
        for key, case in CASES.items():
            paths = []
            for kwargs, scale in case["files"]:
                path = write_control_vector(base, folder / f"cvec-{kwargs['seed']}.gguf", **kwargs)
                files[str(kwargs["seed"])] = {"kwargs": kwargs, "sha256": sha256(path)}
                paths.append((path, scale))
            data, n_embd = summed(paths)
            np.save(folder / f"{key}.npy", data)
            jobs.append({"key": key, "model": str(base), "n_embd": n_embd, "range": case["range"]})
            jobs[-1]["prompt"] = PROMPT
        (folder / "jobs.json").write_text(json.dumps(jobs))
        subprocess.run([args.llama_python, __file__, "--worker", str(folder)], check=True)
        golden["files"] = files
        for key, case in CASES.items():
            golden["cases"][key] = {
                "files": [[kwargs["seed"], scale] for kwargs, scale in case["files"]],
                "range": case["range"],
                **json.loads((folder / f"{key}.json").read_text()),
            }
    args.out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
