"""The Qwen3.5 hybrids (`qwen35`, `qwen35moe`, `qwen3next`) on small seeded GGUFs against llama.cpp's
logits (golden/qwen35.json, scripts/make_qwen35_goldens.py; tests/synthetic_qwen35.py rebuilds the very
files llama.cpp ran, their sha256 checked).

Every position of an 80-token prompt, run as one batch, as a prompt half then single-token decode
steps, and in uneven chunks (5, 17, 1, 30, 27 tokens: the conv tail and the delta-rule state carried
across chunk ends). Bounds:

- float32 weights: every position's logits within 1e-3 of llama.cpp's (max |difference| over the row,
  relative to the row's largest |logit|, as tests/test_archs.py) and the same top token;
- Q8_0 and Q4_K_M weights: each of the prompt's first 16 tokens as the first token of its own sequence
  (attention over one cell is exact on both sides: the formats, the int8 activations and the
  recurrent layers alone) within 1e-3 but for near ties (at most 1 token in 8, within 5e-2), and the
  prompt with tests/test_moe.py's quantized bars: the same top token wherever llama.cpp's top two are 0.1
  apart in log-probability, a median |delta log-probability| of llama.cpp's token within 0.03. Past the
  first token llama.cpp rounds queries and probabilities to f16 in its attention, and the int8
  activations amplify that; the recurrent state then carries each such difference to every later token
  (traced on a 4-layer Q8_0 file: the three Gated DeltaNet blocks' outputs match llama.cpp to 1.4e-7
  where their input does). The quantized runs are bitwise the same in every chunking.

Also: two or three sequences at different positions in one batch give each one's logits alone, bit for
bit; a checkpoint of the recurrent state restores it; the hybrid memory's layout; llamba-server serving
the model; the refusals.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.memory.hybrid import HybridMemory
from engine.models import LlamaModel, load_model
from engine.models.qwen35_layers import text_rope_pairs
from tests.conftest import load_golden
from tests.server_process import ServerProcess
from tests.synthetic_qwen35 import CASES, Qwen35Case, model_tensors, prompt_tokens, write_gguf

TOLERANCE = 1e-3
CONFIDENT = 0.1
# One int8 activation that rounds the other way at a near tie, carried through the later layers: up to
# 2.8e-2 of the logits (qwen35-q8_0 on the portable level; 1.5e-2 for qwen3next-q8_0 on avx512-vnni).
NEAR_TIE = 5e-2
FLOAT = [name for name, case in CASES.items() if case.types == "F32"]
QUANTIZED = [name for name, case in CASES.items() if case.types != "F32"]
CHUNKINGS = {
    "one batch": [80],
    "prompt half then decode": [40] + [1] * 40,
    "uneven chunks": [5, 17, 1, 30, 27],
}


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden("qwen35")["cases"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, golden: dict) -> dict[str, LlamaModel]:
    """Each case's model, loaded once, from the file llama.cpp ran (same sha256)."""
    folder, loaded = tmp_path_factory.mktemp("qwen35"), {}
    for name, case in CASES.items():
        path = write_gguf(case, folder / f"{name}.gguf")
        assert hashlib.sha256(path.read_bytes()).hexdigest() == golden[name]["sha256"], name
        assert golden[name]["tokens"] == prompt_tokens(case) and golden[name]["n_ctx"] == case.n_ctx
        loaded[name] = load_model(GGUFFile(path), cpu_backend())
    return loaded


def logits_of(entry: dict, key: str = "logits_f32_base64") -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry[key]), dtype="<f4").reshape(-1, entry["shape"][1])


def in_chunks(model: LlamaModel, tokens: list[int], n_ctx: int, sizes: list[int]) -> np.ndarray:
    """Every position's logits, the tokens fed `sizes` at a time into one sequence."""
    memory, rows, pos = model.new_cache(1, n_ctx), [], 0
    for n in sizes:
        rows.append(model.forward(Batch.of([BatchPart(0, pos, tokens[pos : pos + n], "all")]), memory))
        pos += n
    assert pos == len(tokens)
    return np.concatenate(rows)


