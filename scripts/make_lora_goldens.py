"""llama.cpp's logits under the SYNTHETIC LoRA adapters of tests/synthetic_lora.py -> tests/golden/lora.json.

Run it with Llamba's venv; it writes each seeded adapter into a scratch folder (its sha256 is recorded:
the test writes it again and checks it is the file llama.cpp ran) and has llama.cpp apply it to the real
base model in a Python that has llama-cpp-python 0.3.36 (llama.cpp 0c1e570; the worker half,
`--worker`, imports only numpy and llama_cpp):

    .venv/bin/python scripts/make_lora_goldens.py --llama-python /tmp/llcpp-avx2/bin/python

Per model, adapter and scale (`Llama(model, lora_path=..., lora_scale=...)`, llama_set_adapters_lora):
the prompt evaluated in one batch, then STEPS greedy decode steps one token each; each step's TOP_K
best ids with their log-probabilities (a float64 log-softmax of llama.cpp's logits) and the id picked.
Scale 0 (the adapter loaded, not applied) is recorded too: the base model's answer the adapter moves.
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
OUT = ROOT / "tests" / "golden" / "lora.json"
TOP_K = 20
STEPS = 8
SCALES = (0.0, 0.5, 1.0)
SOURCE = "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), CPU (AVX2 build), 2 threads, flash attention off"
PROMPT = "The capital of France is a city where"
# model name -> adapters: (name, write_lora keyword arguments)
MODELS: dict[str, list[tuple[str, dict]]] = {
    "smollm2": [("f32_r8", {"seed": 0, "dtype": "F32"}), ("f16_r4", {"seed": 1, "dtype": "F16", "rank": 4})],
    "gemma3": [("f32_r8", {"seed": 0, "dtype": "F32"})],
    "qwen2.5-coder": [("f32_r8", {"seed": 0, "dtype": "F32"})],
}


def _top(logits: np.ndarray) -> list[list[float]]:
    x = logits.astype(np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    ids = np.argsort(-logits, kind="stable")[:TOP_K]
    return [[int(i), float(x[i] - lse)] for i in ids]


def worker(folder: Path) -> None:
    """In llama-cpp-python's venv: each job's steps, written beside its adapter."""
    import llama_cpp

    for job in json.loads((folder / "jobs.json").read_text()):
        llm = llama_cpp.Llama(
            job["model"],
            lora_path=job["adapter"],
            lora_scale=job["scale"],
            n_ctx=512,
            n_batch=512,
            n_threads=2,
            n_threads_batch=2,
            logits_all=True,
            flash_attn=False,
            verbose=False,
        )
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--llama-python", default="/tmp/llcpp-avx2/bin/python")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("-o", "--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from engine.model_files import resolve
    from tests.synthetic_lora import sha256, write_lora

    golden = json.loads(args.out.read_text()) if args.out.exists() else {"source": SOURCE, "cases": {}}
    golden["source"], golden["prompt"], golden["top_k"] = SOURCE, PROMPT, TOP_K
    with tempfile.TemporaryDirectory() as tmp:
        folder, jobs, adapters = Path(tmp), [], {}
        for model in args.models:
            base = resolve(model)
            for name, kwargs in MODELS[model]:
                path = write_lora(base, folder / f"{model}-{name}.gguf", **kwargs)
                adapters[(model, name)] = {"kwargs": kwargs, "sha256": sha256(path)}
                for scale in SCALES:
                    key = f"{model}-{name}-{scale}"
                    jobs.append({"key": key, "model": str(base), "adapter": str(path), "scale": scale})
                    jobs[-1]["prompt"] = PROMPT
        (folder / "jobs.json").write_text(json.dumps(jobs))
        subprocess.run([args.llama_python, __file__, "--worker", str(folder)], check=True)
        for model in args.models:
            for name, _ in MODELS[model]:
                case = {"model": model, **adapters[(model, name)], "scales": {}}
                for scale in SCALES:
                    case["scales"][str(scale)] = json.loads(
                        (folder / f"{model}-{name}-{scale}.json").read_text()
                    )
                golden["cases"][f"{model}-{name}"] = case
    args.out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
