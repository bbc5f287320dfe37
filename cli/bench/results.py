"""What a test measured and the flat record every output format prints: llama-bench's field names."""

from __future__ import annotations

import math
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cli.bench.options import Instance

if TYPE_CHECKING:
    from engine.llm import LLM


@dataclass(frozen=True)
class ModelInfo:
    filename: str
    type: str  # llama-bench's model column, e.g. "llama 135M Q4_1"
    size: int  # bytes of weights
    n_params: int
    backend: str

    @classmethod
    def of(cls, llm: LLM) -> ModelInfo:
        m = llm.model
        return cls(str(llm.path), llm.description, int(m.n_bytes), int(m.n_params), llm.backend.name)


@dataclass
class BenchResult:
    inst: Instance
    model: ModelInfo
    test_time: str
    samples_ns: list[int] = field(default_factory=list)
    draft_n: int = 0  # speculative tests: draft tokens verified per repetition, and accepted
    draft_accepted: int = 0
    active_ts: list[float] = field(default_factory=list)  # several sequences: the rate while all decode

    @property
    def samples_ts(self) -> list[float]:
        return [1e9 * self.inst.n_tokens / ns for ns in self.samples_ns]

    @property
    def avg_active_ts(self) -> float:
        return _mean(self.active_ts)

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


# Field name and type, in output order: llama-bench's names where they apply, plus n_seqs and the
# speculative tests' settings and counts.
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
    ("spec_type", str),  # Llamba's speculative tg tests (llama-server's flag names); "" elsewhere
    ("draft_max", int),
    ("draft_min", int),
    ("spec_ngram_size_n", int),
    ("spec_prompt", str),
    ("draft_n", int),
    ("draft_n_accepted", int),
    ("avg_ts_all_active", float),  # speculative tests: the rate while all sequences decode; else 0
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
        "type_k": i.type_k,
        "type_v": i.type_v,
        "n_prompt": i.n_prompt,
        "n_gen": i.n_gen,
        "n_depth": i.n_depth,
        "n_seqs": i.n_seqs,
        "spec_type": i.spec_type,
        "draft_max": i.draft_max if i.spec_type else 0,
        "draft_min": i.draft_min if i.spec_type else 0,
        "spec_ngram_size_n": i.ngram_n if i.spec_type else 0,
        "spec_prompt": i.spec_prompt,
        "draft_n": r.draft_n,
        "draft_n_accepted": r.draft_accepted,
        "avg_ts_all_active": round(r.avg_active_ts, 6),
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
