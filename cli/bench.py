"""llamba-bench: llama-bench's tests, options and output formats, run on Llamba's engine.

Tests (each repeated -r times after an untimed warm-up, the KV cache emptied before every repetition):
  ppN      prompt processing: N random tokens (BOS first when the model adds one), in ubatch-sized chunks
  tgN      text generation: N single-token decode steps
  ppN+tgM  both (-pg N,M); tokens/s counts N+M
  ... @ dD an untimed prefill of D tokens before each repetition (-d D)
  tgN xB   Llamba's addition (--batch-seqs B): B sequences decoded together, one token each per step,
           each first given its own small prompt (or the depth context); tokens/s is the aggregate B*N/time,
           what continuous batching gains over one sequence at a time.
Load time and time to first token go to stderr, so cold and warm starts can be read off.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import io
import itertools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from engine.batch import Batch, BatchPart
from engine.model_files import DEFAULT_MODEL

if TYPE_CHECKING:
    from engine.kv import KVCache
    from engine.llm import LLM

PROG = "llamba-bench"
FORMATS = ("md", "csv", "json", "jsonl", "sql")
DEFAULT_N_PROMPT = [512]
DEFAULT_N_GEN = [128]
DEFAULT_N_BATCH = [2048]
DEFAULT_N_UBATCH = [512]
# Prompt of each sequence of a batched tg test at depth 0, so the sequences hold distinct contexts.
SEQ_PROMPT_TOKENS = 8
RANDOM_SEED = 1234

# llama-bench options that make no sense here (GPU offload, KV types, NUMA, Hugging Face, ...): a clear
# error instead of argparse's guess (-ngl would otherwise read as -n gl).
UNSUPPORTED_OPTIONS = (
    ("-ngl", "--n-gpu-layers"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
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
        help="model name (smollm2, gemma3) or GGUF path (default: smollm2)",
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
    )
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
    for model, nb, nub, nt, nd in itertools.product(
        params.models, params.n_batch, params.n_ubatch, params.n_threads, params.n_depth
    ):
        common = {"model": model, "n_depth": nd, "n_batch": nb, "n_ubatch": nub, "n_threads": nt}
        tests += [Instance(n_prompt=n, n_gen=0, **common) for n in params.n_prompt if n > 0]
        tests += [
            Instance(n_prompt=0, n_gen=n, n_seqs=b, **common)
            for n in params.n_gen
            if n > 0
            for b in params.batch_seqs
        ]
        tests += [Instance(n_prompt=pp, n_gen=tg, **common) for pp, tg in params.n_pg if pp or tg]
    return tests


# ---------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ModelInfo:
    filename: str
    type: str  # llama-bench's model column, e.g. "llama 135M Q4_1"
    size: int  # bytes of weights
    n_params: int
    backend: str
    kv_type: str

    @classmethod
    def of(cls, llm: LLM) -> ModelInfo:
        kv = llm.new_cache(1, 1)
        kv_type = {"float32": "f32", "float16": "f16"}.get(np.dtype(kv.k.dtype).name, str(kv.k.dtype))
        m = llm.model
        return cls(str(llm.path), llm.description, int(m.n_bytes), int(m.n_params), llm.backend.name, kv_type)


@dataclass
class BenchResult:
    inst: Instance
    model: ModelInfo
    test_time: str
    samples_ns: list[int] = field(default_factory=list)

    @property
    def samples_ts(self) -> list[float]:
        return [1e9 * self.inst.n_tokens / ns for ns in self.samples_ns]

    @property
    def avg_ns(self) -> int:
        return int(_mean(self.samples_ns))

    @property
    def stddev_ns(self) -> int:
        return int(_stddev(self.samples_ns))

    @property
    def avg_ts(self) -> float:
        return _mean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return _stddev(self.samples_ts)


def _mean(values: list[int] | list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _stddev(values: list[int] | list[float]) -> float:
    """Sample standard deviation (n-1), 0 for fewer than two samples, as llama-bench reports it."""
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# Field name and type, in output order: llama-bench's names where they apply, plus n_seqs.
FIELDS: tuple[tuple[str, type], ...] = (
    ("build_commit", str),
    ("cpu_info", str),
    ("gpu_info", str),
    ("backends", str),
    ("model_filename", str),
    ("model_type", str),
    ("model_size", int),
    ("model_n_params", int),
    ("n_batch", int),
    ("n_ubatch", int),
    ("n_threads", int),
    ("type_k", str),
    ("type_v", str),
    ("n_prompt", int),
    ("n_gen", int),
    ("n_depth", int),
    ("n_seqs", int),
    ("test_time", str),
    ("avg_ns", int),
    ("stddev_ns", int),
    ("avg_ts", float),
    ("stddev_ts", float),
)
FIELD_NAMES = tuple(name for name, _ in FIELDS)


def record(r: BenchResult) -> dict[str, str | int | float]:
    """One result as llama-bench's flat record (without the per-sample arrays)."""
    i, m = r.inst, r.model
    values: dict[str, str | int | float] = {
        "build_commit": build_commit(),
        "cpu_info": cpu_info(),
        "gpu_info": gpu_info(m.backend),
        "backends": m.backend,
        "model_filename": m.filename,
        "model_type": m.type,
        "model_size": m.size,
        "model_n_params": m.n_params,
        "n_batch": i.n_batch,
        "n_ubatch": i.n_ubatch,
        "n_threads": i.n_threads,
        "type_k": m.kv_type,
        "type_v": m.kv_type,
        "n_prompt": i.n_prompt,
        "n_gen": i.n_gen,
        "n_depth": i.n_depth,
        "n_seqs": i.n_seqs,
        "test_time": r.test_time,
        "avg_ns": r.avg_ns,
        "stddev_ns": r.stddev_ns,
        "avg_ts": round(r.avg_ts, 6),
        "stddev_ts": round(r.stddev_ts, 6),
    }
    return {name: values[name] for name in FIELD_NAMES}


