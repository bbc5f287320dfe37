"""engine/threads.py: the thread count a step runs on, and outputs that do not depend on it."""

from __future__ import annotations

import os
import subprocess
import sys

import numba
import numpy as np

from engine.batch import Batch, BatchPart
from engine.threads import ThreadTuner, bucket
from tests.conftest import require
from tests.server_process import REPO


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_buckets_are_powers_of_two() -> None:
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 16)] == [1, 1, 2, 2, 3, 3, 4, 5]


def test_the_tuner_measures_each_count_then_runs_the_faster() -> None:
    clock = Clock()
    tuner = ThreadTuner(2, probe_every_s=2.0, clock=clock)
    assert tuner.choose(1) == 2 and tuner.probing  # the full count first
    tuner.observe(2, 1, 0.010)
    assert tuner.choose(1) == 1 and tuner.probing  # then the other, once
    tuner.observe(1, 1, 0.006)  # a busy machine: one thread is faster
    assert tuner.choose(1) == 1 and not tuner.probing  # chosen, not measured: the draft policy counts it
    assert tuner.choose(16) == 2  # another batch size has its own figures
    clock.now = 2.5  # the two-thread figure is stale: measured again
    assert tuner.choose(1) == 2 and tuner.probing
    tuner.observe(2, 1, 0.004)  # the competition went: the probe replaces the stale figure outright
    assert tuner.choose(1) == 1  # the one-thread figure is as old: measured again too
    tuner.observe(1, 1, 0.006)
    assert tuner.choose(1) == 2


def test_one_noisy_step_does_not_flip_a_fresh_choice() -> None:
    clock = Clock()
    tuner = ThreadTuner(2, clock=clock)
    tuner.observe(2, 1, 0.005)
    tuner.observe(1, 1, 0.009)
    tuner.observe(2, 1, 0.020)  # one slow step: 0.005 + 0.3 * 0.015 = 0.0095
    assert tuner.choose(1) == 1
    tuner.observe(1, 1, 0.009)
    tuner.observe(2, 1, 0.005)  # back to normal: 0.0095 - 0.3 * 0.0045 < 0.009
    assert tuner.choose(1) == 2


def test_a_one_thread_engine_has_a_single_candidate() -> None:
    assert ThreadTuner(1).candidates == (1,)


PROMPTS = [[1, 504, 3636, 2016, 314, 1070, 28], [1, 422, 1023, 30, 8, 7, 9, 2, 44] * 3]


def step_logits(llm, threads: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The logits of a prompt step of two sequences and of a decode step after it, on `threads`."""
    numba.set_num_threads(threads)
    kv = llm.new_cache(2, 256)
    batch = Batch.of([BatchPart(i, 0, p, want_logits="all") for i, p in enumerate(PROMPTS)])
    out = np.array(llm.model.run(batch, kv).logits)
    step = Batch.of([BatchPart(i, len(p), [42]) for i, p in enumerate(PROMPTS)])  # a decode step too
    return np.concatenate([out, np.array(llm.model.run(step, kv).logits)])


def test_logits_are_bitwise_the_same_on_one_thread_and_on_all(smollm2_llm) -> None:  # type: ignore[no-untyped-def]
    """The tuner may switch at any step, so a step's outputs must not depend on the thread count."""
    require(
        None
        if numba.config.NUMBA_NUM_THREADS >= 2
        else "a one-core machine: run with NUMBA_NUM_THREADS=2 (Numba runs two threads on one core)"
    )
    try:
        one, full = step_logits(smollm2_llm, 1), step_logits(smollm2_llm, numba.config.NUMBA_NUM_THREADS)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert one.shape[0] == sum(len(p) for p in PROMPTS) + 2
    assert np.array_equal(one.view(np.uint32), full.view(np.uint32))


TBB_RUN = """
import sys
import numba
import numpy as np
from engine.llm import LLM
from tests.test_threads import step_logits
np.save(sys.argv[1], step_logits(LLM.load("smollm2"), numba.config.NUMBA_NUM_THREADS))
print(numba.threading_layer())
"""


def test_the_tbb_threading_layer_loads_and_gives_the_same_logits(smollm2_llm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """NUMBA_THREADING_LAYER=tbb (opt-in, engine/__init__.py) in a process of its own: the layer is chosen
    when Numba first runs a parallel kernel, so not in this one."""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "tbb"}
    env.pop("LD_LIBRARY_PATH", None)  # found by engine/__init__.py, not by the environment
    ran = subprocess.run(
        [sys.executable, "-c", TBB_RUN, str(tmp_path / "tbb.npy")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert ran.returncode == 0 and ran.stdout.split()[-1] == "tbb", ran.stderr[-2000:]
    omp = step_logits(smollm2_llm, numba.config.NUMBA_NUM_THREADS)
    assert numba.threading_layer() == "omp"
    assert np.array_equal(np.load(tmp_path / "tbb.npy").view(np.uint32), omp.view(np.uint32))
