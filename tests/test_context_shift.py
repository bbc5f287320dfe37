"""Context shift: prompt truncation like llama-server, and generation past a full slot (the CUDA
backend's shift is checked against the CPU's in tests/test_cuda_backend.py)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.cpu import ops
from engine.memory.context_shift import shift_cells, truncate_prompt
from tests.server_process import ServerProcess


def test_prompt_truncation_keeps_what_llama_server_keeps() -> None:
    prompt = list(range(301))
    kept = truncate_prompt(prompt, n_ctx=128, n_keep=0)
    assert len(kept) == 109 and kept == prompt[192:]
    kept = truncate_prompt(prompt, n_ctx=128, n_keep=10)
    assert kept[:10] == prompt[:10] and len(kept) < 128


ONES = np.ones(32, dtype=np.float32)  # no RoPE scaling over the 64 dimensions


@pytest.mark.parametrize("neox", [False, True])
def test_shifted_keys_equal_keys_rotated_at_their_new_positions(neox: bool) -> None:
    rng = np.random.default_rng(1)
    heads, dim, n_ctx, start, end, delta = 2, 64, 40, 20, 36, -12
    raw = rng.standard_normal((n_ctx, heads, dim)).astype(np.float32)
    cached = raw.copy()
    ops.rope(cached, np.arange(n_ctx, dtype=np.int32), 10000.0, neox, ONES, 1.0)
    k = np.ascontiguousarray(cached.transpose(1, 0, 2))  # the cache layout: [heads, n_ctx, dim]
    v = rng.standard_normal((heads, n_ctx, dim)).astype(np.float32)
    v_moved = v[:, start:end].copy()
    shift_cells(
        cpu_backend(),
        k,
        v,
        start,
        end,
        delta,
        lambda keys, pos: ops.rope(keys, pos, 10000.0, neox, ONES, 1.0),
        dim,
    )
    expected = raw[start:end].copy()
    ops.rope(expected, np.arange(start + delta, end + delta, dtype=np.int32), 10000.0, neox, ONES, 1.0)
    np.testing.assert_allclose(k[:, start + delta : end + delta], expected.transpose(1, 0, 2), atol=2e-4)
    np.testing.assert_array_equal(v[:, start + delta : end + delta], v_moved)


@pytest.fixture(scope="module")
def shifting_server():  # type: ignore[no-untyped-def]
    proc = ServerProcess("-m", "smollm2", "-c", "128", "-np", "1", "--context-shift").wait_healthy()
    yield proc
    proc.stop()


def test_long_prompt_is_truncated_like_llama_server(shifting_server) -> None:  # type: ignore[no-untyped-def]
    prompt = [(i * 37) % 40000 + 100 for i in range(301)]
    reply = httpx.post(
        shifting_server.base_url + "/completion",
        json={"prompt": prompt, "n_predict": 4, "temperature": 0},
        timeout=60,
    ).json()
    assert reply["truncated"] is True
    assert reply["tokens_evaluated"] == 109


def test_generation_continues_past_a_full_slot(shifting_server) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", "n_predict": 300, "temperature": 0, "ignore_eos": True}
    reply = httpx.post(shifting_server.base_url + "/completion", json=body, timeout=120).json()
    assert reply["tokens_predicted"] == 300 and reply["stop_type"] == "limit"
    assert reply["truncated"] is True
    assert len(reply["content"]) > 300


def test_without_context_shift_a_full_slot_stops_with_length() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "128", "-np", "1").wait_healthy()
    try:
        url = proc.base_url
        body = {"prompt": "Once upon a time", "n_predict": 300, "temperature": 0, "ignore_eos": True}
        reply = httpx.post(url + "/completion", json=body, timeout=120).json()
        assert reply["truncated"] is False and reply["stop_type"] == "limit"
        assert reply["tokens_predicted"] < 128
        too_long = httpx.post(url + "/completion", json={"prompt": "word " * 200, "n_predict": 2})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["type"] == "exceed_context_size_error"
    finally:
        proc.stop()