_INFO: dict[str, str] = {}


def build_commit() -> str:
    if "commit" not in _INFO:
        try:
            done = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=5,
            )
            _INFO["commit"] = done.stdout.strip() if done.returncode == 0 else "unknown"
        except (OSError, subprocess.SubprocessError):
            _INFO["commit"] = "unknown"
    return _INFO["commit"]


def cpu_info() -> str:
    if "cpu" not in _INFO:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        _INFO["cpu"] = name
    return _INFO["cpu"]


def gpu_info(backend: str) -> str:
    if backend == "CPU":
        return ""
    try:
        from numba import cuda

        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver or the simulator: nothing to report, not a failure
        return ""


# ---------------------------------------------------------------------------------------------------------
# Output formats


class Printer:
    """Streams results as they complete: begin(), row() per test, end()."""

    def __init__(self, out: TextIO, params: BenchParams) -> None:
        self.out = out
        self.params = params

    def begin(self) -> None:
        pass

    def row(self, r: BenchResult) -> None:
        raise NotImplementedError

    def end(self) -> None:
        pass

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def _csv_value(value: str | int | float) -> str:
    # llama-bench prints floats with six decimals and every value as text.
    return f"{value:.6f}" if isinstance(value, float) else str(value)


class CsvPrinter(Printer):
    def begin(self) -> None:
        self.write(",".join(FIELD_NAMES) + "\n")

    def row(self, r: BenchResult) -> None:
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerow(
            _csv_value(v) for v in record(r).values()
        )
        self.write(buf.getvalue())


def _json_record(r: BenchResult) -> dict[str, Any]:
    obj: dict[str, Any] = dict(record(r))
    obj["samples_ns"] = list(r.samples_ns)
    obj["samples_ts"] = [float(f"{ts:.6g}") for ts in r.samples_ts]
    return obj


