"""The q8_0 KV cache (-ctk/-ctv q8_0): the store against ggml's reference quantizer, attention against a
numpy reference over the dequantized cells, batch invariance, context shift, the cells' round trips
(slot files, prompt cache, `n` choices' copies), a model decoding on restored q8_0 cells, and a real
server on q8_0 cells: a greedy chat as f16 cells answer it (`make test`), slot files and context shifts
(slow)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.cpu import ops
from engine.gguf import GGUFFile
from engine.memory.context_shift import shift_cells
from engine.memory.kv import CacheTypes, KVCache
from engine.memory.kv_types import (
    F16,
    Q8_0,
    cache_type,
    cells_to_float,
    dequantize_q8_0_reference,
    quantize_q8_0_reference,
)
from engine.memory.slot_files import ModelIdentity, SlotFileError, SlotState, read_slot, write_slot
from engine.models import load_model
from server.config.parse import parse_settings
from tests.server_process import ServerProcess
from tests.synthetic_gguf import CASES, prompt_tokens, write_gguf
from tests.test_ops import attention_reference

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)

RNG = np.random.default_rng(7)
TYPES = {"f16": F16, "q8_0": Q8_0}
# Each pair compiles its own attention kernels (~30 s of CPU on a cold JIT cache): the mixed pairs run
# with the slow tests.
PAIRS = [
    ("q8_0", "q8_0"),
    pytest.param("q8_0", "f16", marks=pytest.mark.slow),
    pytest.param("f16", "q8_0", marks=pytest.mark.slow),
]


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def cells_of(x: np.ndarray, t: str) -> np.ndarray:
    """Cache cells of type t holding x[..., dim] (rounded or quantized as the store does)."""
    return quantize_q8_0_reference(x) if t == "q8_0" else x.astype(np.float16)


def test_reference_rounds_like_ggml() -> None:
    """d = amax / 127 stored as float16, q = roundf(x / d): ties away from zero (np.rint would give 2)."""
    x = np.zeros(32, np.float32)
    x[:4] = [127.0, 2.5, -2.5, 0.49]
    cells = quantize_q8_0_reference(x)
    assert cells.shape == (34,) and cells[:2].view(np.float16)[0] == 1.0
    assert list(cells[2:6].view(np.int8)) == [127, 3, -3, 0]
    assert not quantize_q8_0_reference(np.zeros(64, np.float32)).any()  # an all-zero block: d = 0
    y = rand(4, 64)
    np.testing.assert_allclose(dequantize_q8_0_reference(quantize_q8_0_reference(y)), y, atol=0.02)


def test_store_quantizes_bitwise_like_the_reference() -> None:
    k, v = rand(5, 2, 64) * 3, rand(5, 2, 64)
    k[0, 0, :32] = 0.0  # a zero block
    k[1, 1, 5] = 1e-6  # values far below the block's scale
    k_cache, v_cache = np.zeros((2, 2, 8, 68), np.uint8), np.zeros((2, 2, 8, 64), np.float16)
    seq_ids, positions = np.array([1, 1, 0, 0, 1], np.int32), np.array([4, 5, 0, 1, 6], np.int32)
    ops.store_kv(k, v, seq_ids, positions, k_cache, v_cache)
    for t in range(5):
        np.testing.assert_array_equal(k_cache[seq_ids[t], :, positions[t]], quantize_q8_0_reference(k[t]))
        np.testing.assert_array_equal(v_cache[seq_ids[t], :, positions[t]], v[t].astype(np.float16))


@pytest.mark.parametrize("k_type, v_type", PAIRS)
def test_attention_over_q8_0_cells_matches_the_dequantized_reference(k_type: str, v_type: str) -> None:
    n_seq, n_kv, n_ctx, dim, n_heads = 2, 2, 600, 64, 4  # beyond one KEY_CHUNK: chunks merged
    keys, values = rand(n_seq, n_kv, n_ctx, dim), rand(n_seq, n_kv, n_ctx, dim)
    k_cells, v_cells = cells_of(keys, k_type), cells_of(values, v_type)
    seq_ids = np.array([0, 0, 1, 1, 1], dtype=np.int32)
    positions = np.array([0, 2, 7, 258, 599], dtype=np.int32)
    q = rand(len(seq_ids), n_heads, dim)
    out = np.empty_like(q)
    ops.attention(q, k_cells, v_cells, seq_ids, positions, 0, 0.125, out)
    k_ref, v_ref = cells_to_float(k_cells, TYPES[k_type]), cells_to_float(v_cells, TYPES[v_type])
    ref = attention_reference(q, k_ref, v_ref, seq_ids, positions, 0, 0.125)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k_type, v_type", PAIRS)
def test_q8_0_attention_does_not_depend_on_the_batch(k_type: str, v_type: str) -> None:
    """A token's output is bitwise the same alone or in a batch (decode == prefill, batched == solo),
    with a sliding window too."""
    k_cells = cells_of(rand(2, 1, 600, 32), k_type)
    v_cells = cells_of(rand(2, 1, 600, 32), v_type)
    seq_ids = np.array([0, 0, 0, 1, 1], dtype=np.int32)
    positions = np.array([3, 4, 599, 100, 520], dtype=np.int32)
    q = rand(5, 2, 32)
    for window in (0, 300):
        together = np.empty_like(q)
        ops.attention(q, k_cells, v_cells, seq_ids, positions, window, 0.25, together)
        for t in range(5):
            alone = np.empty_like(q[t : t + 1])
            one = slice(t, t + 1)
            ops.attention(q[one], k_cells, v_cells, seq_ids[one], positions[one], window, 0.25, alone)
            np.testing.assert_array_equal(alone[0], together[t])


ONES = np.ones(32, dtype=np.float32)  # no RoPE scaling over the 64 dimensions


def test_context_shift_requantizes_rotated_keys_and_moves_values_exactly() -> None:
    heads, dim, n_ctx, start, end, delta = 2, 64, 40, 20, 36, -12
    raw = rand(n_ctx, heads, dim)
    rotated = raw.copy()
    ops.rope(rotated, np.arange(n_ctx, dtype=np.int32), 10000.0, False, ONES, 1.0)
    k = quantize_q8_0_reference(rotated.transpose(1, 0, 2))  # [heads, n_ctx, 68]
    v = quantize_q8_0_reference(rand(heads, n_ctx, dim))
    v_moved = v[:, start:end].copy()

    def rotate(keys: np.ndarray, pos: np.ndarray) -> None:
        ops.rope(keys, pos, 10000.0, False, ONES, 1.0)

    shift_cells(cpu_backend(), k, v, start, end, delta, rotate, dim)
    np.testing.assert_array_equal(v[:, start + delta : end + delta], v_moved)  # q8_0 -> f32 -> q8_0: exact
    staged = dequantize_q8_0_reference(quantize_q8_0_reference(rotated[start:end]))
    ops.rope(staged, np.full(end - start, delta, dtype=np.int32), 10000.0, False, ONES, 1.0)
    want = quantize_q8_0_reference(staged).transpose(1, 0, 2)
    got = k[:, start + delta : end + delta]
    np.testing.assert_array_equal(got, want)  # dequantized, rotated, quantized as the references do
    expected = raw[start:end].copy()
    ops.rope(expected, np.arange(start + delta, end + delta, dtype=np.int32), 10000.0, False, ONES, 1.0)
    np.testing.assert_allclose(dequantize_q8_0_reference(got), expected.transpose(1, 0, 2), atol=0.05)


def test_cache_types_are_named_like_llama_cpp() -> None:
    assert cache_type("q8_0") is Q8_0 and cache_type("f16") is F16
    with pytest.raises(ValueError, match=r"'q4_0' is not supported by Llamba \(supported: f16, q8_0\)"):
        cache_type("q4_0")
    with pytest.raises(ValueError, match="unknown KV cache type 'q9'"):
        cache_type("q9")
    with pytest.raises(ValueError, match="multiple of 32"):
        KVCache(1, 1, 4, 1, 8, cpu_backend(), CacheTypes(Q8_0, F16))


def q8_cache(n_seq: int = 3) -> KVCache:
    return KVCache(2, n_seq, 8, 2, 32, cpu_backend(), CacheTypes(Q8_0, Q8_0))


def test_q8_0_cells_round_trip_and_copy_only_their_sequence() -> None:
    kv = q8_cache()
    assert kv.k.shape == (2, 3, 2, 8, 34) and kv.k.dtype == np.uint8
    k = quantize_q8_0_reference(rand(2, 2, 5, 32))
    kv.write_cells(1, k, k[::-1].copy())
    got_k, got_v = kv.read_cells(1, 5)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, k[::-1])
    kv.copy_cells(1, 2, 3)  # `n` choices: the leader's cells to another slot
    assert np.array_equal(kv.read_cells(2, 3)[0], k[:, :, :3]) and list(kv.lengths) == [0, 5, 3]
    assert not kv.k[:, 0].any()


def test_slot_files_keep_q8_0_cells_and_refuse_other_cache_types(tmp_path: Path) -> None:
    kv = q8_cache()
    identity = ModelIdentity.of(kv, n_vocab=100, model_name="tiny.gguf")
    k = quantize_q8_0_reference(rand(2, 2, 5, 32))
    write_slot(tmp_path / "s.bin", identity, SlotState([1, 2, 3, 4, 5], k, k))
    back, _ = read_slot(tmp_path / "s.bin", identity, n_ctx=8)
    assert np.array_equal(back.k, k) and np.array_equal(back.v, k) and back.tokens == [1, 2, 3, 4, 5]
    f16 = KVCache(2, 3, 8, 2, 32, cpu_backend())
    with pytest.raises(SlotFileError, match="other KV cache types"):
        read_slot(tmp_path / "s.bin", ModelIdentity.of(f16, n_vocab=100, model_name="tiny.gguf"), n_ctx=8)


def test_a_model_decodes_alike_on_saved_and_restored_q8_0_cells(tmp_path: Path) -> None:
    """Prefill, save the cells (as the slot file and the prompt cache do: read_cells), restore them
    into another cache, decode the next token on both: bitwise the same logits. Then a context shift
    on the q8_0 cache, and decoding goes on from the shifted cells."""
    case = CASES["llama-linear-rope"]
    model = load_model(GGUFFile(write_gguf(case, tmp_path / "m.gguf")), cpu_backend())
    types = CacheTypes(Q8_0, Q8_0)
    tokens = prompt_tokens(case)
    kv = model.new_cache(2, 64, types)
    model.forward(Batch.of([BatchPart(0, 0, tokens[:-1])]), kv)
    restored = model.new_cache(2, 64, types)
    restored.write_cells(1, *kv.read_cells(0, len(tokens) - 1))
    a = model.forward(Batch.of([BatchPart(0, len(tokens) - 1, tokens[-1:])]), kv)
    b = model.forward(Batch.of([BatchPart(1, len(tokens) - 1, tokens[-1:])]), restored)
    np.testing.assert_array_equal(a, b)
    f16 = model.new_cache(1, 64)
    want = model.forward(Batch.of([BatchPart(0, 0, tokens, "last")]), f16)
    assert np.abs(a - want).max() < 0.05 * np.abs(want).max()  # q8_0 cells stay close to f16 ones
    n = len(tokens)
    model.shift_kv(kv, 0, 8, n, -4)
    kv.truncate(0, n - 4)
    shifted = model.forward(Batch.of([BatchPart(0, n - 4, tokens[-1:])]), kv)
    assert np.isfinite(shifted).all() and shifted.shape == a.shape


def test_server_flags_take_f16_and_q8_0_and_refuse_the_rest(capsys: pytest.CaptureFixture) -> None:
    settings, _ = parse_settings(["-m", "smollm2", "-ctk", "q8_0", "--cache-type-v", "q8_0"])
    assert (settings.cache_type_k, settings.cache_type_v) == ("q8_0", "q8_0")
    assert parse_settings(["-m", "smollm2"])[0].cache_type_k == "f16"
    with pytest.raises(SystemExit) as exc:
        parse_settings(["-m", "smollm2", "-ctv", "q4_0"])
    assert exc.value.code == 2
    assert "--cache-type-v: KV cache type 'q4_0' is not supported by Llamba (supported: f16, q8_0)" in (
        capsys.readouterr().err
    )


@pytest.fixture(scope="module")
def q8_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real server on q8_0 cells: one slot of 128 tokens (a long generation shifts its context),
    slot files on."""
    argv = ["-m", "smollm2", "-np", "1", "-c", "128", "-ctk", "q8_0", "-ctv", "q8_0", "--context-shift"]
    proc = ServerProcess(*argv, "--slot-save-path", str(tmp_path_factory.mktemp("slots"))).wait_healthy()
    yield proc
    proc.stop()


