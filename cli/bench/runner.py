"""Running the tests: load each model once, time every repetition on it, stream rows to the printers."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TextIO

import numpy as np

from cli.bench.options import PROG, SEQ_PROMPT_TOKENS, BenchParams, Instance, plan
from cli.bench.output import PRINTERS
from cli.bench.results import BenchResult, ModelInfo
from engine.batch import Batch, BatchPart
from engine.memory.kv import CacheTypes
from engine.memory.kv_types import cache_type
from engine.model_files import DEFAULT_MODEL

if TYPE_CHECKING:
    from engine.llm import LLM
    from engine.memory.kv import KVCache

RANDOM_SEED = 1234


def set_threads(n: int) -> int:
    """Use n compute threads (capped at Numba's pool size); returns the number actually used."""
    import numba

    used = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(used)
    return used


class Runner:
    """Runs tests on one loaded model and remembers how long its very first forward pass took."""

    def __init__(
        self, llm: LLM, log: Callable[[str], None], params: BenchParams, draft: LLM | None = None
    ) -> None:
        self.llm = llm
        self.draft = draft  # -md: the draft model of draft-simple tests
        self.log = log
        self.params = params
        self.rng = np.random.default_rng(RANDOM_SEED)
        self.n_vocab = int(llm.model.hp.n_vocab)
        # The first forward pass: (its seconds, perf_counter when it ended, what it was part of).
        self.first_forward: tuple[float, float, str] | None = None
        self.stage = ""

    # -- the model calls -------------------------------------------------------------------------------

    def forward(self, batch: Batch, kv: KVCache) -> np.ndarray:
        if self.first_forward is not None:
            return self.llm.model.forward(batch, kv)
        start = time.perf_counter()
        logits = self.llm.model.forward(batch, kv)
        end = time.perf_counter()
        self.first_forward = (end - start, end, self.stage)
        return logits

    def random_tokens(self, n: int) -> np.ndarray:
        """n random token ids, BOS first when the model adds one (llama-bench's synthetic prompt)."""
        tokens = self.rng.integers(0, self.n_vocab, size=n, dtype=np.int32)
        if n and self.llm.tokenizer.add_bos:
            tokens[0] = self.llm.tokenizer.bos_id
        return tokens

    def prompt(self, kv: KVCache, seq: int, tokens: np.ndarray, n_batch: int, n_ubatch: int) -> None:
        """Feed tokens as llama_decode would: n_batch-token calls split into n_ubatch-sized forward passes,
        only the last token of each call producing logits."""
        start = int(kv.lengths[seq])
        n = len(tokens)
        for b0 in range(0, n, n_batch):
            b1 = min(b0 + n_batch, n)
            for u0 in range(b0, b1, n_ubatch):
                u1 = min(u0 + n_ubatch, b1)
                rows = [u1 - u0 - 1] if u1 == b1 else []
                batch = Batch(
                    tokens[u0:u1],
                    np.arange(start + u0, start + u1, dtype=np.int32),
                    np.full(u1 - u0, seq, dtype=np.int32),
                    np.asarray(rows, dtype=np.int32),
                )
                self.forward(batch, kv)

    def generate(self, kv: KVCache, steps: np.ndarray) -> None:
        """steps[i] holds one token per sequence: each step decodes them all in one batch."""
        n_seqs = steps.shape[1]
        seq_ids = np.arange(n_seqs, dtype=np.int32)
        for step in steps:
            positions = kv.lengths[:n_seqs].astype(np.int32)
            self.forward(Batch(step, positions, seq_ids, seq_ids), kv)

    def gen_tokens(self, n_gen: int, n_seqs: int) -> np.ndarray:
        steps = self.rng.integers(0, self.n_vocab, size=(n_gen, n_seqs), dtype=np.int32)
        if n_gen and self.llm.tokenizer.add_bos:
            steps[0] = self.llm.tokenizer.bos_id  # llama-bench starts generation from BOS
        return steps

    # -- one test ----------------------------------------------------------------------------------------

    def results(self, insts: list[Instance], info: ModelInfo, index: int, total: int) -> list[BenchResult]:
        """Run one test, or speculative tests that differ only in their type (interleaved): their
        repetitions' times (and a speculative test's draft counts)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        results = [BenchResult(inst, info, stamp) for inst in insts]
        if not insts[0].spec_type:
            results[0].samples_ns = self.run(insts[0], index, total)
            return results
        from cli.bench.spec import run_interleaved  # the engine: only for speculative tests

        runs = run_interleaved(self.llm, self.draft, insts, self.params.reps, not self.params.no_warmup)
        for result, spec in zip(results, runs, strict=True):
            result.samples_ns = spec.samples_ns
            result.draft_n, result.draft_accepted = spec.draft_n, spec.draft_accepted
            result.active_ts = spec.active_ts
        return results

    def build_context(self, kv: KVCache, inst: Instance) -> None:
        """The untimed part before each run: the depth prefill, or each batched sequence's own prompt."""
        for s in range(inst.n_seqs):
            kv.clear(s)
        if inst.n_depth:
            self.prompt(kv, 0, self.random_tokens(inst.n_depth), inst.n_batch, inst.n_ubatch)
            for s in range(1, inst.n_seqs):
                # The cache shares nothing between sequences, so each copy still reads its own cells:
                # a batched step costs what it would with contexts of their own.
                kv.copy_cells(0, s, inst.n_depth)
        elif inst.n_seqs > 1:
            parts = [
                BatchPart(s, 0, self.random_tokens(SEQ_PROMPT_TOKENS).tolist()) for s in range(inst.n_seqs)
            ]
            self.forward(Batch.of(parts), kv)

    def run(self, inst: Instance, index: int, total: int) -> list[int]:
        p = self.params
        progress = self.log if p.progress else (lambda _msg: None)
        tag = f"benchmark {index}/{total}"
        types = CacheTypes(cache_type(inst.type_k), cache_type(inst.type_v))
        kv = self.llm.new_cache(inst.n_seqs, inst.context_tokens + inst.n_prompt + inst.n_gen, types)
        if p.delay:
            time.sleep(p.delay)
        if not p.no_warmup:
            self.warmup(kv, inst, progress, tag)
        samples: list[int] = []
        for rep in range(p.reps):
            if inst.context_tokens:
                if rep == 0:
                    progress(f"{tag}: depth run {rep + 1}/{p.reps}")
                    self.stage = f"{inst.name} context"
                    self.build_context(kv, inst)
                else:
                    # Cells below the context are never overwritten by the timed part: reuse them, as
                    # llama-bench restores its saved state instead of prefilling again.
                    progress(f"{tag}: depth run {rep + 1}/{p.reps} (cached)")
                    for s in range(inst.n_seqs):
                        kv.truncate(s, inst.context_tokens)
            else:
                kv.clear(0)
            samples.append(self.timed_run(kv, inst, progress, f"{tag}: ", f"{rep + 1}/{p.reps}"))
        return samples

    def warmup(self, kv: KVCache, inst: Instance, progress: Callable[[str], None], tag: str) -> None:
        self.stage = f"{inst.name} warm-up"
        if inst.n_prompt:
            progress(f"{tag}: warmup prompt run")
            self.prompt(kv, 0, self.random_tokens(inst.n_prompt), inst.n_batch, inst.n_ubatch)
        if inst.n_gen:
            progress(f"{tag}: warmup generation run")
            self.generate(kv, self.gen_tokens(1, inst.n_seqs))
        for s in range(inst.n_seqs):
            kv.clear(s)

    def timed_run(
        self, kv: KVCache, inst: Instance, progress: Callable[[str], None], tag: str, rep: str
    ) -> int:
        # Tokens are drawn before the clock starts: llama-bench's rand() costs nothing, numpy's does.
        prompt = self.random_tokens(inst.n_prompt)
        steps = self.gen_tokens(inst.n_gen, inst.n_seqs)
        self.stage = inst.name
        start = time.perf_counter_ns()
        if inst.n_prompt:
            progress(f"{tag}prompt run {rep}")
            self.prompt(kv, 0, prompt, inst.n_batch, inst.n_ubatch)
        if inst.n_gen:
            progress(f"{tag}generation run {rep}")
            self.generate(kv, steps)
        return time.perf_counter_ns() - start


Loader = Callable[[str | None, int], "LLM"]


def load_llm(model: str | None, n_threads: int, device: str = "cpu") -> LLM:
    from engine.llm import LLM  # imported here so --help and argument errors do not pay for the engine

    return LLM.load(model, device=device, n_threads=n_threads)


def _by_model(tests: list[Instance]) -> Iterator[tuple[str | None, list[Instance]]]:
    for model, group in itertools.groupby(tests, key=lambda t: t.model):
        yield model, list(group)


def _on_own_thread(
    runner: Runner, insts: list[Instance], info: ModelInfo, index: int, total: int
) -> list[BenchResult]:
    """A turn's tests on a thread that exits when they are done. A thread that enters a parallel kernel
    stays an OpenMP master until it exits, and once libgomp manages more threads than there are CPUs it
    cuts every worker's spin-wait to ~100 iterations: a forward pass on the main thread left a later
    speculative test's engine 25% slower (Gemma 3, one stream: 49-56 t/s, 64-81 without it)."""

    def turn() -> list[BenchResult]:
        set_threads(insts[0].n_threads)  # per thread, like the OpenMP pool it sizes
        return runner.results(insts, info, index, total)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamba-bench") as pool:
        return pool.submit(turn).result()


def _turns(tests: list[Instance]) -> Iterator[list[Instance]]:
    """The tests one by one, except speculative tests that differ only in their type: together (they
    are adjacent in the plan, the type innermost), so their repetitions take turns."""
    for _, group in itertools.groupby(
        tests, key=lambda t: dataclasses.replace(t, spec_type="none") if t.spec_type else t
    ):
        yield list(group)


def run(
    params: BenchParams,
    out: TextIO,
    err: TextIO,
    load: Loader = load_llm,
    started: float | None = None,
) -> int:
    """Run every test, streaming rows to the printers. Returns the exit status (1 if any test failed)."""
    started = time.perf_counter() if started is None else started

    def log(msg: str) -> None:
        print(f"{PROG}: {msg}", file=err, flush=True)

    printers = [
        PRINTERS[fmt](stream, params)
        for fmt, stream in ((params.output, out), (params.output_err, err))
        if fmt != "none"
    ]
    for printer in printers:
        printer.begin()
    tests = plan(params)
    failed = 0
    index = 0
    for model, group in _by_model(tests):
        label = model or DEFAULT_MODEL
        try:
            load_start = time.perf_counter()
            llm = load(model, group[0].n_threads)
            load_s = time.perf_counter() - load_start
        except Exception as exc:  # a bad path or a broken file fails its tests, not the whole sweep
            log(f"error: failed to load model '{label}': {exc}")
            failed += len(group)
            index += len(group)
            continue
        log(f"{label}: loaded {llm.path.name} in {load_s:.2f} s ({llm.backend.name})")
        info = ModelInfo.of(llm)
        runner = Runner(llm, log, params, _load_draft(params, llm, load, group[0].n_threads, log))
        warned: set[int] = set()
        for insts in _turns(group):
            if params.progress:
                log(f"benchmark {index + 1}/{len(tests)}: starting")
            index += len(insts)
            asked = insts[0].n_threads
            used = set_threads(asked)
            if used != asked and asked not in warned:
                warned.add(asked)
                log(f"warning: {asked} threads requested, Numba's pool has {used}; running {used}")
            insts = [dataclasses.replace(inst, n_threads=used) for inst in insts]
            first = runner.first_forward is None
            results = _on_own_thread(runner, insts, info, index, len(tests))
            if first and runner.first_forward is not None:
                log_first_token(log, label, runner.first_forward, load_start + load_s, started)
            for result in results:
                if params.verbose:
                    log(f"{result.inst.name}: samples_ns {result.samples_ns}")
                for printer in printers:
                    printer.row(result)
    for printer in printers:
        printer.end()
    return 1 if failed else 0


def _load_draft(
    params: BenchParams, llm: LLM, load: Loader, n_threads: int, log: Callable[[str], None]
) -> LLM | None:
    """The draft model of draft-simple tests (-md), checked against the target's vocabulary."""
    if params.model_draft is None:
        return None
    from engine.speculative.draft import check_vocabulary

    draft = load(params.model_draft, n_threads)
    check_vocabulary(draft, llm)
    log(f"draft: loaded {draft.path.name}")
    return draft


def log_first_token(
    log: Callable[[str], None], label: str, first: tuple[float, float, str], loaded: float, started: float
) -> None:
    secs, end, stage = first
    log(
        f"{label}: first token {end - loaded:.3f} s after load, {end - started:.2f} s after start "
        f"(first forward pass: {stage}, {secs:.3f} s, including JIT compilation or cache loading)"
    )
