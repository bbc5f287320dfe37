"""The kernel and model tests on every x86 level this machine can execute (engine/cpu/isa.py).

This process runs the whole suite on its own level (the best the CPU has, unless LLAMBA_CPU_LEVEL says
otherwise). Every other level the CPU can execute runs the `every_level` tests in a subprocess compiled
for that level's own target (LLAMBA_CPU_LEVEL sets NUMBA_CPU_NAME and NUMBA_CPU_FEATURES there): every
test that compares with llama.cpp's outputs (marked by tests/conftest.py, whatever the test) and the
kernels' tests against numpy. The levels with FMA must also give the same bits: the matmul products and
the float kernels' and three real models' outputs (tests/level_products.py, tests/level_outputs.py). A
level the CPU cannot execute is skipped, naming the instructions it lacks, never reported as passed.
The run's summary says which levels were tested, and with which tests (tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import pytest

from engine.cpu import isa
from tests.conftest import EVERY_LEVEL, LEVELS_TESTED, not_applicable

ROOT = Path(__file__).parent.parent
OWN = isa.current()
HOST = isa.host_features()


def run_on_level(level: isa.Level, *args: str) -> subprocess.CompletedProcess[str]:
    """`python args` compiled for the level (LLAMBA_CPU_LEVEL; this process's NUMBA_CPU_* dropped)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env[isa.LEVEL_ENV] = level.name
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3500
    )


# A cold JIT cache compiles the set's kernels for the level first: minutes beyond the suite's per-test
# 600 s (warm figures per level: docs/performance.md, "Test suite").
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", isa.LEVEL_NAMES)
def test_every_level_tests_pass_on_each_level(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    level = isa.level_named(name)
    tested = request.config.stash.setdefault(LEVELS_TESTED, {})
    if level == OWN.level:
        tested[name] = f"this process (target {OWN.cpu}): the whole suite"
        return
    if not level.needs <= HOST:
        not_applicable(f"this CPU cannot execute {name}: it lacks {', '.join(sorted(level.needs - HOST))}")
    report = tmp_path / "junit.xml"
    args = ["-q", "-p", "no:cacheprovider", "-m", f"{EVERY_LEVEL} and not slow", f"--junitxml={report}"]
    run = run_on_level(level, "-m", "pytest", *args)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, f"{name}: {summary}\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0 and "failed" not in summary, summary
    assert f"level {name} " in run.stdout, "the subprocess ran another level"
    tested[name] = f"a subprocess ({summary}): {count_by_file(report)}"


def count_by_file(junit_xml: Path) -> str:
    """'test_model.py 8, test_ops.py 20, ...': how many tests of each file a junit report holds."""
    counts = Counter(
        case.get("classname", "").split(".")[1] + ".py"
        for case in ElementTree.parse(junit_xml).iter("testcase")
    )
    return ", ".join(f"{file} {n}" for file, n in sorted(counts.items()))


@pytest.mark.timeout(3000)
@pytest.mark.parametrize("digests", ["tests.level_products", "tests.level_outputs"])
def test_the_levels_with_fma_give_the_same_bits(digests: str) -> None:
    """Every level sums the same integers, and every float sum in one order (engine/cpu/lanes.py); the
    levels that contract multiplies and adds into FMAs alike (all but portable) must give bitwise the
    same matmul products of every type at every tile size (tests/level_products.py), and the same float
    kernel outputs and real models' hidden states and logits (tests/level_outputs.py), each run per level
    in a subprocess so that each compiles for its own target."""
    levels = [level for level in isa.LEVELS if "fma" in level.needs and level.needs <= HOST]
    if len(levels) < 2:
        not_applicable(
            f"one level with FMA here ({', '.join(level.name for level in levels)}): nothing to compare"
        )
    outputs = {}
    for level in levels:
        run = run_on_level(level, "-m", digests)
        assert run.returncode == 0, run.stderr[-3000:]
        outputs[level.name] = run.stdout
    first = levels[0].name
    for name, lines in outputs.items():
        assert lines == outputs[first], f"{name} differs from {first}:\n{lines}\n{outputs[first]}"


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