class JsonPrinter(Printer):
    """An array of objects, laid out as llama-bench does (one field per line, samples inline)."""

    first = True

    def begin(self) -> None:
        self.write("[\n")

    def row(self, r: BenchResult) -> None:
        lines = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in _json_record(r).items()]
        sep = "" if self.first else ",\n"
        self.first = False
        self.write(sep + "  {\n" + ",\n".join(lines) + "\n  }")

    def end(self) -> None:
        self.write("\n]\n")


class JsonlPrinter(Printer):
    def row(self, r: BenchResult) -> None:
        self.write(json.dumps(_json_record(r)) + "\n")


class SqlPrinter(Printer):
    """SQLite statements for llama-bench's `llama_bench` table, so its comparison scripts read them."""

    TYPES = {str: "TEXT", int: "INTEGER", float: "REAL"}

    def begin(self) -> None:
        columns = ",\n".join(f"  {name} {self.TYPES[kind]}" for name, kind in FIELDS)
        self.write(f"CREATE TABLE IF NOT EXISTS llama_bench (\n{columns}\n);\n\n")

    def row(self, r: BenchResult) -> None:
        values = ", ".join("'" + _csv_value(v).replace("'", "''") + "'" for v in record(r).values())
        self.write(f"INSERT INTO llama_bench ({', '.join(FIELD_NAMES)}) VALUES ({values});\n")


@dataclass(frozen=True)
class Column:
    name: str  # header text
    width: int  # negative: left-aligned (text), positive: right-aligned (numbers), as in llama-bench
    value: Callable[[BenchResult], str]


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.2f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1_000_000_000 else f"{n / 1e9:.2f} B"


def _cell(text: str, width: int) -> str:
    # Widths count characters, not bytes: llama-bench's "+1 for the 2-byte ±" hack is not needed here.
    return f" {text:<{-width}} |" if width < 0 else f" {text:>{width}} |"


