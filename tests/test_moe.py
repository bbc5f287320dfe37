"""Mixture-of-experts families on small seeded GGUFs against llama.cpp's logits (golden/moe_archs.json).

tests/synthetic_moe_gguf.py rebuilds the very files llama.cpp ran (scripts/make_moe_goldens.py; their
sha256 is checked): qwen3moe, qwen2moe (with its shared expert) and Mixtral (`llama` with experts), in
float32, Q8_0 and a Q4_K_M-style mix, and gpt-oss (sinks, sliding windows, YaRN, biases, its routing
and clamped SwiGLU) in float32 and with MXFP4 experts; two layers, 8-16 experts of which 2-4 are used.
Bounds:

- each prompt token as the first token of its own sequence (attention over one cell is exact on both
  sides, so only the router, the experts and the weight formats are compared), all in one batch, so
  the batch's tokens are routed to most of the experts at once: the same top token everywhere, every
  token's logits within 1e-3 of the largest |logit| except where an int8 activation lands on a
  rounding boundary (tests/test_quant_models.py's rule: at most 1 token in 8, within 2e-2); with gpt-oss's
  live sinks a first token's attention weight is below 1, which llama.cpp rounds to f16 for the value
  product, so its quantized case takes the prompt's bars (its `-no-sinks` twin keeps the tight ones);
- the prompt, as one batch and as a prompt half then single-token decode steps: float32 within 1e-3
  and the same top token at every position (tests/test_archs.py's bar); the quantized mixes with
  llama.cpp's f16 rounding of queries and probabilities in its attention amplified by the int8
  activations (docs/numerics.md): the same top token wherever llama.cpp's top two are 0.1 apart in
  log-probability, and a median |delta log-probability| of llama.cpp's token within 0.03.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import quants as gguf_quants

from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.cpu import ops
from engine.cpu.experts import pack_experts_for_cpu, router_logits, swiglu_oai
from engine.cpu.matmul import BYTE_DOT, matmul
from engine.cpu.matmul.experts import experts_matmul
from engine.cpu.sinks import apply_sinks
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.models import LlamaModel, load_model
from engine.models.mixtral import MixtralModel
from engine.models.moe import Dispatch, Routing, route
from engine.quant import QType, dequantize
from tests.conftest import load_golden
from tests.synthetic_moe_gguf import CASES, MoeCase, model_tensors, prompt_tokens, write_gguf
from tests.synthetic_quant_gguf import random_matrix

TOLERANCE = 1e-3
CONFIDENT = 0.1  # llama.cpp's top two this far apart in log-probability: the top token must agree


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden("moe_archs")["cases"]


def logits_of(entry: dict, key: str = "logits_f32_base64") -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry[key]), dtype="<f4").reshape(entry["shape"])


def load(case: MoeCase, folder: Path) -> tuple[LlamaModel, Path]:
    path = write_gguf(case, folder / f"{case.name}.gguf")
    return load_model(GGUFFile(path), cpu_backend()), path


def relative(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def assert_prompt_matches(got: np.ndarray, want: np.ndarray, quantized: bool) -> None:
    assert got.shape == want.shape
    if not quantized:
        assert relative(got, want).max() < TOLERANCE
        np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))
        return
    mine, theirs = log_softmax(got), log_softmax(want)
    top = theirs.argmax(axis=1)
    ranked = np.sort(theirs, axis=1)
    confident = ranked[:, -1] - ranked[:, -2] >= CONFIDENT
    np.testing.assert_array_equal(mine.argmax(axis=1)[confident], top[confident])
    rows = np.arange(len(top))
    assert np.median(np.abs(mine[rows, top] - theirs[rows, top])) <= 0.03


def prompt_then_decode(model: LlamaModel, tokens: list[int], n_ctx: int) -> np.ndarray:
    kv = model.new_cache(1, n_ctx)
    half = len(tokens) // 2
    rows = [model.forward(Batch.of([BatchPart(0, 0, tokens[:half], "all")]), kv)]
    for pos in range(half, len(tokens)):
        rows.append(model.forward(Batch.of([BatchPart(0, pos, [tokens[pos]])]), kv))
    return np.concatenate(rows)


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_llama_cpp(name: str, golden: dict, tmp_path: Path) -> None:
    case, entry = CASES[name], golden[name]
    tokens = prompt_tokens(case)
    assert entry["tokens"] == tokens and entry["n_ctx"] == case.n_ctx
    model, path = load(case, tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]  # the file llama.cpp ran
    first = model.forward(
        Batch.of([BatchPart(i, 0, [t]) for i, t in enumerate(tokens)]), model.new_cache(len(tokens), 8)
    )
    want_first = logits_of(entry, "first_logits_f32_base64")
    quantized = case.types != "F32"
    if quantized and case.arch == "gpt-oss" and case.sink > -1000:
        assert_prompt_matches(first, want_first, quantized)
    else:
        np.testing.assert_array_equal(first.argmax(axis=1), want_first.argmax(axis=1))
        per_token = relative(first, want_first)
        assert (per_token > TOLERANCE).sum() <= len(tokens) // 8 and per_token.max() < 2e-2, per_token
    want = logits_of(entry)
    full = model.forward(Batch.of([BatchPart(0, 0, tokens, "all")]), model.new_cache(1, case.n_ctx))
    assert_prompt_matches(full, want, quantized)
    assert_prompt_matches(prompt_then_decode(model, tokens, case.n_ctx), want, quantized)


def test_mixtral_is_llama_with_experts(tmp_path: Path) -> None:
    model, _ = load(CASES["mixtral-q8_0"], tmp_path)
    assert isinstance(model, MixtralModel)
    assert model.hp.arch == "llama" and not model.hp.rope_neox  # llama's RoPE pairs, not NeoX's


@pytest.mark.parametrize("name", ["qwen3moe-q4_k_m", "qwen2moe-q8_0", "mixtral-q8_0", "gpt-oss-mxfp4"])
def test_outputs_are_bitwise_independent_of_the_batch(name: str, tmp_path: Path) -> None:
    """Three sequences alone, then together in mixed batches (a prompt chunk beside other sequences'
    decode tokens, routed to different experts in the same step): the same logits, bit for bit, and
    each expert runs over all of its tokens of a step at once."""
    case = CASES[name]
    model, _ = load(case, tmp_path)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 300, n).tolist() for n in (9, 5, 12)]
    alone = []
    for prompt in prompts:
        kv = model.new_cache(1, 64)
        rows = [model.forward(Batch.of([BatchPart(0, 0, prompt[:-1], "all")]), kv)]
        rows.append(model.forward(Batch.of([BatchPart(0, len(prompt) - 1, prompt[-1:])]), kv))
        alone.append(np.concatenate(rows))
    kv = model.new_cache(3, 64)
    first = model.forward(Batch.of([BatchPart(i, 0, p[:-1], "all") for i, p in enumerate(prompts)]), kv)
    chosen = model.layers[0].moe.last_choice
    assert len(np.unique(chosen)) > case.n_used  # the batch's tokens went to different experts
    assert len({tuple(sorted(row)) for row in chosen.tolist()}) > 1
    last = model.forward(Batch.of([BatchPart(i, len(p) - 1, p[-1:]) for i, p in enumerate(prompts)]), kv)
    starts = np.cumsum([0] + [len(p) - 1 for p in prompts])
    for i in range(3):
        together = np.concatenate([first[starts[i] : starts[i + 1]], last[i : i + 1]])
        np.testing.assert_array_equal(together, alone[i])


def _per_expert_layout(case: MoeCase) -> dict[str, tuple[np.ndarray, str]]:
    """The case's tensors with layer 0's experts as old Mixtral conversions wrote them: one 2-D tensor
    per expert (`ffn_gate.<e>.weight`)."""
    tensors = {}
    for name, (data, kind) in model_tensors(case).items():
        if name.startswith("blk.0.") and "_exps." in name:
            for e in range(case.n_expert):
                tensors[name.replace("_exps.", f".{e}.")] = (np.ascontiguousarray(data[e]), kind)
        else:
            tensors[name] = (data, kind)
    return tensors


def test_an_unsupported_expert_layout_fails_at_load_with_one_line_naming_it(tmp_path: Path) -> None:
    case = CASES["mixtral-q8_0"]
    path = write_gguf(case, tmp_path / "old-mixtral.gguf", _per_expert_layout(case))
    with pytest.raises(UnsupportedModelError) as failure:
        load_model(GGUFFile(path), cpu_backend())
    assert str(failure.value) == "llama: unsupported expert layout (blk.0.ffn_gate.0.weight)"


def test_missing_expert_metadata_fails_at_load_naming_the_key(tmp_path: Path) -> None:
    """Per-layer expert counts (an array where one integer is expected) are refused by name."""
    case = dataclasses.replace(CASES["qwen3moe-q8_0"], name="per-layer-counts")
    path = write_gguf(case, tmp_path / "m.gguf", used_count=[4, 4])
    with pytest.raises(UnsupportedModelError) as failure:
        load_model(GGUFFile(path), cpu_backend())
    message = str(failure.value)
    assert "\n" not in message and message.startswith(
        "qwen3moe: qwen3moe.expert_used_count must be one integer"
    )


def test_router_logits_are_bitwise_independent_of_the_batch() -> None:
    """The router's float matmul gives each token's logits bit for bit whatever else shares the call
    (the float matmul kernel's tiles do not: a 2-token tile differs from an 8-token one in the last
    bits), and within float32 rounding of the exact products."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 200)).astype(np.float32)  # 200: a tail past the 16-lane body
    x = rng.standard_normal((23, 200)).astype(np.float32)
    batched = np.empty((23, 24), np.float32)
    router_logits(x, w, batched)
    for n in (1, 2, 3, 5, 8, 13):
        alone = np.empty((n, 24), np.float32)
        router_logits(x[-n:], w, alone)
        np.testing.assert_array_equal(alone, batched[-n:])
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(batched - exact).max() < 1e-5 * np.abs(x).max() * np.abs(w).max() * 200


