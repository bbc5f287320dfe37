"""llama.cpp's reference files (chat templates, GBNF grammars, server tests), from the llama-cpp-python sdist.

The sdist on PyPI vendors llama.cpp whole. It is downloaded once with `pip download` into
`~/.cache/llamba/reference/` (`LLAMBA_REFERENCE_DIR`), its sha256 checked against the value recorded here,
and the directories tests use are extracted next to it; any other file is extracted on first request.
Nothing from llama.cpp is committed to this repository: tests ask for `reference_file("models/templates/
X.jinja")` and get a path in the cache. `python -m engine.reference_data` (`make reference`) fetches it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from engine.model_files import sha256_of

SDIST_REQUIREMENT = "llama-cpp-python==0.3.36"
SDIST_FILENAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# Where llama.cpp's tree sits inside the sdist.
LLAMA_CPP_ROOT = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
# Extracted in one pass on the first fetch; other paths are extracted when asked for. The three C++
# tests are what scripts/make_llama_cpp_goldens.py reads (tests/golden/llama_cpp_cases.json).
EXTRACTED_DIRS = (
    "models/templates/",
    "grammars/",
    "tools/server/tests/unit/",
    "tests/test-grammar-integration.cpp",
    "tests/test-json-schema-to-grammar.cpp",
    "tests/test-chat.cpp",
)
# llama_cpp_files' folders: (folder below llama.cpp's root, file suffix).
FOLDERS = {"grammars": ("grammars", ".gbnf"), "templates": ("models/templates", ".jinja")}


class ReferenceDataError(RuntimeError):
    pass


def reference_dir() -> Path:
    default = Path.home() / ".cache" / "llamba" / "reference"
    return Path(os.environ.get("LLAMBA_REFERENCE_DIR", default)) / "llama-cpp-python-0.3.36"


def reference_file(path: str) -> Path:
    """The local copy of `path` (relative to llama.cpp's root), fetching and extracting as needed."""
    target = reference_dir() / "llama.cpp" / path
    if target.is_file():
        return target
    sdist = _extracted()
    if not target.is_file():
        _extract(sdist, lambda name: name == path)
    if not target.is_file():
        raise ReferenceDataError(f"{path} is not in {SDIST_FILENAME} (looked under {LLAMA_CPP_ROOT})")
    return target


def llama_cpp_files(folder: str) -> list[Path]:
    """Every file of one folder, sorted by name: "grammars" (*.gbnf) or "templates" (*.jinja)."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown folder {folder!r} (known: {', '.join(FOLDERS)})")
    inside, suffix = FOLDERS[folder]
    if not _stamp().is_file():
        _extracted()
    return sorted((reference_dir() / "llama.cpp" / inside).glob(f"*{suffix}"))


def _extracted() -> Path:
    """The verified sdist, with EXTRACTED_DIRS extracted beside it."""
    sdist = fetch_sdist()
    if not _stamp().is_file():
        _extract(sdist, lambda name: name.startswith(EXTRACTED_DIRS))
        _stamp().write_text(SDIST_SHA256 + "\n")
    return sdist


def fetch_sdist() -> Path:
    """The verified sdist in the cache, downloaded first if needed."""
    sdist = reference_dir() / SDIST_FILENAME
    if sdist.is_file() and sha256_of(sdist) == SDIST_SHA256:
        return sdist
    sdist.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llamba-reference-") as tmp:
        downloaded = _download(Path(tmp))
        if sha256_of(downloaded) != SDIST_SHA256:
            raise ReferenceDataError(f"{SDIST_FILENAME}: sha256 does not match (expected {SDIST_SHA256})")
        downloaded.replace(sdist)
    _stamp().unlink(missing_ok=True)  # a new sdist: extract again
    return sdist


def _download(dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "-q",
        "-d",
        str(dest),
    ]
    result = subprocess.run([*cmd, SDIST_REQUIREMENT], capture_output=True, text=True)
    path = dest / SDIST_FILENAME
    if result.returncode != 0 or not path.is_file():
        tail = " ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise ReferenceDataError(f"could not download {SDIST_REQUIREMENT} from the package registry: {tail}")
    return path


def _extract(sdist: Path, wanted: Callable[[str], bool]) -> None:
    """Extract the members whose path below llama.cpp's root satisfies `wanted`."""
    root = reference_dir() / "llama.cpp"
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith(LLAMA_CPP_ROOT):
                continue
            relative = member.name[len(LLAMA_CPP_ROOT) :]
            if ".." in Path(relative).parts or not wanted(relative):
                continue
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            if source is not None:
                target.write_bytes(source.read())


def _stamp() -> Path:
    return reference_dir() / "extracted.sha256"


def main() -> None:
    print(reference_file("models/templates/README.md").parent)


if __name__ == "__main__":
    main()
