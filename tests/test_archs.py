"""Each architecture family on a small seeded GGUF against llama.cpp's logits (golden/archs.json).

tests/synthetic_gguf.py rebuilds the very file llama.cpp ran (scripts/make_arch_goldens.py): random
float32 weights, two layers, a 320-token vocabulary, each family's metadata and tensor names. Every
position's logits must be within 1e-3 of llama.cpp's (max |difference| over the row, relative to the
row's largest |logit|) and have the same top token, run as one prompt batch and as a prompt half
followed by single-token decode steps. What each case checks:

- `qwen3`: per-head Q/K RMS norms, no biases, head_dim 64 under a 128-wide embedding, tied head;
- `llama3-rope-scaling`: Llama 3's `rope_freqs.weight` (one divisor per RoPE pair);
- `llama-linear-rope`: `rope.scaling.type` linear with a factor;
- `llama-biases`: the optional biases llama.cpp's llama takes (Q/K/V, output, gate, up, down);
- `mistral-nemo-style`: Mistral's `llama` files (base 1e6, head_dim from `attention.key_length`);
- `ministral3`: `mistral3` with YaRN (factor, betas, log multiplier) and the attention temperature;
- `phi3-short-rope` / `phi3-long-rope`: fused QKV and gate|up, partial rotary (24 of 32 dimensions),
  LongRoPE's short factors at a 256 context and long ones (with the attention factor) at 512, and the
  file's sliding window ignored as llama.cpp ignores it.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.gguf import SUPPORTED_ARCHITECTURES, GGUFFile, UnsupportedModelError
from engine.llm import LLM
from engine.models import ARCHITECTURES, LlamaModel, load_model
from engine.models.hparams import HParams
from tests.conftest import load_golden
from tests.server_process import ServerProcess, wait_until
from tests.synthetic_encoders import ENCODER_ARCHS
from tests.synthetic_gguf import CASES, UNSUPPORTED, ArchCase, prompt_tokens, write_gguf
from tests.synthetic_moe_gguf import CASES as MOE_CASES
from tests.synthetic_qwen35 import CASES as QWEN35_CASES

TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden("archs")["cases"]


def reference_logits(golden: dict, name: str) -> np.ndarray:
    entry = golden[name]
    return np.frombuffer(base64.b64decode(entry["logits_f32_base64"]), dtype="<f4").reshape(entry["shape"])


def load(case: ArchCase, folder: Path) -> LlamaModel:
    return load_model(GGUFFile(write_gguf(case, folder / f"{case.name}.gguf")), cpu_backend())


def prompt_then_decode(model: LlamaModel, tokens: list[int], n_ctx: int) -> np.ndarray:
    """Every position's logits with the first half as one prompt batch, then one token per step."""
    kv = model.new_cache(1, n_ctx)
    half = len(tokens) // 2
    rows = [model.forward(Batch.of([BatchPart(0, 0, tokens[:half], "all")]), kv)]
    for pos in range(half, len(tokens)):
        rows.append(model.forward(Batch.of([BatchPart(0, pos, [tokens[pos]])]), kv))
    return np.concatenate(rows)