def test_routing_as_llama_cpp_defines_it() -> None:
    """softmax then top-k (weights normalised for Mixtral and Qwen3-MoE, as they are for Qwen2-MoE),
    and gpt-oss's top-k of the logits then a softmax over those k; best first, ties to the lower index."""
    logits = np.array([[1.0, 3.0, 2.0, 3.0], [0.0, -1.0, 4.0, 1.0]], np.float32)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    chosen, weights = route(logits, Routing(4, 2, "softmax", normalize=False))
    assert chosen.tolist() == [[1, 3], [2, 3]]
    np.testing.assert_allclose(weights, np.take_along_axis(probs, chosen, 1), rtol=1e-6)
    _, normalised = route(logits, Routing(4, 2, "softmax", normalize=True))
    np.testing.assert_allclose(
        normalised, [[0.5, 0.5], [np.exp(3) / (1 + np.exp(3)), 1 / (1 + np.exp(3))]], rtol=1e-6
    )
    chosen, weights = route(logits, Routing(4, 3, "softmax_weight", normalize=False))
    assert chosen.tolist() == [[1, 3, 2], [2, 3, 0]]
    top = np.take_along_axis(logits, chosen, 1).astype(np.float64)
    np.testing.assert_allclose(weights, np.exp(top) / np.exp(top).sum(axis=1, keepdims=True), rtol=1e-6)


