"""Weights held once: the GGUF's mapped pages are released after repacking; `-lm mlock` locks the weights."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.gguf import GGUFFile
from engine.mlock import lock_arrays
from engine.models import load_model
from server.config.parse import parse_settings


def mapped_kib(path: str, address: int) -> tuple[int, int]:
    """(Size, Rss) in KiB of this process's mapping of `path` that holds `address`, from
    /proc/self/smaps (other mappings of the same file, from other tests' models, are not counted)."""
    size = rss = 0
    current = False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                start, end = (int(x, 16) for x in fields[0].split("-"))
                current = fields[-1] == path and start <= address < end
            elif current and fields[0] == "Size:":
                size += int(fields[1])
            elif current and fields[0] == "Rss:":
                rss += int(fields[1])
    return size, rss


def vm_locked_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmLck:"))


def test_the_files_pages_are_not_resident_after_load(smollm2_gguf: GGUFFile) -> None:
    """Packing reads every weight, faulting the whole file in; the model then drops those pages, so the
    only resident copy of the weights is the packed one."""
    g = GGUFFile(smollm2_gguf.path)
    model = load_model(g, cpu_backend())
    size, rss = mapped_kib(str(g.path), g.tensors["output_norm.weight"].data.ctypes.data)
    assert size * 1024 >= g.n_bytes
    assert rss * 1024 < 0.05 * g.n_bytes, f"{rss} KiB of the {size} KiB mapping still resident"
    assert model.packed_weights()  # the packed copy is what the model holds
    # The tensors still read correctly (pages fault back in from the page cache).
    norm = g.tensors["output_norm.weight"].data
    np.testing.assert_array_equal(np.asarray(model.output_norm), norm)


def test_lock_arrays_locks_their_pages() -> None:
    a = np.ones(16 * 1024, np.float32)  # 64 KiB: under the default RLIMIT_MEMLOCK of 8 MiB
    before = vm_locked_kib()
    result = lock_arrays([a, np.zeros(0, np.uint8)])
    assert result.error is None
    assert result.locked_bytes == a.nbytes
    assert vm_locked_kib() - before >= 64


@pytest.mark.parametrize(
    ("argv", "mode", "mlock"),
    [
        ([], "auto", False),
        (["-lm", "mlock"], "mlock", True),
        (["--load-mode", "mmap+mlock"], "mmap+mlock", True),
        (["--mlock"], "mlock", True),
        (["-lm", "none"], "none", False),
    ],
)
def test_load_mode_flags(argv: list[str], mode: str, mlock: bool) -> None:
    settings, ignored = parse_settings(argv)
    assert (settings.load_mode, settings.mlock, ignored) == (mode, mlock, [])


def test_bad_load_mode_exits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["-lm", "sometimes"])
    assert exc.value.code == 2
    assert "--load-mode" in capsys.readouterr().err
