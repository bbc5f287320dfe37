"""Two versions of the CPU matmul kernels in one process, called in turns: which is faster, by how much.

    .venv/bin/python scripts/ab_matmul.py --rev HEAD~1 --types Q4_K Q8_0 --shape 32768x512 --tokens 8,16,64

The checkout's `engine/cpu/matmul` package is "this"; the other is that package at git revision --rev
(its modules' imports of each other renamed) or the copy of it --against names, loaded as a second
package with its own compiled kernels (the rest of the engine, `engine/cpu/simd.py` included, is this
checkout's). Each test packs one random matrix (`tests.test_quant.random_blocks`) as the CPU backend
does (engine/cpu/records.py), checks that both give the same output bits (a kernel change must
not change them; --allow-diff for one that may), then alternates the two --rounds times
and prints the median times and their ratio. Why one process: this VM's speed drifts by 10-25% within
minutes, so two bench_matmul.py runs cannot tell a 10% change from the drift; alternated calls share
the drift (Q4 tiles of 8 as two calls of 4: 0.89-0.99x in one process, 0.6-1.7x across runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.test_quant's random_blocks

import engine  # noqa: E402, F401  (pins the threading environment before numba loads)
import engine.cpu.matmul as this  # noqa: E402
from engine import quant  # noqa: E402
from engine.cpu.records import pack_weight_for_cpu  # noqa: E402
from engine.quant import QType  # noqa: E402
from tests.test_quant import random_blocks  # noqa: E402


def load_other(package: Path) -> ModuleType:
    """The matmul package at `package`, imported as `matmul_other` (Numba's cache pickles the name)."""
    spec = importlib.util.spec_from_file_location("matmul_other", package / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["matmul_other"] = module
    spec.loader.exec_module(module)
    return module


def export_package(rev: str) -> Path:
    """engine/cpu/matmul at git revision `rev`, written as the package matmul_other in a folder of the
    revision's own (a fixed path: Numba's cache of its kernels is found again on the next run)."""
    sha = subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    package = Path.home() / ".cache" / "llamba" / "ab_matmul" / sha / "matmul_other"
    package.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:engine/cpu/matmul"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in (n for n in names if n.endswith(".py")):
        source = subprocess.run(
            ["git", "show", f"{rev}:engine/cpu/matmul/{name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (package / name).write_text(source.replace("engine.cpu.matmul", "matmul_other"))
    return package


def timed_call(fn, x: np.ndarray, w: quant.PackedWeight, out: np.ndarray, times: list[float]) -> None:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn(x, w, out)
    times.append(time.perf_counter() - start)


def compare(
    other: ModuleType, qtype: QType, shape: tuple[int, int], n_tok: int, args: argparse.Namespace
) -> None:
    w = pack_weight_for_cpu(random_blocks(qtype, *shape), qtype, shape)
    x = np.random.default_rng(0).standard_normal((n_tok, shape[1])).astype(np.float32)
    ours, theirs = (np.empty((n_tok, shape[0]), np.float32) for _ in range(2))
    this.matmul(x, w, ours)
    other.matmul(x, w, theirs)
    if not args.allow_diff and not np.array_equal(ours, theirs):
        raise SystemExit(
            f"{qtype.name} T={n_tok}: the two versions' outputs differ (--allow-diff to time anyway)"
        )
    t_this: list[float] = []
    t_other: list[float] = []
    for _ in range(args.rounds):
        timed_call(this.matmul, x, w, ours, t_this)
        timed_call(other.matmul, x, w, theirs, t_other)
    a, b = np.median(t_this) * 1e3, np.median(t_other) * 1e3
    print(f"| {qtype.name} | {shape[0]}x{shape[1]} | {n_tok} | {a:.3f} | {b:.3f} | {a / b:.3f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--rev", help="compare with engine/cpu/matmul at this git revision")
    which.add_argument(
        "--against", type=Path, help="compare with this copy of the package (its imports renamed)"
    )
    p.add_argument("--types", nargs="+", default=["Q4_K"])
    p.add_argument("--shape", default="32768x512", help="rows x columns")
    p.add_argument("--tokens", default="1,8,16", help="tile sizes to time, comma-separated")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--allow-diff", action="store_true", help="time versions whose outputs differ")
    args = p.parse_args()
    other = load_other(export_package(args.rev) if args.rev else args.against)
    shape = tuple(int(v) for v in args.shape.split("x"))
    print("| type | shape | T | this ms | other ms | this / other |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name in args.types:
        for n_tok in (int(t) for t in args.tokens.split(",")):
            compare(other, QType[name], (shape[0], shape[1]), n_tok, args)


if __name__ == "__main__":
    main()