def assert_matches(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    relative = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert relative.max() < TOLERANCE, f"worst position {relative.argmax()}: {relative.max():.2e}"
    np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_llama_cpp(name: str, golden: dict, tmp_path: Path) -> None:
    case = CASES[name]
    tokens = prompt_tokens(case)
    assert golden[name]["tokens"] == tokens and golden[name]["n_ctx"] == case.n_ctx  # the same model input
    model = load(case, tmp_path)
    want = reference_logits(golden, name)
    kv = model.new_cache(1, case.n_ctx)
    assert_matches(model.forward(Batch.of([BatchPart(0, 0, tokens, "all")]), kv), want)
    assert_matches(prompt_then_decode(model, tokens, case.n_ctx), want)


def test_every_listed_architecture_has_a_model_class() -> None:
    assert set(ARCHITECTURES) == set(SUPPORTED_ARCHITECTURES)
    moe = {case.arch for case in MOE_CASES.values()}  # tests/test_moe.py
    others = {"gemma3", "qwen2", "gemma4"}  # tests/test_gemma4.py has Gemma 4's
    hybrid = {case.arch for case in QWEN35_CASES.values()}  # tests/test_qwen35.py
    encoders = ENCODER_ARCHS  # tests/test_encoders.py
    covered = {case.arch for case in CASES.values()} | moe | hybrid | others | encoders
    assert covered == set(SUPPORTED_ARCHITECTURES)


def test_hyper_parameters_of_the_new_families(tmp_path: Path) -> None:
    qwen3 = HParams.from_gguf(GGUFFile(write_gguf(CASES["qwen3"], tmp_path / "q.gguf")))
    assert (qwen3.head_dim, qwen3.n_rot, qwen3.rope_neox, qwen3.rope_base) == (64, 64, True, 1e6)
    phi3 = HParams.from_gguf(GGUFFile(write_gguf(CASES["phi3-long-rope"], tmp_path / "p.gguf")))
    assert (phi3.head_dim, phi3.n_rot, phi3.rope_neox, phi3.sliding_window) == (32, 24, True, 0)
    mistral3 = HParams.from_gguf(GGUFFile(write_gguf(CASES["ministral3"], tmp_path / "m.gguf")))
    assert not mistral3.rope_neox


def test_unsupported_architecture_fails_at_load_with_one_line_naming_it(tmp_path: Path) -> None:
    path = write_gguf(UNSUPPORTED, tmp_path / "falcon.gguf")
    with pytest.raises(UnsupportedModelError) as failure:
        LLM.load(str(path))
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("unsupported architecture 'falcon'")
    assert "qwen3" in message  # it lists what is supported


def test_server_with_an_unsupported_architecture_exits_with_one_error_line(tmp_path: Path) -> None:
    path = write_gguf(UNSUPPORTED, tmp_path / "model.gguf")
    server = ServerProcess("-m", str(path))
    try:
        wait_until(lambda: server.proc.poll() is not None, 120, "the server to exit")
    finally:
        server.stop()
    assert server.proc.returncode == 1
    lines = [line for line in server.log().splitlines() if "falcon" in line]
    assert len(lines) == 1 and "unsupported architecture 'falcon'" in lines[0], server.log()
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("name", ["qwen3", "ministral3", "phi3-long-rope"])
def test_server_serves_the_family(name: str, golden: dict, tmp_path: Path) -> None:
    """End to end: llamba-server on the synthetic file, the case's tokens as the prompt; its greedy
    token and top log-probabilities are llama.cpp's last-position distribution."""
    case = CASES[name]
    path = write_gguf(case, tmp_path / f"{name}.gguf")
    server = ServerProcess("-m", str(path), "-c", str(case.n_ctx), "-np", "1").wait_healthy()
    try:
        body = {"prompt": prompt_tokens(case), "n_predict": 1, "temperature": 0, "n_probs": 3}
        reply = httpx.post(server.base_url + "/completion", json=body, timeout=60).json()
    finally:
        server.stop()
    last = reference_logits(golden, name)[-1].astype(np.float64)
    logprobs = last - last.max() - np.log(np.exp(last - last.max()).sum())
    (step,) = reply["completion_probabilities"]
    assert step["id"] == int(last.argmax())
    assert [top["id"] for top in step["top_logprobs"]] == np.argsort(-last)[:3].tolist()
    for top in step["top_logprobs"]:
        assert top["logprob"] == pytest.approx(logprobs[top["id"]], abs=1e-2)


def test_rope_of_an_unscaled_file_multiplies_by_exactly_one(tmp_path: Path) -> None:
    """No scaling keys, no factor tensors: every pair scale and the magnitude are 1, so the older models'
    outputs are bitwise what they were before RoPE scaling existed."""
    model = load(CASES["qwen3"], tmp_path)
    assert model.rope.long is None
    assert np.array_equal(np.asarray(model.rope.table.pair_scale), np.ones(32, dtype=np.float32))
    assert model.rope.table.mscale == 1.0


def test_unknown_rope_scaling_type_fails_with_its_name(tmp_path: Path) -> None:
    case = dataclasses.replace(CASES["llama-linear-rope"], metadata={"rope.scaling.type": "dynamic"})
    with pytest.raises(UnsupportedModelError, match="unsupported RoPE scaling type 'dynamic'"):
        load(case, tmp_path)


def test_a_file_with_tensors_the_model_does_not_use_is_refused(tmp_path: Path) -> None:
    """An up bias without its gate bias (a set Llamba cannot apply) and an unknown norm: refused with
    their names, not run without them."""

    def stray(case: ArchCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
        up_bias, norm = np.zeros(case.shape.n_ff, np.float32), np.ones(case.shape.n_embd, np.float32)
        return {"blk.1.ffn_up.bias": up_bias, "blk.0.extra_norm.weight": norm}

    case = dataclasses.replace(CASES["mistral-nemo-style"], extra=stray)
    with pytest.raises(UnsupportedModelError) as failure:
        load(case, tmp_path)
    unused = "blk.0.extra_norm.weight, blk.1.ffn_up.bias"
    assert str(failure.value) == f"llama tensors Llamba does not use: {unused}"