def test_dispatch_runs_each_chosen_expert_once_over_its_tokens() -> None:
    chosen = np.array([[2, 0], [0, 5], [5, 2]])
    plan = Dispatch.of(chosen)
    assert plan.runs == [(0, 0, 2), (2, 2, 4), (5, 4, 6)]  # experts 1, 3, 4 are not run
    assert plan.tokens.tolist() == [0, 1, 0, 2, 1, 2]
    for t in range(3):
        for i in range(2):
            expert = next(e for e, s, end in plan.runs if s <= plan.rows[t, i] < end)
            assert expert == chosen[t, i] and plan.tokens[plan.rows[t, i]] == t


def test_gpt_oss_layers_as_llama_cpp_sets_them(tmp_path: Path) -> None:
    """Every other layer windowed, the first included (llama.cpp's pattern of 2); NeoX RoPE with YaRN."""
    model, _ = load(CASES["gpt-oss-mxfp4"], tmp_path)
    assert model.hp.swa_layers == (True, False) and model.hp.sliding_window == 8
    assert model.hp.rope_neox and model.rope.table.mscale == pytest.approx(1 + 0.1 * np.log(8.0), rel=1e-6)
    assert model.layers[0].moe.gate_up.groups[0][0][0].qtype == QType.MXFP4