class MarkdownPrinter(Printer):
    """llama-bench's table: fixed columns, plus a column for each parameter swept or set to a non-default."""

    header_done = False
    cols: list[Column]

    def columns(self, backend: str) -> list[Column]:
        p = self.params
        cols = [
            Column("model", -30, lambda r: r.model.type),
            Column("size", 10, lambda r: _size(r.model.size)),
            Column("params", 10, lambda r: _params(r.model.n_params)),
            Column("backend", -10, lambda r: r.model.backend),
        ]
        if backend == "CPU" or p.threads_given:
            cols.append(Column("threads", 7, lambda r: str(r.inst.n_threads)))
        if p.n_batch != DEFAULT_N_BATCH:
            cols.append(Column("n_batch", 7, lambda r: str(r.inst.n_batch)))
        if p.n_ubatch != DEFAULT_N_UBATCH:
            cols.append(Column("n_ubatch", 8, lambda r: str(r.inst.n_ubatch)))
        cols.append(Column("test", 15, lambda r: r.inst.name))
        cols.append(Column("t/s", 20, lambda r: f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"))
        return cols

    def header(self, backend: str) -> None:
        self.cols = self.columns(backend)
        names = "".join(_cell(c.name, c.width) for c in self.cols)
        rule = "".join(f" {'-' * (abs(c.width) - 1)}{':' if c.width > 0 else '-'} |" for c in self.cols)
        self.write(f"|{names}\n|{rule}\n")
        self.header_done = True

    def row(self, r: BenchResult) -> None:
        if not self.header_done:
            self.header(r.model.backend)
        cells = "".join(_cell(c.value(r), c.width) for c in self.cols)
        self.write(f"|{cells}\n")

    def end(self) -> None:
        if not self.header_done:
            self.header("CPU")
        self.write(f"\nbuild: {build_commit()} ({PROG})\n")


PRINTERS: dict[str, type[Printer]] = {
    "md": MarkdownPrinter,
    "csv": CsvPrinter,
    "json": JsonPrinter,
    "jsonl": JsonlPrinter,
    "sql": SqlPrinter,
}


# ---------------------------------------------------------------------------------------------------------
# Running tests


def set_threads(n: int) -> int:
    """Use n compute threads (capped at Numba's pool size); returns the number actually used."""
    import numba

    used = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(used)
    return used


class Runner:
    """Runs tests on one loaded model and remembers how long its very first forward pass took."""

    def __init__(self, llm: LLM, log: Callable[[str], None], params: BenchParams) -> None:
        self.llm = llm
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

    def build_context(self, kv: KVCache, inst: Instance) -> None:
        """The untimed part before each run: the depth prefill, or each batched sequence's own prompt."""
        for s in range(inst.n_seqs):
            kv.clear(s)
        if inst.n_depth:
            self.prompt(kv, 0, self.random_tokens(inst.n_depth), inst.n_batch, inst.n_ubatch)
            for s in range(1, inst.n_seqs):
                copy_sequence(kv, 0, s, inst.n_depth)
        elif inst.n_seqs > 1:
            parts = [
                BatchPart(s, 0, self.random_tokens(SEQ_PROMPT_TOKENS).tolist()) for s in range(inst.n_seqs)
            ]
            self.forward(Batch.of(parts), kv)

    def run(self, inst: Instance, index: int, total: int) -> list[int]:
        p = self.params
        progress = self.log if p.progress else (lambda _msg: None)
        tag = f"benchmark {index}/{total}"
        kv = self.llm.new_cache(inst.n_seqs, inst.context_tokens + inst.n_prompt + inst.n_gen)
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


def copy_sequence(kv: KVCache, src: int, dst: int, n: int) -> None:
    """Give sequence dst the first n cells of src. The cache shares nothing between sequences, so dst
    still reads its own cells: the cost of a batched step is the same as with a context of its own."""
    kv.k[:, dst, :, :n] = kv.k[:, src, :, :n]
    kv.v[:, dst, :, :n] = kv.v[:, src, :, :n]
    kv.lengths[dst] = n


# ---------------------------------------------------------------------------------------------------------
# Main


Loader = Callable[[str | None, int], "LLM"]


def load_llm(model: str | None, n_threads: int, device: str = "cpu") -> LLM:
    from engine.llm import LLM  # imported here so --help and argument errors do not pay for the engine

    return LLM.load(model, device=device, n_threads=n_threads)


def _by_model(tests: list[Instance]) -> Iterator[tuple[str | None, list[Instance]]]:
    for model, group in itertools.groupby(tests, key=lambda t: t.model):
        yield model, list(group)


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
        runner = Runner(llm, log, params)
        warned: set[int] = set()
        for inst in group:
            index += 1
            if params.progress:
                log(f"benchmark {index}/{len(tests)}: starting")
            used = set_threads(inst.n_threads)
            if used != inst.n_threads and inst.n_threads not in warned:
                warned.add(inst.n_threads)
                log(f"warning: {inst.n_threads} threads requested, Numba's pool has {used}; running {used}")
            inst = dataclasses.replace(inst, n_threads=used)
            result = BenchResult(inst, info, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            first = runner.first_forward is None
            result.samples_ns = runner.run(inst, index, len(tests))
            if first and runner.first_forward is not None:
                log_first_token(log, label, runner.first_forward, load_start + load_s, started)
            if params.verbose:
                log(f"{inst.name}: samples_ns {result.samples_ns}")
            for printer in printers:
                printer.row(result)
    for printer in printers:
        printer.end()
    return 1 if failed else 0


def log_first_token(
    log: Callable[[str], None], label: str, first: tuple[float, float, str], loaded: float, started: float
) -> None:
    secs, end, stage = first
    log(
        f"{label}: first token {end - loaded:.3f} s after load, {end - started:.2f} s after start "
        f"(first forward pass: {stage}, {secs:.3f} s, including JIT compilation or cache loading)"
    )


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    params = parse_args(argv)
    load = functools.partial(load_llm, device=params.device)
    return run(params, sys.stdout, sys.stderr, load=load, started=started)


if __name__ == "__main__":
    sys.exit(main())