def relative(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("name", FLOAT)
def test_float_logits_match_llama_cpp(name: str, chunking: str, models: dict, golden: dict) -> None:
    case, want = CASES[name], logits_of(golden[name])
    got = in_chunks(models[name], prompt_tokens(case), case.n_ctx, CHUNKINGS[chunking])
    per_position = relative(got, want)
    assert per_position.max() < TOLERANCE, f"worst position {per_position.argmax()}: {per_position.max():.2e}"
    np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_logits_match_llama_cpp(name: str, models: dict, golden: dict) -> None:
    case, entry, model = CASES[name], golden[name], models[name]
    tokens = prompt_tokens(case)
    want_first = logits_of(entry, "first_logits_f32_base64")
    firsts = Batch.of([BatchPart(i, 0, [t]) for i, t in enumerate(tokens[: len(want_first)])])
    first = model.forward(firsts, model.new_cache(len(want_first), 8))
    np.testing.assert_array_equal(first.argmax(axis=1), want_first.argmax(axis=1))
    per_token = relative(first, want_first)
    assert (per_token > TOLERANCE).sum() <= len(per_token) // 8 and per_token.max() < NEAR_TIE, per_token
    runs = [in_chunks(model, tokens, case.n_ctx, sizes) for sizes in CHUNKINGS.values()]
    for run in runs[1:]:
        np.testing.assert_array_equal(run, runs[0])
    mine, theirs = log_softmax(runs[0]), log_softmax(logits_of(entry))
    top, ranked = theirs.argmax(axis=1), np.sort(theirs, axis=1)
    confident = ranked[:, -1] - ranked[:, -2] >= CONFIDENT
    np.testing.assert_array_equal(mine.argmax(axis=1)[confident], top[confident])
    rows = np.arange(len(top))
    assert np.median(np.abs(mine[rows, top] - theirs[rows, top])) <= 0.03


@pytest.mark.parametrize("name", ["qwen35-q8_0", "qwen35moe-q8_0", "qwen3next-q8_0"])
def test_outputs_are_bitwise_independent_of_the_batch(name: str, models: dict) -> None:
    """Three sequences alone, then together: a prompt chunk beside another sequence deep into its state
    and a third's decode tokens, in one batch. The same logits, bit for bit."""
    model = models[name]
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 300, n).tolist() for n in (30, 44, 12)]
    splits = [(0, 20), (30, 40), (0, 11)]  # (already absorbed, then a chunk up to here); the rest decoded

    def run(memory: HybridMemory, seq: int, prompt: list[int]) -> np.ndarray:
        done, upto = splits[seq]
        rows = [model.forward(Batch.of([BatchPart(seq, done, prompt[done:upto], "all")]), memory)]
        for pos in range(upto, len(prompt)):
            rows.append(model.forward(Batch.of([BatchPart(seq, pos, [prompt[pos]])]), memory))
        return np.concatenate(rows)

    def absorb(memory: HybridMemory) -> None:
        for seq, prompt in enumerate(prompts):
            if splits[seq][0]:
                model.forward(Batch.of([BatchPart(seq, 0, prompt[: splits[seq][0]], "none")]), memory)

    alone_memory = model.new_cache(3, 64)
    absorb(alone_memory)
    alone = [run(alone_memory, seq, prompt) for seq, prompt in enumerate(prompts)]
    memory = model.new_cache(3, 64)
    absorb(memory)
    parts = [
        BatchPart(seq, splits[seq][0], p[splits[seq][0] : splits[seq][1]], "all")
        for seq, p in enumerate(prompts)
    ]
    together = [[] for _ in prompts]
    out = model.forward(Batch.of(parts), memory)
    starts = np.cumsum([0] + [splits[s][1] - splits[s][0] for s in range(3)])
    for seq in range(3):
        together[seq].append(out[starts[seq] : starts[seq + 1]])
    for step in range(max(len(p) - splits[s][1] for s, p in enumerate(prompts))):
        live = [s for s, p in enumerate(prompts) if splits[s][1] + step < len(p)]
        batch = Batch.of([BatchPart(s, splits[s][1] + step, [prompts[s][splits[s][1] + step]]) for s in live])
        for s, row in zip(live, model.forward(batch, memory), strict=True):
            together[s].append(row[None])
    for seq in range(3):
        np.testing.assert_array_equal(np.concatenate(together[seq]), alone[seq])


def test_a_checkpoint_restores_the_recurrent_state(models: dict) -> None:
    """Cut back to a checkpoint after more tokens were absorbed, then go on: the logits of one batch."""
    case, model = CASES["qwen35-q8_0"], models["qwen35-q8_0"]
    tokens = prompt_tokens(case)
    whole = in_chunks(model, tokens, case.n_ctx, [len(tokens)])
    memory = model.new_cache(1, case.n_ctx)
    model.forward(Batch.of([BatchPart(0, 0, tokens[:40], "none")]), memory)
    memory.checkpoint(0)
    model.forward(Batch.of([BatchPart(0, 40, tokens[40:60], "none")]), memory)
    assert memory.truncate(0, 50) == 40
    rest = model.forward(Batch.of([BatchPart(0, 40, tokens[40:], "all")]), memory)
    np.testing.assert_array_equal(rest, whole[40:])


