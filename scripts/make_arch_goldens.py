"""llama.cpp's logits on the synthetic models of tests/synthetic_gguf.py -> tests/golden/archs.json.

Run it with Llamba's venv; it writes each seeded GGUF into a scratch folder and has llama.cpp compute
every position's logits there, in a Python that has llama-cpp-python (built from PyPI in its own venv,
outside the repository: scripts/llama_cpp_bench.py's docstring shows how):

    .venv/bin/python scripts/make_arch_goldens.py --llama-python /work/llcpp-venv/bin/python

llama.cpp runs as llama-server would: CPU, 2 threads, flash attention off (its float32 softmax path),
YaRN's factors from the file (llama-cpp-python's own defaults would override the file's betas and
attention factor, so they are passed as "unset"), one sequence of n_ctx (`ArchCase.n_ctx`), the whole
prompt in one batch. The worker half (`--worker`) imports only numpy and llama_cpp.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "golden" / "archs.json"


def worker(folder: Path) -> None:
    """In llama-cpp-python's venv: each job's logits as <name>.npy beside its GGUF."""
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
            yarn_attn_factor=-1.0,
            yarn_beta_fast=-1.0,
            yarn_beta_slow=-1.0,
            verbose=False,
        )
        llm.eval(job["tokens"])
        np.save(folder / f"{job['name']}.npy", np.array(llm.scores[: len(job["tokens"])], dtype=np.float32))
        print(f"{job['name']}: {llama_cpp.__version__}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from tests.synthetic_gguf import CASES, prompt_tokens, write_gguf

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        jobs = [{"name": c.name, "n_ctx": c.n_ctx, "tokens": prompt_tokens(c)} for c in CASES.values()]
        for case in CASES.values():
            write_gguf(case, folder / f"{case.name}.gguf")
        (folder / "jobs.json").write_text(json.dumps(jobs))
        subprocess.run([args.llama_python, __file__, "--worker", str(folder)], check=True)
        cases = {}
        for job in jobs:
            logits = np.load(folder / f"{job['name']}.npy")
            cases[job["name"]] = {
                "n_ctx": job["n_ctx"],
                "tokens": job["tokens"],
                "shape": list(logits.shape),
                "logits_f32_base64": base64.b64encode(logits.astype("<f4").tobytes()).decode(),
            }
    source = "llama.cpp 0c1e570 (llama-cpp-python 0.3.36), CPU, 2 threads, flash attention off"
    args.output.write_text(json.dumps({"source": source, "cases": cases}, indent=1) + "\n")
    print(f"wrote {args.output} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
