"""llama.cpp's model cache, read offline: the Hugging Face hub layout llama-server downloads into.

People switching from llama-server already have their models there: `models--<org>--<repo>/snapshots/
<commit>/<file>.gguf`, the commit named by `refs/main` (else any ref). The folder is the first of
`LLAMA_CACHE`, `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`,
`~/.cache/huggingface/hub` (common/hf-cache.cpp). A model is named as llama-server names it,
`<org>/<repo>:<TAG>`, the tag being the quantization at the end of the file name (`-Q8_0.gguf` -> `Q8_0`,
upper case); without a tag, `Q4_K_M` then `Q8_0` then the first model file (common/download.cpp).
Nothing is ever downloaded here: Llamba fetches only its built-in models, from PyPI
(`engine/model_files.py`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})$", re.IGNORECASE)
TAG = re.compile(r"[-.](?P<tag>[A-Z0-9_]+)$", re.IGNORECASE)
REPO_ID = re.compile(r"^[A-Za-z0-9_]+(?:[./-][A-Za-z0-9_]+)*$")
COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
# Files beside a model that are not one (projectors, imatrix, speculative heads).
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


class CacheNameError(ValueError):
    """A name that is not `<org>/<repo>[:tag]`."""


@dataclass(frozen=True)
class CachedFile:
    repo: str  # org/repo
    path: str  # inside the snapshot, with forward slashes
    local: Path  # the snapshot entry (often a link into blobs/)

    @property
    def tag(self) -> str:
        return split_info(self.path)[1]

    @property
    def is_model(self) -> bool:
        name = self.path.rsplit("/", 1)[-1]
        return name.endswith(".gguf") and not any(word in name for word in NOT_MODELS)

    @property
    def is_first_part(self) -> bool:
        return split_info(self.path)[2] == 1


def cache_dir() -> Path:
    """The cache folder, looked up as llama.cpp looks it up."""
    for var, sub in (
        ("LLAMA_CACHE", ""),
        ("HF_HUB_CACHE", ""),
        ("HUGGINGFACE_HUB_CACHE", ""),
        ("HF_HOME", "hub"),
        ("XDG_CACHE_HOME", "huggingface/hub"),
    ):
        if value := os.environ.get(var):
            return Path(value) / sub if sub else Path(value)
    return Path.home() / ".cache" / "huggingface" / "hub"


def split_info(path: str) -> tuple[str, str, int]:
    """A GGUF file's prefix (tag included), tag (upper case, "" if none) and split index (1 if whole)."""
    prefix = path.removesuffix(".gguf")
    index = 1
    if m := SPLIT.match(prefix):
        prefix, index = m["prefix"], int(m["index"])
    tag = m["tag"].upper() if (m := TAG.search(prefix)) else ""
    return prefix, tag, index


def split_name(name: str) -> tuple[str, str]:
    """`org/repo[:tag]` -> (repo, tag); CacheNameError when it is not such a name."""
    repo, _, tag = name.partition(":")
    if repo.count("/") != 1 or not REPO_ID.match(repo):
        raise CacheNameError(f"{name!r} is not a <user>/<model>[:quant] name")
    return repo, tag


def is_cache_name(name: str) -> bool:
    try:
        split_name(name)
    except CacheNameError:
        return False
    return True


def _commit(repo_dir: Path) -> str | None:
    refs = repo_dir / "refs"
    found = None
    for ref in sorted(refs.iterdir()) if refs.is_dir() else ():
        text = ref.read_text().strip() if ref.is_file() else ""
        if COMMIT.match(text):
            if ref.name == "main":
                return text
            found = found or text
    return found


def cached_files(repo: str | None = None) -> list[CachedFile]:
    """Every file of the cache's current snapshots (of one repo, when named)."""
    root = cache_dir()
    if not root.is_dir():
        return []
    files = []
    for repo_dir in sorted(root.iterdir()):
        if not repo_dir.name.startswith("models--") or not repo_dir.is_dir():
            continue
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/")
        if (repo is not None and repo_id != repo) or not is_cache_name(repo_id):
            continue
        commit = _commit(repo_dir)
        snapshot = repo_dir / "snapshots" / commit if commit else None
        if snapshot is None or not snapshot.is_dir():
            continue
        for entry in sorted(snapshot.rglob("*")):
            if entry.is_file() or entry.is_symlink():
                files.append(CachedFile(repo_id, entry.relative_to(snapshot).as_posix(), entry))
    return files


def list_models() -> list[tuple[str, Path]]:
    """The cache's models, `org/repo:TAG` and the file (the first part of a split one)."""
    seen: dict[str, Path] = {}
    for f in cached_files():
        if f.is_model and f.is_first_part and f.tag:
            seen.setdefault(f"{f.repo}:{f.tag}", f.local)
    return list(seen.items())


def best_model(files: list[CachedFile], tag: str) -> CachedFile | None:
    """The file a tag names (`Q4_K_M`, `q8_0`...), as llama.cpp picks it; no tag: its defaults."""
    for want in (tag,) if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(want) + r"[.-]", re.IGNORECASE)
        for f in files:
            if f.is_model and f.is_first_part and pattern.search(f.path):
                return f
    if not tag:
        return next((f for f in files if f.is_model and f.is_first_part), None)
    return None


def resolve(name: str, file: str | None = None) -> Path | None:
    """The local file of `org/repo[:tag]` (or of that repo's `file`), or None when the cache lacks it."""
    repo, tag = split_name(name)
    files = cached_files(repo)
    if file:
        return next((f.local for f in files if f.path == file), None)
    found = best_model(files, tag)
    return found.local if found is not None else None


def remove(name: str) -> bool:
    """Remove a model from the cache: the snapshot entries of its tag (the whole repo without a tag);
    a link is removed, never what it points to outside the cache. Whether anything went."""
    repo, tag = split_name(name)
    files = cached_files(repo)
    doomed = [f for f in files if not tag or f.tag == tag.upper()]
    for f in doomed:
        target = f.local.resolve() if f.local.is_symlink() else None
        f.local.unlink(missing_ok=True)
        if target is not None and target.is_relative_to(cache_dir().resolve() / _folder(repo) / "blobs"):
            target.unlink(missing_ok=True)  # the blob the hub layout links it to
    return bool(doomed)


def _folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")
