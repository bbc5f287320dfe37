"""llama.cpp's logits on the synthetic Gemma 4 models of tests/synthetic_gemma4.py -> golden/gemma4.json.

Run it with Llamba's venv; it writes each seeded GGUF into a scratch folder and has llama.cpp compute two
sets of logits there, in a Python that has llama-cpp-python 0.3.36 (llama.cpp 0c1e570; the worker half,
`--worker`, imports only numpy, llama_cpp and scripts/llama_cpp_trace.py), with
scripts/make_arch_goldens.py's settings: CPU, 2 threads, flash attention off, one sequence of n_ctx:

- `logits`: every position of the case's prompt, the whole prompt as one batch;
- `first_logits`: each prompt token as the first token of a fresh sequence (attention over one cell is
  exact on both sides, so these isolate the weights, the per-layer inputs and the experts);
- `router` (MoE cases): llama.cpp's routing in that prompt batch, read with its `cb_eval` hook (as
  scripts/llama_cpp_trace.py does) in a second context on the same model, whose logits must be the
  first one's bit for bit: per MoE layer (`layers`) and position the router logits over all experts
  (`ffn_moe_logits`: `logits_f32_base64`, [layer, position, expert]) and the experts it ran
  (`ffn_moe_topk`: `topk_i32_base64`, [layer, position, k], best first). A near-tie between the k-th
  and (k+1)-th logits is where another engine's float rounding can pick the other expert
  (tests/test_gemma4.py).

    .venv/bin/python scripts/make_gemma4_goldens.py --llama-python /tmp/llcpp-avx2/bin/python

Each case records its tokens, n_ctx, the GGUF's sha256 (tests/test_gemma4.py rebuilds the file and
checks it is the one llama.cpp ran) and the logits. `--compare` prints how far Llamba is from the
committed logits.
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
OUT = ROOT / "tests" / "golden" / "gemma4.json"
SOURCE = "llama.cpp 0c1e570 (llama-cpp-python 0.3.36), CPU, 2 threads, flash attention off"


ROUTER = ("ffn_moe_logits", "ffn_moe_topk")  # llama.cpp's build_moe_ffn names, "-<layer>" appended


def router_trace(llm, tokens: list[int]) -> tuple[dict[str, np.ndarray], np.ndarray]:  # type: ignore[no-untyped-def]
    """The prompt as one batch again, in a new context with llm's parameters and llama.cpp's cb_eval
    hook: ({"ffn_moe_logits-<il>": [T, n_expert] float32, "ffn_moe_topk-<il>": [T, k] int32}, the
    logits [T, n_vocab])."""
    import ctypes

    import llama_cpp

    sys.path.insert(0, str(ROOT))
    from scripts.llama_cpp_trace import GgmlTensor, tensor_array

    seen: dict[str, np.ndarray] = {}

    @llama_cpp.ggml_backend_sched_eval_callback
    def observe(pointer: int, ask: bool, _user: int) -> bool:
        t = ctypes.cast(pointer, ctypes.POINTER(GgmlTensor)).contents
        name = t.name.decode()
        kind, _, layer = name.rpartition("-")
        if ask:  # which tensors to stop at: the router's, not their reshaped views
            return kind in ROUTER and layer.isdigit()
        assert name not in seen, name
        values = tensor_array(t)  # a copy of its bytes as float32; topk's are int32
        seen[name] = (values.view(np.int32) if kind == "ffn_moe_topk" else values).reshape(len(tokens), -1)
        return True  # go on computing

    params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
    params.cb_eval = observe
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        shape = (len(tokens), llm.n_vocab())
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=shape).copy()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return seen, logits


def worker(folder: Path) -> None:
    """In llama-cpp-python's venv: each job's prompt logits and first-token logits beside its GGUF, and
    the MoE jobs' routing."""
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
        logits = np.array(llm.scores[: len(job["tokens"])], dtype=np.float32)
        np.save(folder / f"{job['name']}.npy", logits)
        if job["moe"]:
            router, traced = router_trace(llm, job["tokens"])
            assert np.array_equal(traced, logits), "the traced pass is not the golden one"
            np.savez(folder / f"{job['name']}.router.npz", **router)  # type: ignore[arg-type]
        first = []
        for token in job["tokens"]:
            llm.reset()
            llm.eval([token])
            first.append(np.array(llm.scores[0], dtype=np.float32))
        np.save(folder / f"{job['name']}.first.npy", np.stack(first))
        print(f"{job['name']}: llama-cpp-python {llama_cpp.__version__}", file=sys.stderr)


