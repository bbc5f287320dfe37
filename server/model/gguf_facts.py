"""A model file's facts as Ollama's `/api/show` and `/api/tags` report them: its size, modification time,
a digest, and its GGUF metadata as JSON values (long arrays, the vocabulary's, shown empty as Ollama
shows them without `verbose`).

The digest is not the file's sha256 (Ollama's blob digest): hashing a multi-gigabyte file would take
seconds to minutes. It is the sha256 of the file's resolved path, size and modification time, so it
changes when the file does and stays the same across restarts. The metadata is read once per file
version on a worker thread and kept.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from engine.gguf import GGUFFile

SHORT_ARRAY = 5  # Ollama shows longer arrays (vocabularies, merges) as [] unless asked to be verbose
HIDDEN_KEYS = frozenset({"general.name", "tokenizer.chat_template"})  # Ollama leaves these out


@dataclass(frozen=True)
class FileFacts:
    path: Path
    size: int  # bytes on disk
    modified: float  # POSIX time of the last modification
    digest: str  # "sha256:<hex>" of the path, size and mtime (see the module's docstring)
    metadata: dict[str, Any]  # the GGUF's keys as JSON values


async def file_facts(path: Path) -> FileFacts:
    """The facts of the model file at `path` (its metadata read off the event loop, once per version)."""
    resolved = path.resolve()
    stat = resolved.stat()
    return await anyio.to_thread.run_sync(_read, str(resolved), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int, size: int) -> FileFacts:
    gguf = GGUFFile(path)
    metadata = {k: json_value(v) for k, v in gguf.metadata.items() if k not in HIDDEN_KEYS}
    digest = hashlib.sha256(f"{path}\0{size}\0{mtime_ns}".encode()).hexdigest()
    return FileFacts(Path(path), size, mtime_ns / 1e9, f"sha256:{digest}", metadata)


def json_value(value: Any) -> Any:
    """A metadata value as JSON: numpy scalars and arrays as numbers and lists, an array longer than
    SHORT_ARRAY as []."""
    if isinstance(value, np.ndarray):
        return value.tolist() if len(value) <= SHORT_ARRAY else []
    if isinstance(value, list):
        return [json_value(v) for v in value] if len(value) <= SHORT_ARRAY else []
    if isinstance(value, np.generic):
        return value.item()
    return value
