"""llama.cpp's logits on synthetic llama GGUFs, one per tensor type (tests/golden/quant_logits.npz).

Two steps, two virtual environments (llama-cpp-python's venv has no `gguf`, Llamba's no llama.cpp):

    # 1. write the synthetic models (tests/synthetic_quant_gguf.py, seeded: the test rebuilds the same bytes)
    .venv/bin/python scripts/make_quant_goldens.py --write /tmp/quant-ggufs Q5_K BF16 ...
    # 2. llama.cpp's logits for every token of TOKENS, teacher-forced, into the golden file
    /work/llcpp-venv/bin/python scripts/make_quant_goldens.py --llama-cpp /tmp/quant-ggufs \\
        -o tests/golden/quant_logits.npz

    # 3. (optional) how far Llamba is from them, per type
    .venv/bin/python scripts/make_quant_goldens.py --compare tests/golden/quant_logits.npz

Step 2 keeps the entries of the types it did not run. Each type stores `<TYPE>/logits` (len(TOKENS),
n_vocab) float32 and `<TYPE>/sha256` of the GGUF, so the test knows it rebuilt the same file.
llama.cpp runs on the CPU, 2 threads, flash attention off.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKENS = [1, 300, 45, 401, 17, 260, 511, 302, 99, 3, 488, 301, 270, 150, 42, 333]
SEED = 0


def write(out_dir: Path, types: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.synthetic_quant_gguf import write_llama_gguf

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in types:
        path = write_llama_gguf(out_dir / f"{name}.gguf", name, SEED)
        print(path, hashlib.sha256(path.read_bytes()).hexdigest())


def llama_cpp_logits(path: Path) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(
        str(path), n_ctx=64, n_threads=2, n_batch=64, verbose=False, logits_all=True, flash_attn=False
    )
    rows = []
    for token in TOKENS:
        llm.reset()  # a fresh sequence: the token at position 0
        llm.eval([token])
        rows.append(np.array(llm.scores[0], dtype=np.float32))
    return np.stack(rows)


def dump(in_dir: Path, out: Path) -> None:
    entries = dict(np.load(out)) if out.exists() else {}
    for path in sorted(in_dir.glob("*.gguf")):
        name = path.stem
        entries[f"{name}/logits"] = llama_cpp_logits(path)
        entries[f"{name}/sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
        print(name, entries[f"{name}/logits"].shape)
    entries["tokens"] = np.array(TOKENS, dtype=np.int32)
    np.savez_compressed(out, **entries)


def compare(golden_path: Path) -> None:
    """Llamba's logits on the rebuilt files against the golden ones: a markdown table."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from engine.backend import select_backend
    from engine.batch import Batch, BatchPart
    from engine.gguf import GGUFFile
    from engine.models import load_model
    from tests.synthetic_quant_gguf import write_llama_gguf

    golden = dict(np.load(golden_path))
    tokens = [int(t) for t in golden["tokens"]]
    print("| type | max abs error / max abs logit | rms error / rms logit | tokens > 1e-3 | top-1 equal |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(k.split("/")[0] for k in golden if k.endswith("/logits")):
            path = write_llama_gguf(Path(tmp) / f"{name}.gguf", name, SEED)
            model = load_model(GGUFFile(path), select_backend("cpu", 2))
            batch = Batch.of([BatchPart(i, 0, [t], "last") for i, t in enumerate(tokens)])
            got = model.forward(batch, model.new_cache(len(tokens), 8))
            want = golden[f"{name}/logits"]
            err = np.abs(got - want)
            per_token = err.max(axis=1) / np.abs(want).max()
            rms = np.sqrt((err**2).mean() / (want**2).mean())
            top1 = (got.argmax(axis=1) == want.argmax(axis=1)).sum()
            print(
                f"| {name} | {per_token.max():.2e} | {rms:.2e} | {(per_token > 1e-3).sum()} of {len(tokens)}"
                f" | {top1} of {len(tokens)} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, metavar="DIR")
    g.add_argument("--llama-cpp", type=Path, metavar="DIR")
    g.add_argument("--compare", type=Path, metavar="NPZ")
    p.add_argument("types", nargs="*", help="tensor types to write (GGMLQuantizationType names)")
    p.add_argument("-o", "--output", type=Path, default=ROOT / "tests" / "golden" / "quant_logits.npz")
    args = p.parse_args()
    if args.write:
        write(args.write, args.types)
    elif args.compare:
        compare(args.compare)
    else:
        dump(args.llama_cpp, args.output)


if __name__ == "__main__":
    main()