def _b64(logits: np.ndarray) -> str:
    return base64.b64encode(logits.astype("<f4").tobytes()).decode()


def _routing(path: Path) -> dict:
    """The worker's router tensors as the golden entry's `router` field, layers in order."""
    traced = np.load(path)
    layers = sorted(int(key.rpartition("-")[2]) for key in traced.files if key.startswith("ffn_moe_topk-"))
    logits = np.stack([traced[f"ffn_moe_logits-{il}"] for il in layers])
    topk = np.stack([traced[f"ffn_moe_topk-{il}"] for il in layers])
    return {
        "layers": layers,
        "shape": list(logits.shape),
        "logits_f32_base64": _b64(logits),
        "k": topk.shape[2],
        "topk_i32_base64": base64.b64encode(topk.astype("<i4").tobytes()).decode(),
    }


def golden_cases(llama_python: str, names: list[str]) -> dict[str, dict]:
    from tests.synthetic_gemma4 import CASES, prompt_tokens, write_gguf

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = [CASES[n] for n in names]
        jobs = [
            {"name": c.name, "n_ctx": c.n_ctx, "tokens": prompt_tokens(c), "moe": c.n_expert > 0}
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
            out[job["name"]] = {
                "n_ctx": job["n_ctx"],
                "tokens": job["tokens"],
                "sha256": digests[job["name"]],
                "shape": list(logits.shape),
                "logits_f32_base64": _b64(logits),
                "first_logits_f32_base64": _b64(np.load(folder / f"{job['name']}.first.npy")),
            }
            if job["moe"]:
                out[job["name"]]["router"] = _routing(folder / f"{job['name']}.router.npz")
    return out


def _report(name: str, label: str, got: np.ndarray, want: np.ndarray) -> None:
    rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    top1 = (got.argmax(axis=1) == want.argmax(axis=1)).mean()
    print(
        f"{name} {label}: max |diff| {np.abs(got - want).max():.2e}, relative max {rel.max():.2e}"
        f" median {np.median(rel):.2e}, top-1 {top1:.3f}"
    )


def compare(golden_path: Path) -> None:
    """Llamba's logits on the rebuilt files against the golden ones: the prompt as one batch, and each
    prompt token as the first of its own sequence (all in one batch)."""
    from engine.backend import cpu_backend
    from engine.batch import Batch, BatchPart
    from engine.gguf import GGUFFile
    from engine.models import load_model
    from tests.synthetic_gemma4 import CASES, write_gguf

    golden = json.loads(golden_path.read_text())["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, entry in golden.items():
            tokens, shape = entry["tokens"], entry["shape"]
            model = load_model(GGUFFile(write_gguf(CASES[name], Path(tmp) / "m.gguf")), cpu_backend())
            got = model.forward(
                Batch.of([BatchPart(0, 0, tokens, "all")]), model.new_cache(1, entry["n_ctx"])
            )
            firsts = Batch.of([BatchPart(i, 0, [t]) for i, t in enumerate(tokens)])
            first = model.forward(firsts, model.new_cache(len(tokens), 8))
            for label, mine, key in (("prompt", got, "logits"), ("first", first, "first_logits")):
                want = np.frombuffer(base64.b64decode(entry[f"{key}_f32_base64"]), "<f4").reshape(shape)
                _report(name, label, mine, want)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python")
    parser.add_argument("--compare", action="store_true", help="Llamba against the committed logits")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    parser.add_argument("names", nargs="*", help="cases to (re)make; default all (the others are kept)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    if args.compare:
        compare(args.output)
        return
    from tests.synthetic_gemma4 import CASES

    kept = json.loads(args.output.read_text())["cases"] if args.output.exists() and args.names else {}
    cases = kept | golden_cases(args.llama_python, args.names or list(CASES))
    args.output.write_text(json.dumps({"source": SOURCE, "cases": cases}, indent=1) + "\n")
    print(f"wrote {args.output} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
