"""Times constrained decoding on both models' vocabularies: llguidance (engine/grammar.py), and
xgrammar beside it when it is installed (it is not a dependency: its import wants torch).

    .venv/bin/python scripts/bench_grammar.py [--models smollm2,gemma3] [--repeat 3]

Per engine and model: the vocabulary view's build time; compile time of a nested JSON schema and
of llama.cpp's json.gbnf; the mask time per token while a valid document (tokenized by Llamba's
tokenizer) is walked, median and p95 over every token of --repeat walks, each on a freshly compiled
grammar (what a new request pays); for llguidance also the time to apply a mask to the logits, and
whether computing a mask releases the GIL (a worker thread computes heavy masks while the main
thread counts its own progress in pure Python: a call that held the GIL would stop that count).

The machine's cores are shared: the load average is printed; compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.gguf import GGUFFile  # noqa: E402
from engine.grammar import GrammarCompiler, GrammarSpec, _VocabularyAdapter  # noqa: E402
from engine.model_files import resolve  # noqa: E402
from engine.reference_data import llama_cpp_files  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "status": {"enum": ["active", "inactive", "banned"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            "required": ["street", "city"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "orders": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "total": {"type": "number", "minimum": 0},
                    "paid": {"type": "boolean"},
                },
                "required": ["id", "total", "paid"],
            },
        },
    },
    "required": ["name", "age", "status", "orders"],
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "status": "active",
    "score": 0.875,
    "address": {"street": "12 St James's Square", "city": "London"},
    "tags": ["mathematics", "analytical engine", "poetry"],
    "orders": [{"id": 1, "total": 19.99, "paid": True}, {"id": 2, "total": 250.0, "paid": False}],
}


@dataclass
class Case:
    name: str
    grammar: str  # a JSON schema as text, or GBNF
    document: str


def cases() -> list[Case]:
    json_gbnf = next(p for p in llama_cpp_files("grammars") if p.name == "json.gbnf").read_text()
    return [
        Case("json_schema", json.dumps(SCHEMA), json.dumps(INSTANCE, indent=2)),
        Case("json.gbnf", json_gbnf, json.dumps(INSTANCE, separators=(",", ":"))),
    ]


def ms(seconds: list[float]) -> str:
    a = np.array(seconds) * 1e3
    return f"median {np.median(a):.3f} ms, p95 {np.percentile(a, 95):.3f} ms"


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# -- llguidance, through engine/grammar.py ---------------------------------------------------------


def bench_llguidance(tokenizer: Tokenizer, repeat: int) -> None:
    builds = [timed(lambda: GrammarCompiler(tokenizer))[0] for _ in range(repeat)]
    compiler = GrammarCompiler.for_tokenizer(tokenizer)
    print(f"  llguidance: view build median {1e3 * statistics.median(builds):.0f} ms")
    for case in cases():
        compiles, masks, applies = [], [], []
        for run in range(repeat):
            spec = _fresh_spec(case, run)  # a distinct spec per run: no compiled-grammar cache hit
            seconds, compiled = timed(lambda spec=spec: compiler.compile(spec))
            compiles.append(seconds)
            _walk_llguidance(compiled.matcher(), compiler, case.document, masks, applies)
        print(f"    {case.name}: compile median {1e3 * statistics.median(compiles):.1f} ms")
        print(f"      mask per token {ms(masks)} ({len(masks)} tokens); apply to logits {ms(applies)}")


def _fresh_spec(case: Case, run: int) -> GrammarSpec:
    if case.name == "json_schema":
        return GrammarSpec.json_schema({**json.loads(case.grammar), "title": f"run {time.time()} {run}"})
    return GrammarSpec.gbnf(f"# run {time.time()} {run}\n{case.grammar}")


def _walk_llguidance(matcher, compiler, document: str, masks: list[float], applies: list[float]) -> None:  # type: ignore[no-untyped-def]
    logits = np.zeros(compiler.n_vocab, dtype=np.float32)
    for token in compiler.tokenizer.encode(document, False, False):
        masks.append(timed(matcher._fill_mask)[0])  # the mask alone (apply() would wait for it)
        logits.fill(0.0)
        applies.append(timed(lambda: matcher.apply(logits))[0])
        assert np.isfinite(logits[token]) and matcher.accept(token), matcher.error


def gil_released(tokenizer: Tokenizer) -> str:
    """Heavy masks (a wide regex, each on a fresh matcher) on a worker thread, the main thread
    timestamping in pure Python: stamps keep coming during the calls only if the GIL is released."""
    compiler = GrammarCompiler.for_tokenizer(tokenizer)
    grammar = GrammarSpec.lark(r"start: /(a|b|c|d)*e/ | /[a-z0-9 ]{1,100}q/")
    prefix = tokenizer.encode("abc", False, False)
    calls: list[tuple[float, float]] = []
    done = threading.Event()

    def worker() -> None:
        for run in range(200):
            matcher = compiler.compile(GrammarSpec.lark(f"// {run}\n{grammar.source}")).matcher()
            assert all(matcher.accept(t) for t in prefix)
            start = time.perf_counter()
            matcher._fill_mask()
            calls.append((start, time.perf_counter()))
        done.set()

    stamps = _stamps_while(worker, done)
    inside = sum(int(np.count_nonzero((stamps > a + 1e-4) & (stamps < b - 1e-4))) for a, b in calls)
    covered = sum(max(0.0, b - a - 2e-4) for a, b in calls)
    rate = stamps.size / (stamps[-1] - stamps[0])
    longest = 1e3 * max(b - a for a, b in calls)
    verdict = "released" if inside > 0.2 * rate * covered else "HELD"
    expected = f"~{rate * covered:.0f} expected if released, ~0 if held"
    return f"{verdict}: {inside} main-thread stamps inside mask calls ({expected}); longest {longest:.2f} ms"


def _stamps_while(worker: Callable[[], None], done: threading.Event) -> np.ndarray:
    thread = threading.Thread(target=worker)
    stamps: list[float] = []
    thread.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    thread.join()
    return np.array(stamps)


# -- xgrammar, when installed ----------------------------------------------------------------------


def bench_xgrammar(tokenizer: Tokenizer, repeat: int) -> None:
    try:
        import xgrammar
    except ImportError as exc:
        print(f"  xgrammar: not installed ({exc.name} missing)")
        return
    # xgrammar's special tokens are the empty ones: control tokens become b"" rather than 0xFF + text.
    adapter = _VocabularyAdapter(tokenizer)
    vocab = [b"" if t.startswith(b"\xff") else t for t in adapter.tokens]

    def build():  # type: ignore[no-untyped-def]
        info = xgrammar.TokenizerInfo(
            vocab,
            xgrammar.VocabType.RAW,
            vocab_size=tokenizer.n_vocab,
            stop_token_ids=sorted(tokenizer.eog_ids),
        )
        return xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    builds = [timed(build) for _ in range(repeat)]
    print(f"  xgrammar: view build median {1e3 * statistics.median(b for b, _ in builds):.0f} ms")
    for case in cases():
        _bench_xgrammar_case(xgrammar, builds[0][1], tokenizer, case, repeat)


def _bench_xgrammar_case(xgrammar, compiler, tokenizer: Tokenizer, case: Case, repeat: int) -> None:  # type: ignore[no-untyped-def]
    if case.name == "json_schema":
        compile_ = lambda: compiler.compile_json_schema(case.grammar)  # noqa: E731
    else:  # xgrammar rejects json.gbnf's empty alternative ("ws ::= | ..."); spelled "" here
        compile_ = lambda: compiler.compile_grammar(case.grammar.replace("ws ::= |", 'ws ::= "" |'))  # noqa: E731
    compiles, masks = [], []
    bitmask = np.full((1, (tokenizer.n_vocab + 31) // 32), -1, dtype=np.int32)
    for _ in range(repeat if case.name == "json_schema" else 1):  # json.gbnf is slow there
        seconds, compiled = timed(compile_)
        compiles.append(seconds)
        matcher = xgrammar.GrammarMatcher(compiled)
        for token in tokenizer.encode(case.document, False, False):
            masks.append(timed(lambda matcher=matcher: matcher.fill_next_token_bitmask(bitmask))[0])
            assert matcher.accept_token(token)
    print(f"    {case.name}: compile median {1e3 * statistics.median(compiles):.1f} ms")
    print(f"      mask per token {ms(masks)} ({len(masks)} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for name in args.models.split(","):
        tokenizer = Tokenizer.from_gguf(GGUFFile(resolve(name)))
        print(f"{name}: {tokenizer.n_vocab} tokens")
        bench_llguidance(tokenizer, args.repeat)
        print(f"    GIL during a mask: {gil_released(tokenizer)}")
        bench_xgrammar(tokenizer, args.repeat)


if __name__ == "__main__":
    main()
