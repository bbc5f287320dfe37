"""What the router knows of a catalogue model's file without loading it (Ollama's `/api/tags`, `/api/ps`,
`/api/pull`): whether it is on this machine, its size, time, digest and the facts its GGUF header gives
(architecture, parameter count, file type, trained context), in Ollama's words.

The header is read once per file (path, size and modification time), in a worker thread; a file that is
no GGUF the engine reads keeps its details empty. The digest is the file's sha256 where it is known
without hashing: a built-in model's (its spec), a llama.cpp cache model's (its blob's name); any other
file gets a digest of its path, size and time (it tells files and versions apart, it is not a content
hash: hashing a folder of multi-GB models on every listing would not be cheap).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.ftype import FTYPE_NAMES, ftype_name
from engine.gguf import GGUFFile
from engine.model_files import lookup, models_dir
from server.apis.ollama.models import parameter_size
from server.router.catalogue import SPLIT_SHARD, ModelEntry
from server.router.downloads import is_cached

_BLOB = re.compile(r"^[0-9a-f]{64}$")
# llama_ftype -> Ollama's name of a file type (its fs/ggml FileType strings).
OLLAMA_FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 38: "MXFP4",
}  # fmt: skip


@dataclass(frozen=True)
class HeaderFacts:
    """What a GGUF's header says, in Ollama's words ("" where it says nothing)."""

    family: str = ""
    parameter_size: str = ""
    quantization_level: str = ""
    context_length: int = 0


@dataclass(frozen=True)
class LocalModel:
    """A catalogue model's file on this machine."""

    path: Path
    size: int  # bytes on disk (every shard of a split model)
    modified: float  # the file's modification time (epoch seconds)
    digest: str  # 64 hex digits (see the module's docstring)
    facts: HeaderFacts = field(default_factory=HeaderFacts)

    def details(self) -> dict[str, Any]:
        """Ollama's `details` of a model."""
        family = self.facts.family
        return {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family] if family else None,
            "parameter_size": self.facts.parameter_size,
            "quantization_level": self.facts.quantization_level,
        }


def model_path(entry: ModelEntry) -> Path | None:
    """The file the model's child would load, if it is here: a built-in model's in Llamba's cache (a preset
    section may name one), else the entry's own path."""
    spec = lookup(entry.model)
    if spec is not None:
        return models_dir() / spec.filename if is_cached(spec) else None
    path = Path(entry.model)
    return path if path.is_file() else None


def local_model(entry: ModelEntry) -> LocalModel | None:
    """The model's file and what it says, or None when it is not on this machine (blocking: a thread's)."""
    path = model_path(entry)
    if path is None:
        return None
    stat = path.stat()
    spec = lookup(entry.model)
    shards = _shards(path)
    size = sum(p.stat().st_size for p in shards) if shards else stat.st_size
    if spec is not None:
        digest = spec.sha256
    else:
        digest = _blob_digest(path) or _identity_digest(path, stat.st_size, stat.st_mtime_ns)
    facts = header_facts(str(path), stat.st_size, stat.st_mtime_ns)
    return LocalModel(path, size, stat.st_mtime, digest, facts)


def _shards(path: Path) -> list[Path]:
    """Every file of a split model (`name-00001-of-0000N.gguf`), else none."""
    match = SPLIT_SHARD.match(path.name)
    if match is None:
        return []
    count = int(match["count"])
    names = (f"{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1))
    return [p for name in names if (p := path.with_name(name)).is_file()]


def _blob_digest(path: Path) -> str | None:
    """A llama.cpp cache file is a link to `blobs/<sha256>` (the hub's LFS objects)."""
    name = path.resolve().name
    return name if _BLOB.match(name) else None


def _identity_digest(path: Path, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(f"{path.resolve()}\0{size}\0{mtime_ns}".encode()).hexdigest()


@lru_cache(maxsize=256)
def header_facts(path: str, size: int, mtime_ns: int) -> HeaderFacts:
    """The file's header, read once per (path, size, time)."""
    try:
        gguf = GGUFFile(path)
    except (OSError, ValueError):
        return HeaderFacts()
    meta = gguf.metadata
    arch = str(meta.get("general.architecture", ""))
    context = gguf.arch_value("context_length", 0) if arch else 0
    name = ftype_name(meta, ((t.name, t.ggml_type) for t in gguf.tensors.values())).removeprefix("(guessed) ")
    ftype = next((k for k, v in FTYPE_NAMES.items() if v == name), None)
    quant = OLLAMA_FTYPES.get(ftype, name.split(" ")[0]) if ftype is not None else "unknown"
    return HeaderFacts(arch, parameter_size(gguf.n_params), quant, int(context or 0))
