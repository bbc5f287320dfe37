"""How many compute threads the next step runs on, chosen from the step times the engine measures.

A step is some 200 parallel regions, each ending at a barrier that waits for every thread. On a machine
whose cores other programs also want (another Llamba process of a router, a build, a test suite), a
thread descheduled for a time slice stalls the whole step at the next barrier: two 2-thread SmolLM2
servers decoding at once on 2 cores each ran at 0.12-0.13 of their solo speed, 123.68 -> 15.30 tokens/s
(scripts/bench_contention.py). One thread has no barrier to wait at. So the tuner keeps a step time per
thread count and batch size (an EWMA per power-of-two bucket of tokens), runs each step on the count
with the lower time, and re-measures the other count for one step every `probe_every_s` seconds, so it
follows the machine as the competition comes and goes. On an idle machine that probe is the only cost:
one slower step every two seconds (a few hundred steps).

Outputs do not depend on the thread count: each output element is computed by one thread, in the same
order whatever the split (tests/test_threads.py compares logits bitwise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numba

T = TypeVar("T")

EWMA_WEIGHT = 0.3  # of the newest step: a few steps follow a change, one noisy step does not flip it


def tuner_for(n_threads: int, adaptive: bool, backend: str) -> ThreadTuner | None:
    """The engine's tuner: none on one thread, on a GPU backend, or with --no-adaptive-threads."""
    threads = min(n_threads or numba.config.NUMBA_NUM_THREADS, numba.config.NUMBA_NUM_THREADS)
    return ThreadTuner(threads) if adaptive and threads > 1 and backend == "CPU" else None


def bucket(n_tokens: int) -> int:
    """Steps of 1, 2-3, 4-7, ... tokens share a bucket: their times scale alike with the thread count."""
    return max(1, n_tokens).bit_length()


@dataclass
class ThreadTuner:
    max_threads: int
    probe_every_s: float = 2.0
    clock: object = time.monotonic  # a callable returning seconds; tests pass their own
    _seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # (threads, bucket) -> EWMA
    _measured_at: dict[tuple[int, int], float] = field(default_factory=dict)
    # Whether the last choice measures a count (unmeasured or stale) rather than runs the faster one: such
    # a step's time says what that count costs, not what the engine pays (the draft policy skips it).
    probing: bool = False

    @property
    def candidates(self) -> tuple[int, ...]:
        return tuple(sorted({1, self.max_threads}))

    def choose(self, n_tokens: int) -> int:
        """The thread count for a step of `n_tokens`: an unmeasured or stale count first, else the faster."""
        b, now = bucket(n_tokens), self.clock()  # type: ignore[operator]
        self.probing = True
        for threads in reversed(self.candidates):  # the full count first on a fresh start
            if (threads, b) not in self._seconds or now - self._measured_at[threads, b] > self.probe_every_s:
                return threads
        self.probing = False
        return min(self.candidates, key=lambda threads: self._seconds[threads, b])

    def observe(self, threads: int, n_tokens: int, seconds: float) -> None:
        """A step's time; a probe of a stale count replaces its figure (the machine may have changed)."""
        key, now = (threads, bucket(n_tokens)), self.clock()  # type: ignore[operator]
        old = self._seconds.get(key)
        fresh = old is not None and now - self._measured_at[key] <= self.probe_every_s
        self._seconds[key] = old + EWMA_WEIGHT * (seconds - old) if fresh else seconds  # type: ignore[operator]
        self._measured_at[key] = now

    def run(self, n_tokens: int, forward: Callable[[], T]) -> T:
        """`forward` (a step of `n_tokens`) on the chosen thread count, timed."""
        threads = self.choose(n_tokens)
        numba.set_num_threads(threads)
        start = time.perf_counter()
        out = forward()
        self.observe(threads, n_tokens, time.perf_counter() - start)
        return out
