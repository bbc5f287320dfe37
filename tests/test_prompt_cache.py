"""The host prompt cache (--cache-ram): LRU under a byte limit, best-prefix lookup, and the engine using it
so that a conversation's next turn after another one took the slot processes only its new tokens."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from engine.api import GenerationRequest, Timings
from engine.engine import Engine, EngineConfig
from engine.memory.base import MemoryState
from engine.memory.prompt_cache import PromptCache, mib_to_bytes
from engine.sampling import SamplingParams
from tests.server_process import ServerProcess


def cells(n: int, fill: float = 1.0) -> MemoryState:
    k = np.full((2, 1, n, 4), fill, dtype=np.float32)
    return MemoryState(n, k, k.copy())


# -- the cache alone ---------------------------------------------------------------------------------
def test_best_entry_is_the_longest_common_prefix() -> None:
    cache = PromptCache(None)
    cache.save([1, 2, 3, 4], cells(4))
    cache.save([1, 2, 9, 9, 9], cells(5))
    hit = cache.best([1, 2, 3, 7])
    assert hit is not None and hit.entry.tokens == (1, 2, 3, 4) and hit.n_keep == 3
    assert cache.best([5, 6]) is None


def test_entries_keeping_under_a_quarter_are_skipped() -> None:
    cache = PromptCache(None)
    cache.save(list(range(1, 101)), cells(100))
    assert cache.best([1, 2, 3] + [0] * 50) is None  # 3 of 100 tokens kept
    assert cache.best(list(range(1, 26)) + [0]).n_keep == 25  # type: ignore[union-attr]


def test_lru_eviction_keeps_bytes_under_the_limit() -> None:
    one = cells(10).n_bytes + 8 * 10  # bytes of one 10-token entry
    cache = PromptCache(2 * one + 1)
    cache.save(list(range(0, 10)), cells(10))
    cache.save(list(range(100, 110)), cells(10))
    assert cache.best(list(range(0, 10))) is not None  # touches the first: the second is now oldest
    cache.save(list(range(200, 210)), cells(10))
    assert len(cache) == 2 and cache.n_bytes <= 2 * one + 1
    assert cache.best(list(range(100, 110))) is None
    assert cache.best(list(range(0, 10))) is not None
    assert not cache.save(list(range(300, 400)), cells(100))  # bigger than the whole limit


def test_extensions_replace_their_prefix_and_prefixes_are_not_stored_twice() -> None:
    cache = PromptCache(None)
    cache.save([1, 2, 3], cells(3))
    cache.save([1, 2, 3, 4, 5], cells(5))
    assert len(cache) == 1
    assert not cache.save([1, 2], cells(2))
    assert len(cache) == 1 and cache.n_bytes == cells(5).n_bytes + 8 * 5


def test_limits_from_mib() -> None:
    assert mib_to_bytes(-1) is None and mib_to_bytes(0) == 0 and mib_to_bytes(2) == 2 * 1024 * 1024
    assert not PromptCache(0).enabled and PromptCache(None).enabled


# -- the engine with a small limit -------------------------------------------------------------------
def generate(engine: Engine, prompt: list[int], n_predict: int = 6) -> tuple[list[int], Timings]:
    async def run() -> tuple[list[int], Timings]:
        request = GenerationRequest(prompt, SamplingParams(temperature=0), n_predict=n_predict)
        tokens, timings = [], None
        async for event in engine.submit(request):
            if event.token is not None:
                tokens.append(event.token)
            timings = event.timings or timings
        assert timings is not None
        return tokens, timings

    return asyncio.run(run())


@pytest.fixture(scope="module")
def small_engine(smollm2_llm):  # type: ignore[no-untyped-def]
    engine = Engine(smollm2_llm, EngineConfig(n_slots=1, n_ctx=512, cache_ram_mib=2))
    engine.start()
    yield engine
    engine.stop()


def test_engine_turn_after_another_conversation_reuses_the_cache(small_engine, smollm2_llm) -> None:  # type: ignore[no-untyped-def]
    encode = smollm2_llm.tokenizer.encode
    a1 = encode("The quick brown fox jumps over the lazy dog.")
    b1 = encode("Numbers: one, two, three, four, five, six.")
    a_out, _ = generate(small_engine, a1)
    generate(small_engine, b1)  # takes the only slot: A's cells go to the host cache
    a2 = a1 + a_out + encode(" And then?")
    warm, timings = generate(small_engine, a2)
    assert timings.cache_n >= len(a1) + len(a_out) - 1
    assert timings.prompt_n == len(a2) - timings.cache_n
    cold = Engine(smollm2_llm, EngineConfig(n_slots=1, n_ctx=512, cache_ram_mib=0))
    cold.start(warm_up=False)
    try:
        assert generate(cold, a2)[0] == warm
    finally:
        cold.stop()


def test_engine_cache_stays_within_cache_ram(small_engine, smollm2_llm) -> None:  # type: ignore[no-untyped-def]
    limit = 2 * 1024 * 1024
    per_token = small_engine.memory.read_cells(0, 1)[0].nbytes * 2
    for i in range(8):  # eight conversations of ~15 tokens through one slot: more than 2 MiB in all
        text = f"Conversation {i}: " + " ".join(["word"] * (10 + i))
        generate(small_engine, smollm2_llm.tokenizer.encode(text), n_predict=2)
        assert small_engine.prompt_cache.n_bytes <= limit
    assert 8 * 15 * per_token > limit  # the test really overflows the limit
    assert len(small_engine.prompt_cache) >= 1


def test_cached_prompts_list_what_the_slots_and_host_cache_hold(small_engine, smollm2_llm) -> None:  # type: ignore[no-untyped-def]
    """What a cluster replica's /slots/prefixes summary is made of."""
    prompt = smollm2_llm.tokenizer.encode("Cached prompts: the summary of a replica's prompt cache.")
    out, _ = generate(small_engine, prompt, n_predict=2)
    held = small_engine.cached_prompts().result(10)
    assert any(p[: len(prompt)] == tuple(prompt) for p in held)


