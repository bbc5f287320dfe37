"""engine/threads.py: the thread count a step runs on, and outputs that do not depend on it."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from engine.batch import Batch, BatchPart
from engine.threads import ThreadTuner, bucket


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
    assert tuner.choose(1) == 2  # the full count first
    tuner.observe(2, 1, 0.010)
    assert tuner.choose(1) == 1  # then the other, once
    tuner.observe(1, 1, 0.006)  # a busy machine: one thread is faster
    assert tuner.choose(1) == 1
    assert tuner.choose(16) == 2  # another batch size has its own figures
    clock.now = 2.5  # the two-thread figure is stale: measured again
    assert tuner.choose(1) == 2
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


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two cores")
def test_logits_are_bitwise_the_same_on_one_thread_and_on_all(smollm2_llm) -> None:  # type: ignore[no-untyped-def]
    """The tuner may switch at any step, so a step's outputs must not depend on the thread count."""
    llm = smollm2_llm
    prompts = [[1, 504, 3636, 2016, 314, 1070, 28], [1, 422, 1023, 30, 8, 7, 9, 2, 44] * 3]

    def logits(threads: int) -> np.ndarray:
        numba.set_num_threads(threads)
        kv = llm.new_cache(2, 256)
        batch = Batch.of([BatchPart(i, 0, p, want_logits="all") for i, p in enumerate(prompts)])
        out = np.array(llm.model.run(batch, kv).logits)
        step = Batch.of([BatchPart(i, len(p), [42]) for i, p in enumerate(prompts)])  # a decode step too
        return np.concatenate([out, np.array(llm.model.run(step, kv).logits)])

    try:
        one, full = logits(1), logits(numba.config.NUMBA_NUM_THREADS)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert one.shape[0] == sum(len(p) for p in prompts) + 2
    assert np.array_equal(one.view(np.uint32), full.view(np.uint32))