def test_a_q8_0_server_answers_a_chat_as_f16_cells_do(
    q8_server: ServerProcess, server: ServerProcess
) -> None:
    """A greedy chat over HTTP on q8_0 cells gives the f16 server's answer (tests/conftest.py) where the
    model is sure: this prompt's top two log-probabilities are over 1 apart at every token on both
    (where they are close, the cells' rounding may pick the other one)."""
    body = {"messages": [{"role": "user", "content": "Name the capital of France."}], "temperature": 0}
    replies = [
        httpx.post(s.base_url + "/v1/chat/completions", json=body, timeout=120) for s in (q8_server, server)
    ]
    q8, f16 = (r.json()["choices"][0] for r in replies)
    assert q8["finish_reason"] == f16["finish_reason"] == "stop"
    assert q8["message"]["content"] == f16["message"]["content"] and "Paris" in q8["message"]["content"]


@pytest.mark.slow
def test_a_q8_0_server_restores_a_saved_slot_and_shifts_its_context(q8_server: ServerProcess) -> None:
    """A real server with -ctk q8_0 -ctv q8_0: save, erase, overwrite and restore a slot, then the
    restored cells serve the same prompt (one token evaluated, the same reply); then generation goes on
    past a full slot through context shifts."""
    with httpx.Client(base_url=q8_server.base_url, timeout=300) as client:
        body = {"prompt": "The capital of France is Paris. The capital of Italy is", "n_predict": 8}
        body |= {"temperature": 0, "id_slot": 0}
        first = client.post("/completion", json=body).json()
        saved = client.post("/slots/0", params={"action": "save"}, json={"filename": "q8.bin"}).json()
        assert saved["n_saved"] > 0
        assert client.post("/slots/0", params={"action": "erase"}).status_code == 200
        client.post("/completion", json=body | {"prompt": "Something else entirely."})
        restore = client.post("/slots/0", params={"action": "restore"}, json={"filename": "q8.bin"})
        assert restore.json()["n_restored"] == saved["n_saved"]
        again = client.post("/completion", json=body).json()
        assert again["timings"]["prompt_n"] == 1 and again["content"] == first["content"]
        long = {"prompt": "Once upon a time", "n_predict": 300, "temperature": 0, "ignore_eos": True}
        reply = client.post("/completion", json=long).json()
        assert reply["tokens_predicted"] == 300 and reply["truncated"] is True