def test_a_call_whose_caller_left_is_skipped_and_the_engine_lives_on(small_engine) -> None:  # type: ignore[no-untyped-def]
    """A cancelled call future (its HTTP client left) used to end the engine thread when the call ran."""
    small_engine.call(lambda: time.sleep(0.3))  # holds the engine thread while the next call is cancelled
    ran: list[int] = []
    cancelled = small_engine.call(lambda: ran.append(1))
    assert cancelled.cancel()
    assert small_engine.call(lambda: 42).result(10) == 42
    assert ran == [] and small_engine._thread.is_alive()


# -- the server: two conversations alternating on one slot -------------------------------------------
@pytest.fixture(scope="module")
def one_slot_server():  # type: ignore[no-untyped-def]
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "1024", "--metrics")
    yield proc.wait_healthy()
    proc.stop()


def chat(client: httpx.Client, messages: list[dict], **extra: object) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 12, **extra}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached_total(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_cached_total "):
            return float(line.split()[1])
    raise AssertionError("no llamacpp:prompt_tokens_cached_total")


def test_alternating_conversations_on_one_slot(one_slot_server) -> None:  # type: ignore[no-untyped-def]
    a = [{"role": "user", "content": "Name three colours of the rainbow."}]
    b = [{"role": "user", "content": "What is the capital of Japan? Answer briefly."}]
    with httpx.Client(base_url=one_slot_server.base_url, timeout=120) as client:
        a_reply = chat(client, a)
        a_turn1_prompt = a_reply["usage"]["prompt_tokens"]
        b_reply = chat(client, b)
        a += [a_reply["choices"][0]["message"], {"role": "user", "content": "And two more?"}]
        b += [b_reply["choices"][0]["message"], {"role": "user", "content": "And of France?"}]
        before = cached_total(client)
        warm = chat(client, a)
        t = warm["timings"]
        assert t["cache_n"] >= a_turn1_prompt  # turn 1's prompt came back from the host cache
        assert t["prompt_n"] + t["cache_n"] == warm["usage"]["prompt_tokens"]
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == t["cache_n"]
        assert cached_total(client) - before == t["cache_n"]
        warm_b = chat(client, b)  # and the other way round
        assert warm_b["timings"]["cache_n"] >= b_reply["usage"]["prompt_tokens"]
        cold = chat(client, a, cache_prompt=False)
        assert cold["timings"]["cache_n"] == 0
        assert cold["choices"][0]["message"]["content"] == warm["choices"][0]["message"]["content"]
