"""llamba-bench: llama-bench's tests, options and output formats, run on Llamba's engine.

Tests (each repeated -r times after an untimed warm-up, the KV cache emptied before every repetition):
  ppN      prompt processing: N random tokens (BOS first when the model adds one), in ubatch-sized chunks
  tgN      text generation: N single-token decode steps
  ppN+tgM  both (-pg N,M); tokens/s counts N+M
  ... @ dD an untimed prefill of D tokens before each repetition (-d D)
  tgN xB   Llamba's addition (--batch-seqs B): B sequences decoded together, one token each per step,
           each first given its own small prompt (or the depth context); tokens/s is the aggregate B*N/time,
           what continuous batching gains over one sequence at a time.
  tgN copy Llamba's speculative mode (--spec-type, llama-server's flag names; `none` for the baseline):
           N greedy tokens generated through the engine after a prompt whose answer repeats text
           (--spec-prompt copy: code, repeat: prose, or chat: an ordinary question), the prompt cached
           beforehand so only generation is timed; draft_n and accepted count the draft tokens verified
           and accepted.
Load time and time to first token go to stderr, so cold and warm starts can be read off.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from cli.bench_serve import WORKLOADS
from engine.memory.kv_types import cache_type
from engine.speculative import SPEC_TYPES, SpecParams

PROG = "llamba-bench"
FORMATS = ("md", "csv", "json", "jsonl", "sql")
DEFAULT_N_PROMPT = [512]
DEFAULT_N_GEN = [128]
DEFAULT_N_BATCH = [2048]
DEFAULT_N_UBATCH = [512]
# Prompt of each sequence of a batched tg test at depth 0, so the sequences hold distinct contexts.
SEQ_PROMPT_TOKENS = 8
SPEC_PROMPTS = WORKLOADS  # the speculative tg tests' prompts (cli/bench/spec.py)

# llama-bench options that make no sense here (GPU offload, NUMA, Hugging Face, ...): a clear
# error instead of argparse's guess (-ngl would otherwise read as -n gl).
UNSUPPORTED_OPTIONS = (
    ("-ngl", "--n-gpu-layers"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-C", "--cpu-mask"),
    ("--cpu-strict",),
    ("--poll",),
    ("-sm", "--split-mode"),
    ("-mg", "--main-gpu"),
    ("-nkvo", "--no-kv-offload"),
    ("-fa", "--flash-attn"),
    ("--list-devices",),
    ("-lm", "--load-mode"),
    ("-lzm", "--lazy-mode"),
    ("-mmp", "--mmap"),
    ("-dio", "--direct-io"),
    ("-embd", "--embeddings"),
    ("-ts", "--tensor-split"),
    ("-ot", "--override-tensor"),
    ("-nopo", "--no-op-offload"),
    ("--no-host",),
    ("--repack",),
    ("-nr", "--no-repack"),
    ("--moe-cache",),
    ("--n-gen-warmup",),
    ("-fitt", "--fit-target"),
    ("-fitc", "--fit-ctx"),
    ("-rpc", "--rpc"),
    ("--numa",),
    ("--prio",),
    ("-hf", "-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hft", "--hf-token"),
    ("--offline",),
)


# ---------------------------------------------------------------------------------------------------------
# Command line


@dataclass(frozen=True)
class BenchParams:
    models: list[str | None]
    n_prompt: list[int]
    n_gen: list[int]
    n_pg: list[tuple[int, int]]
    n_depth: list[int]
    n_batch: list[int]
    n_ubatch: list[int]
    n_threads: list[int]
    batch_seqs: list[int]
    reps: int = 5
    output: str = "md"
    output_err: str = "none"
    delay: int = 0
    no_warmup: bool = False
    progress: bool = False
    verbose: bool = False
    threads_given: bool = False
    device: str = "cpu"  # auto | cpu | cuda (engine.backend.select_backend)
    type_k: tuple[str, ...] = ("f16",)  # KV cell types (engine/memory/kv_types.py), llama-bench -ctk
    type_v: tuple[str, ...] = ("f16",)
    # Speculative tg tests (empty spec_types: none). Lists are swept like the other test parameters.
    spec_types: tuple[str, ...] = ()
    draft_max: tuple[int, ...] = (16,)
    draft_min: tuple[int, ...] = (0,)
    ngram_n: tuple[int, ...] = (12,)
    spec_prompts: tuple[str, ...] = ("copy",)
    model_draft: str | None = None


_RANGE = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def parse_int_list(text: str) -> list[int]:
    """llama-bench's lists: '512', '1,2,4', 'first-last' (step 1), 'first-last+step', 'first-last*mult'."""
    values: list[int] = []
    for item in text.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise argparse.ArgumentTypeError(f"invalid number or range: '{item}'")
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        op, step = m[3] or "+", int(m[4]) if m[4] is not None else 1
        if last < first or (op == "+" and step < 1) or (op == "*" and (step < 2 or first < 1)):
            raise argparse.ArgumentTypeError(f"invalid range: '{item}'")
        i = first
        while i <= last:
            values.append(i)
            i = i + step if op == "+" else i * step
    return values