def test_gpt_oss_needs_a_backend_with_sinks(tmp_path: Path) -> None:
    path = write_gguf(CASES["gpt-oss-f32"], tmp_path / "oss.gguf")
    backend = dataclasses.replace(cpu_backend(), attention_sinks=None)
    with pytest.raises(UnsupportedModelError, match="^gpt-oss: the CPU backend has no attention_sinks$"):
        load_model(GGUFFile(path), backend)


def _sink_reference(
    q: np.ndarray,
    keys: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
    sinks: np.ndarray,
    values: np.ndarray,
) -> np.ndarray:
    """llama.cpp's softmax with sinks, in float64: out[t, h] over cells first .. positions[t]."""
    n_tok, n_heads, dim = q.shape
    group = n_heads // keys.shape[0]
    out = np.zeros((n_tok, n_heads, dim))
    for t in range(n_tok):
        first = max(0, positions[t] + 1 - window) if window else 0
        for h in range(n_heads):
            k = keys[h // group, first : positions[t] + 1].astype(np.float64)
            v = values[h // group, first : positions[t] + 1].astype(np.float64)
            x = k @ q[t, h] * scale
            top = max(x.max(), sinks[h])
            p = np.exp(x - top) / (np.exp(x - top).sum() + np.exp(sinks[h] - top))
            out[t, h] = p @ v
    return out


@pytest.mark.parametrize("window", [0, 5])
def test_attention_sinks_against_a_reference(window: int) -> None:
    """apply_sinks after the ordinary attention is llama.cpp's softmax with a sink logit per head (some
    large enough to take most of the weight), windowed or not; each token's output is bitwise the same
    alone as in the batch."""
    rng = np.random.default_rng(11)
    n_kv, n_heads, dim, n_ctx = 2, 4, 32, 16
    keys = rng.standard_normal((1, n_kv, n_ctx, dim)).astype(np.float16)
    values = rng.standard_normal((1, n_kv, n_ctx, dim)).astype(np.float16)
    q = rng.standard_normal((n_ctx, n_heads, dim)).astype(np.float32)
    sinks = np.array([-2.0, 0.5, 3.0, 6.0], np.float32)
    positions, seq_ids = np.arange(n_ctx, dtype=np.int32), np.zeros(n_ctx, np.int32)

    def run(rows: slice) -> np.ndarray:
        out = np.empty((len(positions[rows]), n_heads, dim), np.float32)
        ops.attention(q[rows], keys, values, seq_ids[rows], positions[rows], window, 0.2, out)
        apply_sinks(q[rows], keys, seq_ids[rows], positions[rows], window, 0.2, sinks, out)
        return out

    batched = run(slice(None))
    want = _sink_reference(q, keys[0], positions, window, 0.2, sinks, values[0])
    np.testing.assert_allclose(batched, want, atol=2e-5)
    np.testing.assert_array_equal(run(slice(9, 10))[0], batched[9])


def test_clamped_swiglu_is_ggml_s() -> None:
    """gpt-oss's activation: x = min(gate, 7), y = clamp(up, -7, 7), x * sigmoid(1.702 x) * (y + 1)."""
    rng = np.random.default_rng(5)
    gate = (rng.standard_normal((3, 50)) * 6).astype(np.float32)
    up = (rng.standard_normal((3, 50)) * 6).astype(np.float32)
    x, y = np.minimum(gate, 7.0).astype(np.float64), np.clip(up, -7.0, 7.0).astype(np.float64)
    want = x / (1 + np.exp(-1.702 * x)) * (y + 1)
    got = gate.copy()
    swiglu_oai(got, up, 1.702, 7.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "MXFP4"])
def test_one_call_expert_matmul_matches_the_per_expert_matmuls_and_numpy(kind: str) -> None:
    """engine/cpu/matmul/experts.py: runs of 1, 2, 3, 5, 9 and 17 rows (every tile size, spans that
    start mid-tile) through their experts of one packed 3-D tensor in one call give each row bit for bit
    what the expert's own matmul gives it, and the dequantized weights' product within int8 activation
    rounding; formats without such a kernel (MXFP4, or every format on the portable level) say so."""
    n_expert, rows, cols = 6, 64, 512
    rng = np.random.default_rng(11)
    if kind == "MXFP4":
        normal = rng.standard_normal((n_expert * rows, cols)).astype(np.float32) * 0.05
        data = gguf_quants.quantize(normal, gguf.GGMLQuantizationType.MXFP4)
    else:
        data = random_matrix(rng, kind, n_expert * rows, cols, 0.05)
    qtype = QType[kind]
    whole, each, prepare = pack_experts_for_cpu(
        [data.reshape(n_expert, rows, -1)], qtype, (n_expert, rows, cols)
    )
    assert prepare is not None
    prepare(np.arange(n_expert))
    runs = np.array([[4, 0, 1], [0, 1, 3], [5, 3, 6], [1, 6, 11], [2, 11, 20], [4, 20, 37]], np.int64)
    x = rng.standard_normal((37, cols)).astype(np.float32)
    out = np.full((37, rows), np.nan, np.float32)
    done = experts_matmul(x, whole[0], rows, runs, out)
    assert done == (BYTE_DOT and kind != "MXFP4")
    if not done:
        return
    dense = dequantize(data, qtype, (n_expert * rows, cols)).reshape(n_expert, rows, cols)
    for expert, start, end in runs.tolist():
        alone = np.empty((end - start, rows), np.float32)
        matmul(np.ascontiguousarray(x[start:end]), each[expert], alone)
        np.testing.assert_array_equal(out[start:end], alone)
        exact = x[start:end].astype(np.float64) @ dense[expert].astype(np.float64).T
        assert np.abs(out[start:end] - exact).max() < 0.02 * np.abs(exact).max()


def test_experts_are_packed_when_first_routed_to(tmp_path: Path) -> None:
    """engine/cpu/lazy_experts.py: after load only expert 0 of each expert tensor is packed; a forward
    pass packs exactly the experts its tokens chose (layer by layer), and the logits are those of a
    model whose experts were all packed before the first token."""
    case = CASES["qwen3moe-q4_k_m"]
    model, _ = load(case, tmp_path)
    layer = model.layers[0].moe
    lazies = [prepare.__self__ for m in (layer.gate_up, layer.down) for prepare in m.prepare]
    assert lazies and all(lazy.packed.tolist() == [True] + [False] * (case.n_expert - 1) for lazy in lazies)
    tokens = prompt_tokens(case)[:3]
    logits = model.forward(Batch.of([BatchPart(0, 0, tokens, "all")]), model.new_cache(1, 16))
    chosen = set(layer.last_choice.reshape(-1).tolist()) | {0}
    assert len(chosen) < case.n_expert
    for lazy in lazies:
        assert set(np.flatnonzero(lazy.packed).tolist()) == chosen
    warm, _ = load(case, tmp_path)
    for moe in (lyr.moe for lyr in warm.layers):
        for m in (moe.gate_up, moe.down):
            for prepare in m.prepare:
                prepare(np.arange(case.n_expert))
    again = warm.forward(Batch.of([BatchPart(0, 0, tokens, "all")]), warm.new_cache(1, 16))
    np.testing.assert_array_equal(again, logits)
