"""Control vectors (engine/control_vector.py: --control-vector, --control-vector-scaled,
--control-vector-layer-range): llama.cpp's logits under SYNTHETIC control vectors
(tests/synthetic_control_vector.py, tests/golden/control_vector.json) within tests/test_lora.py's bounds,
the files summed with their scales, the layer range, and a vector for another width refused in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.control_vector import ControlVectorError, apply_control_vector, load_control_vectors
from engine.model_files import resolve
from tests.conftest import load_golden
from tests.server_process import ServerProcess, wait_until
from tests.synthetic_control_vector import write_control_vector
from tests.synthetic_lora import sha256
from tests.test_lora import MEDIAN_GAP, NEAR_TIE, TOP5_GAP, _steps


@pytest.fixture
def plain_smollm2(smollm2_llm) -> Iterator:  # type: ignore[no-untyped-def]
    """The shared SmolLM2, its control vectors taken off again after the test."""
    yield smollm2_llm
    smollm2_llm.model.control = None


def _files(tmp_path: Path, golden: dict, seeds_scales: list) -> list[tuple[Path, float]]:
    out = []
    for seed, scale in seeds_scales:
        case = golden["files"][str(seed)]
        path = write_control_vector(
            resolve(golden["model"]), tmp_path / f"cvec-{seed}.gguf", **case["kwargs"]
        )
        assert sha256(path) == case["sha256"], "the synthetic control vector is not the file llama.cpp ran"
        out.append((path, scale))
    return out


@pytest.mark.parametrize("key", ["single", "summed_range"])
def test_logits_match_llama_cpp(key: str, tmp_path: Path, plain_smollm2) -> None:  # type: ignore[no-untyped-def]
    golden = load_golden("control_vector")
    want = golden["cases"][key]
    llm = plain_smollm2
    base = _steps(llm, want["tokens"], [s["id"] for s in want["steps"]], ())
    apply_control_vector(
        llm.model, load_control_vectors(_files(tmp_path, golden, want["files"])), *want["range"]
    )
    mine = _steps(llm, want["tokens"], [s["id"] for s in want["steps"]], ())
    gaps, top5, moved = [], [], []
    for i, (step, lp, lp0) in enumerate(zip(want["steps"], mine, base, strict=True)):
        top = step["top"]
        gaps.append(abs(lp[top[0][0]] - top[0][1]))
        top5.extend(abs(lp[t] - logprob) for t, logprob in top[:5])
        moved.append(abs(lp[top[0][0]] - lp0[top[0][0]]))
        if top[0][1] - top[1][1] >= NEAR_TIE:
            assert int(np.argmax(lp)) == top[0][0], f"{key} step {i}"
    assert np.median(gaps) <= MEDIAN_GAP, f"{key}: median gap {np.median(gaps):.3f}"
    assert np.mean(top5) <= TOP5_GAP, f"{key}: top-5 mean gap {np.mean(top5):.3f}"
    assert max(moved) > 1.0, "the control vector does not move the logits: the comparison would say nothing"


def test_files_are_summed_with_their_scales_and_the_range_applies(tmp_path: Path, plain_smollm2) -> None:  # type: ignore[no-untyped-def]
    base = plain_smollm2.path
    a = write_control_vector(base, tmp_path / "a.gguf", seed=0)
    b = write_control_vector(base, tmp_path / "b.gguf", seed=1)
    one, two = load_control_vectors([(a, 1.0)]), load_control_vectors([(b, 1.0)])
    both = load_control_vectors([(a, 0.5), (b, -2.0)])
    assert sorted(both.directions) == list(range(1, 30)) and both.n_embd == 576
    for layer in (1, 17, 29):
        want = one.directions[layer] * np.float32(0.5) + two.directions[layer] * np.float32(-2.0)
        np.testing.assert_allclose(both.directions[layer], want, rtol=1e-6, atol=1e-7)
    apply_control_vector(plain_smollm2.model, both, 3, 20)
    assert sorted(plain_smollm2.model.control) == list(range(3, 21))
    apply_control_vector(plain_smollm2.model, both)  # llama.cpp's default: layers 1 to the last
    assert sorted(plain_smollm2.model.control) == list(range(1, 30))


def test_a_vector_for_another_width_is_refused_in_one_line(tmp_path: Path, plain_smollm2) -> None:  # type: ignore[no-untyped-def]
    wide = write_control_vector(plain_smollm2.path, tmp_path / "wide.gguf", n_embd=640)
    with pytest.raises(ControlVectorError) as err:
        apply_control_vector(plain_smollm2.model, load_control_vectors([(wide, 1.0)]))
    assert str(err.value) == "control vector n_embd (640) does not match the model's (576)"
    narrow = write_control_vector(plain_smollm2.path, tmp_path / "narrow.gguf")
    with pytest.raises(ControlVectorError, match="640 values per direction, the others have 576"):
        load_control_vectors([(narrow, 1.0), (wide, 1.0)])
    assert plain_smollm2.model.control is None


def test_a_server_with_a_vector_for_another_model_fails_its_load(tmp_path: Path) -> None:
    wide = write_control_vector(resolve("smollm2"), tmp_path / "wide.gguf", n_embd=640)
    proc = ServerProcess("-m", "smollm2", "--control-vector-scaled", f"{wide}:0.5")
    why = "control vector n_embd (640) does not match the model's (576)"
    try:
        wait_until(lambda: why in proc.log(), 120, "the load failure")
        assert sum(why in line for line in proc.log().splitlines()) >= 1
    finally:
        proc.stop()