def test_hybrid_memory_layout(models: dict) -> None:
    """Attention layers get KV cells, Gated DeltaNet layers a conv tail and a delta-rule state; a file's
    multi-token-prediction block is not part of the trunk."""
    model = models["qwen35-f32"]
    assert model.hp.recurrent == (True, True, False, True, True, False)
    assert model.kv_index == {2: 0, 5: 1} and model.recurrent_index == {0: 0, 1: 1, 3: 2, 4: 3}
    memory = model.new_cache(3, 128)
    assert isinstance(memory, HybridMemory) and not memory.can_shift
    assert memory.kv.k.shape[:4] == (2, 3, 2, 128)
    assert memory.recurrent.conv.shape == (4, 3, 3, 512)  # d_conv - 1, 2 x 2 key heads x 64 + 4 x 64
    assert memory.recurrent.ssm.shape == (4, 3, 4, 64, 64)
    assert model.k_head.tolist() == [0, 1, 0, 1]  # Qwen3.5 tiles the value heads
    assert models["qwen3next-f32"].k_head.tolist() == [0, 0, 1, 1]  # Qwen3-Next groups them
    mtp = models["qwen35-f32-mtp"]
    assert (mtp.hp.n_layer, mtp.hp.n_layer_all, len(mtp.layers)) == (8, 9, 8)
    assert mtp.kv_index == {3: 0, 6: 1}  # attention.recurrent_layers, not the interval (3 and 7)
    assert model.hp.rope_neox and model.hp.n_rot == 16 and model.hp.head_dim == 64


def test_text_positions_turn_the_m_rope_pairs_of_three_sections() -> None:
    """Interleaved M-RoPE: pair i takes section (i mod sum) mod 3's position while that section has
    pairs left; a fourth section's position is 0 for text (no turn). Qwen3.5's [11, 11, 10, 0] turns
    all 32 pairs by the token's position."""
    assert text_rope_pairs((11, 11, 10, 0), 32).all()
    assert text_rope_pairs((1, 1, 1, 1), 8).tolist() == [1, 1, 1, 0, 1, 1, 1, 0]
    assert text_rope_pairs((3, 1, 1), 5).tolist() == [1, 1, 1, 1, 0]


def test_server_serves_the_hybrid(golden: dict, tmp_path: Path) -> None:
    """End to end: llamba-server on the synthetic Qwen3.5, the case's tokens as the prompt, twice (the
    second time from what the slot kept); the greedy token and top log-probabilities are llama.cpp's
    last-position distribution both times."""
    name = "qwen35-q8_0"
    path = write_gguf(CASES[name], tmp_path / f"{name}.gguf")
    server = ServerProcess("-m", str(path), "-c", "256", "-np", "1").wait_healthy()
    body = {"prompt": golden[name]["tokens"], "n_predict": 1, "temperature": 0, "n_probs": 3}
    try:
        replies = [
            httpx.post(server.base_url + "/completion", json=body, timeout=60).json() for _ in range(2)
        ]
    finally:
        server.stop()
    last = logits_of(golden[name])[-1].astype(np.float64)
    logprobs = last - last.max() - np.log(np.exp(last - last.max()).sum())
    for reply in replies:
        (step,) = reply["completion_probabilities"]
        assert step["id"] == int(last.argmax())
        # llama.cpp's second and third are 0.028 apart, inside the 3e-2 each value is held to: which comes
        # first is a near tie (CI at avx512-vnni kept llama.cpp's order; native avx2 on AMD znver3 swaps it)
        assert sorted(top["id"] for top in step["top_logprobs"]) == sorted(np.argsort(-last)[:3].tolist())
        ours = [top["logprob"] for top in step["top_logprobs"]]
        assert ours == sorted(ours, reverse=True)
        for top in step["top_logprobs"]:
            assert top["logprob"] == pytest.approx(logprobs[top["id"]], abs=3e-2)


def test_a_non_cpu_backend_is_refused_with_one_line(tmp_path: Path) -> None:
    path = write_gguf(CASES["qwen35-q8_0"], tmp_path / "m.gguf")
    with pytest.raises(UnsupportedModelError) as failure:
        load_model(GGUFFile(path), dataclasses.replace(cpu_backend(), name="CUDA", delta_net=None))
    assert str(failure.value) == "qwen35: the Gated DeltaNet layers run on the CPU backend only, not CUDA"


def test_qwen3next_legacy_fused_ssm_in_is_refused_naming_it(tmp_path: Path) -> None:
    case: Qwen35Case = CASES["qwen3next-q8_0"]
    tensors = model_tensors(case)
    qkv, _ = tensors["blk.0.attn_qkv.weight"]
    tensors["blk.0.ssm_in.weight"] = (qkv, "Q8_0")
    with pytest.raises(UnsupportedModelError) as failure:
        load_model(GGUFFile(write_gguf(case, tmp_path / "m.gguf", tensors)), cpu_backend())
    assert str(failure.value) == "qwen3next: legacy fused blk.0.ssm_in.weight (reconvert the model)"
