"""The kernel and model tests on every x86 level this machine can execute (engine/cpu/isa.py).

This process runs the whole suite on its own level (the best the CPU has, unless LLAMBA_CPU_LEVEL says
otherwise). Every other level the CPU can execute runs a focused set in a subprocess compiled for that
level's own target (LLAMBA_CPU_LEVEL sets NUMBA_CPU_NAME and NUMBA_CPU_FEATURES there): every
quantization type at every tile size against numpy, the byte kernels bitwise against the portable ones,
every type and architecture against llama.cpp's logits, and two real models end to end (teacher-forced
logits, batched decoding). A level the CPU cannot execute is skipped, naming the instructions it lacks,
never reported as passed. The run's summary says which levels were tested (tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu import isa
from tests.conftest import LEVELS_TESTED, not_applicable

ROOT = Path(__file__).parent.parent
FOCUSED = [
    "tests/test_matmul.py",
    "tests/test_records.py",
    "tests/test_chunks.py",
    "tests/test_quant_models.py",
    "tests/test_archs.py::test_logits_match_llama_cpp",
    "tests/test_model.py::test_teacher_forced_numerics_match_llama_cpp",
    "tests/test_model.py::test_batched_decode_equals_separate_runs",
    "tests/test_moe.py::test_one_call_expert_matmul_matches_the_per_expert_matmuls_and_numpy",
    "tests/test_moe.py::test_logits_match_llama_cpp",
    "tests/test_moe.py::test_outputs_are_bitwise_independent_of_the_batch",
]
OWN = isa.current()
HOST = isa.host_features()


def run_on_level(level: isa.Level, *args: str) -> subprocess.CompletedProcess[str]:
    """`python args` compiled for the level (LLAMBA_CPU_LEVEL; this process's NUMBA_CPU_* dropped)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env[isa.LEVEL_ENV] = level.name
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=2700
    )


# A cold JIT cache compiles the focused set's kernels for the level first: minutes beyond the suite's
# per-test 600 s (warm, a level's run takes about a minute).
@pytest.mark.timeout(3000)
@pytest.mark.parametrize("name", isa.LEVEL_NAMES)
def test_kernels_and_models_on_each_level(name: str, request: pytest.FixtureRequest) -> None:
    level = isa.level_named(name)
    tested = request.config.stash.setdefault(LEVELS_TESTED, {})
    if level == OWN.level:
        tested[name] = f"this process (target {OWN.cpu}): the whole suite"
        return
    if not level.needs <= HOST:
        not_applicable(f"this CPU cannot execute {name}: it lacks {', '.join(sorted(level.needs - HOST))}")
    run = run_on_level(level, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *FOCUSED)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, f"{name}: {summary}\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0 and "failed" not in summary, summary
    assert f"level {name} " in run.stdout, "the subprocess ran another level"
    tested[name] = f"a subprocess ({summary})"


@pytest.mark.timeout(3000)
def test_the_levels_with_fma_give_the_same_products_to_the_bit() -> None:
    """Every level sums the same integers; those that contract the float scaling into FMAs alike (all but
    portable) must give bitwise the same products of every type at every tile size (tests/level_products.py,
    run per level in a subprocess so that each compiles for its own target)."""
    levels = [level for level in isa.LEVELS if "fma" in level.needs and level.needs <= HOST]
    if len(levels) < 2:
        not_applicable(
            f"one level with FMA here ({', '.join(level.name for level in levels)}): nothing to compare"
        )
    digests = {}
    for level in levels:
        run = run_on_level(level, "-m", "tests.level_products")
        assert run.returncode == 0, run.stderr[-3000:]
        digests[level.name] = run.stdout
    first = levels[0].name
    for name, products in digests.items():
        assert products == digests[first], f"{name} differs from {first}:\n{products}\n{digests[first]}"


PROGRAMS = {
    "llamba-server": ["-m", "server", "-m", "smollm2", "--port", "0"],
    "llamba-bench": ["-c", "from cli.bench import main; raise SystemExit(main(['-p', '8', '-n', '0']))"],
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({isa.LEVEL_ENV: "avx1024"}, "is no level"),
        ({"NUMBA_CPU_NAME": "sapphirerapids"}, "which this CPU"),  # AVX-512 VNNI and AVX-VNNI both
        ({isa.LEVEL_ENV: "avx2", "NUMBA_CPU_NAME": "haswell"}, "set one or the other"),
    ],
)
def test_a_target_the_cpu_cannot_run_stops_at_start_in_one_line(
    program: str, setting: dict, says: str
) -> None:
    cpu = setting.get("NUMBA_CPU_NAME")
    if cpu and isa.LEVEL_ENV not in setting and isa.probe(cpu, "") <= HOST:
        not_applicable(f"this CPU runs {cpu}'s target: nothing to refuse")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", isa.LEVEL_ENV)
    }
    run = subprocess.run(
        [sys.executable, *PROGRAMS[program]],
        cwd=ROOT,
        env=env | setting,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert lines[0].startswith(f"{program}: error: ") and says in lines[0], lines[0]
