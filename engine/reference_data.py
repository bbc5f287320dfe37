"""llama.cpp's reference files (its GBNF grammars and its models' chat templates), from PyPI.

llama-cpp-python's source distribution vendors llama.cpp, `grammars/*.gbnf` and
`models/templates/*.jinja` included. `llama_cpp_files("grammars")` downloads that sdist once with
`pip download`, checks its sha256, keeps only those two folders under
`~/.cache/llamba/reference/llama-cpp-python-<version>/` and returns the files. Like the model files
(engine/model_files.py): fetched from the package registry, verified, idempotent.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from engine.model_files import ModelFetchError, models_dir

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VENDORED = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
# folder name here -> (folder inside llama.cpp, file suffix)
FOLDERS = {"grammars": ("grammars/", ".gbnf"), "templates": ("models/templates/", ".jinja")}


class ReferenceDataError(ModelFetchError):
    pass


def reference_dir() -> Path:
    """Beside the models folder (`LLAMBA_MODELS_DIR` moves both)."""
    return models_dir().parent / "reference" / SDIST_FILE.removesuffix(".tar.gz").replace("_", "-")


def llama_cpp_files(folder: str) -> list[Path]:
    """The files of one folder ("grammars" or "templates"), sorted by name; fetched on first use."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown folder {folder!r} (known: {', '.join(FOLDERS)})")
    root = reference_dir()
    if not (root / ".complete").is_file():
        _fetch_into(root)
    return sorted((root / folder).glob(f"*{FOLDERS[folder][1]}"))


def _fetch_into(root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="llamba-reference-") as tmp:
        sdist = _download_sdist(Path(tmp))
        staging = Path(tmp) / "extracted"
        _extract(sdist, staging)
        (staging / ".complete").write_text(SDIST_SHA256 + "\n")
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), root)


def _download_sdist(dest: Path) -> Path:
    # --no-binary: the sdist, not a wheel (wheels carry neither folder). pip prepares the sdist's
    # metadata on the way (a few seconds, once).
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
    result = subprocess.run([*cmd, SDIST], capture_output=True, text=True)
    path = dest / SDIST_FILE
    if result.returncode != 0 or not path.is_file():
        tail = " ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise ReferenceDataError(f"could not download {SDIST} from the package registry: {tail}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise ReferenceDataError(f"{SDIST_FILE}: sha256 {digest} does not match {SDIST_SHA256}")
    return path


def _extract(sdist: Path, staging: Path) -> None:
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            target = _target_of(member.name)
            if target is None or not member.isfile():
                continue
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            out = staging / target
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(source.read())


def _target_of(name: str) -> str | None:
    """`grammars/json.gbnf` for a member we keep (directly inside one of the folders), else None."""
    for folder, (inside, suffix) in FOLDERS.items():
        prefix = _VENDORED + inside
        rest = name.removeprefix(prefix)
        if rest != name and "/" not in rest and rest.endswith(suffix):
            return f"{folder}/{rest}"
    return None