def _parse_pair(text: str) -> list[tuple[int, int]]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected <pp,tg>, got '{text}'")
    return [(int(parts[0]), int(parts[1]))]


def _parse_names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


class _Unsupported(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        option = args[-1] if args else self.option_strings[0]
        names = " / ".join(self.option_strings)
        parser.error(f"{option}: the llama-bench option {names} is not supported by {PROG}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0],
        epilog="Multiple values can be given for each test parameter by separating them with ',' or by "
        "repeating the option; ranges as 'first-last', 'first-last+step' or 'first-last*mult'. Every "
        "combination is run.",
        allow_abbrev=False,
    )
    lists = p.add_argument_group("test parameters")
    ints = {"action": "extend", "type": parse_int_list, "metavar": "N"}
    lists.add_argument(
        "-m",
        "--model",
        action="extend",
        type=_parse_names,
        metavar="NAME|PATH",
        help="model name (smollm2, gemma3, qwen2.5-coder) or GGUF path (default: smollm2)",
    )
    lists.add_argument("-p", "--n-prompt", **ints, help="prompt sizes (default: 512)")
    lists.add_argument("-n", "--n-gen", **ints, help="generation sizes (default: 128)")
    lists.add_argument(
        "-pg",
        dest="n_pg",
        action="extend",
        type=_parse_pair,
        metavar="PP,TG",
        help="prompt then generation (default: none)",
    )
    lists.add_argument("-d", "--n-depth", **ints, help="context depth prefilled before each run (default: 0)")
    lists.add_argument("-b", "--batch-size", **ints, help="logical batch size (default: 2048)")
    lists.add_argument("-ub", "--ubatch-size", **ints, help="physical batch size (default: 512)")
    lists.add_argument("-t", "--threads", **ints, help="threads (default: the CPUs available)")
    lists.add_argument("--batch-seqs", **ints, help="sequences decoded together in tg tests (default: 1)")
    names = {"action": "extend", "type": _parse_names, "metavar": "TYPE"}
    lists.add_argument("-ctk", "--cache-type-k", **names, help="KV cache key type: f16, q8_0 (default: f16)")
    lists.add_argument("-ctv", "--cache-type-v", **names, help="KV cache value type (default: f16)")
    spec = p.add_argument_group("speculative decoding (Llamba's addition: tg tests through the engine)")
    spec.add_argument("--spec-type", **names, help="none, " + ", ".join(SPEC_TYPES) + " (a list sweeps)")
    spec.add_argument("--draft-max", "--draft", "--draft-n", **ints, help="most draft tokens (default: 16)")
    spec.add_argument("--draft-min", "--draft-n-min", **ints, help="shortest draft verified (default: 0)")
    spec.add_argument("--spec-ngram-size-n", **ints, help="n-gram looked up (default: 12)")
    spec.add_argument(
        "--spec-prompt", **names, help="copy (code to repeat), repeat (prose to repeat) or chat"
    )
    spec.add_argument("-md", "--model-draft", metavar="NAME|PATH", help="draft model (draft-simple)")
    p.add_argument("-dev", "--device", choices=("auto", "cpu", "cuda"), default="cpu", help="default: cpu")
    p.add_argument("-r", "--repetitions", type=int, default=5, metavar="N", help="repetitions (default: 5)")
    p.add_argument("-o", "--output", choices=(*FORMATS, "none"), default="md", help="stdout format")
    p.add_argument("-oe", "--output-err", choices=(*FORMATS, "none"), default="none", help="stderr format")
    p.add_argument("--delay", type=int, default=0, metavar="S", help="seconds to wait before each test")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up run before each test")
    p.add_argument("--progress", action="store_true", help="print progress to stderr")
    p.add_argument("-v", "--verbose", action="store_true", help="print every repetition's time to stderr")
    for names in UNSUPPORTED_OPTIONS:
        p.add_argument(*names, action=_Unsupported, nargs="?", help=argparse.SUPPRESS)
    return p


def _normalize(argv: list[str]) -> list[str]:
    """Like llama-bench, '--n_prompt' means '--n-prompt'."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_args(argv: list[str] | None = None) -> BenchParams:
    parser = build_parser()
    a = parser.parse_args(_normalize(list(sys.argv[1:] if argv is None else argv)))
    params = BenchParams(
        models=a.model or [None],
        n_prompt=a.n_prompt if a.n_prompt is not None else DEFAULT_N_PROMPT,
        n_gen=a.n_gen if a.n_gen is not None else DEFAULT_N_GEN,
        n_pg=a.n_pg or [],
        n_depth=a.n_depth or [0],
        n_batch=a.batch_size or DEFAULT_N_BATCH,
        n_ubatch=a.ubatch_size or DEFAULT_N_UBATCH,
        n_threads=a.threads or [default_threads()],
        batch_seqs=a.batch_seqs or [1],
        reps=a.repetitions,
        output=a.output,
        output_err=a.output_err,
        delay=a.delay,
        no_warmup=a.no_warmup,
        progress=a.progress,
        verbose=a.verbose,
        threads_given=a.threads is not None,
        device=a.device,
        type_k=tuple(a.cache_type_k or ["f16"]),
        type_v=tuple(a.cache_type_v or ["f16"]),
    )
    params = _spec_params(parser, a, params)
    for name in (*params.type_k, *params.type_v):
        try:
            cache_type(name)
        except ValueError as exc:
            parser.error(str(exc))
    for name, values in (
        ("-b", params.n_batch),
        ("-ub", params.n_ubatch),
        ("-t", params.n_threads),
        ("--batch-seqs", params.batch_seqs),
    ):
        if min(values) < 1:
            parser.error(f"{name} values must be at least 1")
    if params.reps < 1:
        parser.error("-r must be at least 1")
    if params.delay < 0:
        parser.error("--delay must not be negative")
    return params


def _spec_params(parser: argparse.ArgumentParser, a: argparse.Namespace, params: BenchParams) -> BenchParams:
    """The speculative flags, checked: -md alone means draft-simple (as in llama-server), and a draft
    setting without --spec-type is an error rather than ignored."""
    types = a.spec_type or (["draft-simple"] if a.model_draft else [])
    settings = {"--draft-max": a.draft_max, "--draft-min": a.draft_min}
    settings |= {"--spec-ngram-size-n": a.spec_ngram_size_n, "--spec-prompt": a.spec_prompt}
    given = [name for name, value in settings.items() if value]
    if given and not types:
        parser.error(f"{given[0]} needs --spec-type")
    unknown = [t for t in types if t not in ("none", *SPEC_TYPES)]
    if unknown:
        parser.error(f"--spec-type {unknown[0]!r} is not supported (known: none, {', '.join(SPEC_TYPES)})")
    if "draft-simple" in types and not a.model_draft:
        parser.error("--spec-type draft-simple needs a draft model: -md/--model-draft NAME|PATH")
    bad = [name for name in a.spec_prompt or () if name not in SPEC_PROMPTS]
    if bad:
        parser.error(f"--spec-prompt {bad[0]!r}: expected one of {', '.join(SPEC_PROMPTS)}")
    if types and any(params.n_depth):
        parser.error("-d does not apply to speculative tg tests: their context is the --spec-prompt")
    spec = dataclasses.replace(
        params,
        spec_types=tuple(types),
        model_draft=a.model_draft,
        draft_max=tuple(a.draft_max or params.draft_max),
        draft_min=tuple(a.draft_min or params.draft_min),
        ngram_n=tuple(a.spec_ngram_size_n or params.ngram_n),
        spec_prompts=tuple(a.spec_prompt or params.spec_prompts),
    )
    for n_max, n_min, n in itertools.product(spec.draft_max, spec.draft_min, spec.ngram_n):
        try:
            SpecParams(("ngram-simple",), n_max=n_max, n_min=n_min, ngram_n=n)
        except ValueError as exc:
            parser.error(str(exc))
    return spec


# ---------------------------------------------------------------------------------------------------------
# Test plan


@dataclass(frozen=True)
class Instance:
    """One test: a row of the output."""

    model: str | None
    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    n_seqs: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    spec_type: str = ""  # a speculative tg test ("none": its baseline); "": an ordinary test
    draft_max: int = 16
    draft_min: int = 0
    ngram_n: int = 12
    spec_prompt: str = ""

    @property
    def spec(self) -> SpecParams | None:
        """A speculative test's request settings (None: speculation off)."""
        if self.spec_type in ("", "none"):
            return None
        return SpecParams((self.spec_type,), self.draft_max, self.draft_min, ngram_n=self.ngram_n)

    @property
    def name(self) -> str:
        if self.n_prompt and not self.n_gen:
            name = f"pp{self.n_prompt}"
        elif self.n_gen and not self.n_prompt:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        if self.n_seqs > 1:
            name += f" x{self.n_seqs}"
        if self.n_depth:
            name += f" @ d{self.n_depth}"
        if self.spec_type:
            name += f" {self.spec_prompt}"
        return name

    @property
    def n_tokens(self) -> int:
        """Tokens processed per timed run, over all sequences (the t/s numerator)."""
        return self.n_seqs * (self.n_prompt + self.n_gen)

    @property
    def context_tokens(self) -> int:
        """Tokens each sequence holds before the timed part: the depth, or a batched test's own prompt."""
        return self.n_depth or (SEQ_PROMPT_TOKENS if self.n_seqs > 1 else 0)


def plan(params: BenchParams) -> list[Instance]:
    """Every combination, in llama-bench's order (model outermost, so each model loads once)."""
    tests: list[Instance] = []
    p = params
    for model, nb, nub, tk, tv, nt, nd in itertools.product(
        p.models, p.n_batch, p.n_ubatch, p.type_k, p.type_v, p.n_threads, p.n_depth
    ):
        common = {"model": model, "n_depth": nd, "n_batch": nb, "n_ubatch": nub, "n_threads": nt}
        common |= {"type_k": tk, "type_v": tv}
        tests += [Instance(n_prompt=n, n_gen=0, **common) for n in params.n_prompt if n > 0]
        tg = [
            Instance(n_prompt=0, n_gen=n, n_seqs=b, **common)
            for n in params.n_gen
            if n > 0
            for b in params.batch_seqs
        ]
        tests += [spec for t in tg for spec in _speculative(t, params)] if params.spec_types else tg
        tests += [Instance(n_prompt=pp, n_gen=tg, **common) for pp, tg in params.n_pg if pp or tg]
    return tests


def _speculative(test: Instance, p: BenchParams) -> list[Instance]:
    """A tg test once per speculative setting (the speculation type innermost, so `none` and a type
    are side by side)."""
    settings = itertools.product(p.spec_prompts, p.draft_max, p.draft_min, p.ngram_n, p.spec_types)
    return [
        dataclasses.replace(test, spec_prompt=pr, draft_max=dmax, draft_min=dmin, ngram_n=n, spec_type=t)
        for pr, dmax, dmin, n, t in settings
    ]
