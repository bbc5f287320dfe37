"""A llama.cpp model cache on disk for tests, laid out as the Hugging Face hub lays it out (what
llama-server's downloads leave): `models--<org>--<repo>/refs/main` naming a commit, `blobs/<sha>` holding
the bytes and `snapshots/<commit>/<file>` linking to them; or a snapshot entry linking to a model file
elsewhere (a shared model file, as the llama.cpp suite's harness makes)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_file(cache: Path, repo: str, name: str, content: bytes | Path) -> Path:
    """One file of `repo` at the cache's current snapshot; `content` is its bytes (kept as a blob the
    snapshot links to) or a file elsewhere (linked directly). The snapshot entry's path."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    entry = repo_dir / "snapshots" / COMMIT / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        entry.symlink_to(content)
        return entry
    blob = repo_dir / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    entry.symlink_to(os.path.relpath(blob, entry.parent))
    return entry
