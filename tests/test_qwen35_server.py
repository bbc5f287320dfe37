"""A real server on a synthetic `qwen35` file (hybrid Gated DeltaNet + gated attention, random weights):
chat, streaming, a tool call, the reasoning split, /completion, concurrent requests answered as alone,
slot save/restore, and an agent loop that does not re-process its history.

The file is tests/synthetic_qwen35.py's trunk (6 layers, every third one attention; Q8_0) with a real
tokenizer: llama.cpp's `models/ggml-vocab-qwen35.gguf` (pre-tokenizer `qwen35`, 151,936 tokens), whose
unused `[PAD]` ids get the added tokens of Qwen3's layout (`<tool_call>` 151657 ... `<think>` 151667),
and the real Qwen3.5 chat template (`models/templates/Qwen3.5-4B.jinja`). The weights are synthetic, so
the replies are random text: the tests check the machinery (what is parsed, counted, reused), not words.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from engine.memory.hybrid import END_OFFSET
from engine.reference_data import reference_file
from scripts.agent_loop import run_chat
from tests.server_process import ServerProcess
from tests.synthetic_quant_gguf import random_matrix
from tests.synthetic_qwen35 import Qwen35Case, _write_metadata, model_tensors

CASE = Qwen35Case("qwen35-chat", "qwen35", "Q8_0")
ADDED = {151657: "<tool_call>", 151658: "</tool_call>", 151665: "<tool_response>", 151666: "</tool_response>"}
ADDED |= {151667: "<think>", 151668: "</think>"}
IM_END = 151645
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        # A boolean: the format writes a string parameter as free text up to `</parameter>` (llama.cpp's
        # grammar too), which a model of random weights would never end.
        "parameters": {
            "type": "object",
            "properties": {"metric": {"type": "boolean"}},
            "required": ["metric"],
        },
    },
}


def write_chat_gguf(path: Path) -> Path:
    """The synthetic trunk with the real Qwen3.5 tokenizer and template (see the module docstring)."""
    vocab = gguf.GGUFReader(reference_file("models/ggml-vocab-qwen35.gguf"))
    tokens = list(vocab.fields["tokenizer.ggml.tokens"].contents())
    types = list(vocab.fields["tokenizer.ggml.token_type"].contents())
    for token_id, text in ADDED.items():
        tokens[token_id], types[token_id] = text, 4  # user-defined, as the converter marks them
    tensors = model_tensors(CASE)
    rng = np.random.default_rng(7)
    for name in ("token_embd.weight", "output.weight"):
        tensors[name] = (random_matrix(rng, "Q8_0", len(tokens), CASE.n_embd, 1.0), "Q8_0")
    w = gguf.GGUFWriter(str(path), CASE.arch)
    _write_metadata(w, CASE)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(vocab.fields["tokenizer.ggml.merges"].contents()))
    w.add_eos_token_id(IM_END)
    w.add_pad_token_id(151643)
    w.add_add_bos_token(False)
    w.add_chat_template(reference_file("models/templates/Qwen3.5-4B.jinja").read_text())
    for name, (data, kind) in tensors.items():
        if kind == "F32":
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_gguf(tmp_path_factory.mktemp("qwen35") / "qwen35-chat.gguf")


@pytest.fixture(scope="module")
def server(chat_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    slots = tmp_path_factory.mktemp("slots")
    proc = ServerProcess("-m", str(chat_gguf), "-np", "4", "-c", "16384", "--slot-save-path", str(slots))
    proc.wait_healthy()
    yield proc
    proc.stop()


def chat(server: ServerProcess, **body: object) -> dict:
    body = {
        "messages": [{"role": "user", "content": "Hello there"}],
        "temperature": 0,
        "max_tokens": 12,
    } | body
    reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_chat_and_its_stream_give_the_same_answer(server: ServerProcess) -> None:
    whole = chat(server, chat_template_kwargs={"enable_thinking": False}, cache_prompt=False)
    body = {
        "messages": [{"role": "user", "content": "Hello there"}],
        "temperature": 0,
        "max_tokens": 12,
        "stream": True,
        "cache_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    pieces, finish = [], None
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=300) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]
    assert finish == whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 12


def test_completion_runs_the_hybrid_model(server: ServerProcess) -> None:
    body = {"prompt": "The weather today", "n_predict": 8, "temperature": 0, "n_probs": 2}
    reply = httpx.post(server.base_url + "/completion", json=body, timeout=300).json()
    assert reply["tokens_predicted"] == 8 and len(reply["completion_probabilities"]) == 8
    assert reply["timings"]["prompt_n"] == reply["tokens_evaluated"]


def test_a_required_tool_call_is_parsed_from_the_qwen35_format(server: ServerProcess) -> None:
    # Thinking off: with it on, the call's grammar waits for the end of a reasoning block that a model
    # of random weights never closes (llama-server's grammar waits the same way).
    off = {"enable_thinking": False}
    reply = chat(server, tools=[WEATHER], tool_choice="required", max_tokens=64, chat_template_kwargs=off)
    message = reply["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["metric"] in (True, False)
    assert reply["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_is_split_from_the_answer(server: ServerProcess) -> None:
    reply = chat(server, thinking_budget_tokens=3, reasoning_format="deepseek", max_tokens=10)
    message = reply["choices"][0]["message"]
    assert message.get("reasoning_content"), message  # the template opened <think>; the budget closed it
    assert "<think>" not in (message["content"] or "") and "</think>" not in (message["content"] or "")


def test_four_concurrent_requests_are_answered_as_alone(server: ServerProcess) -> None:
    prompts = [f"Request number {i}: tell me about {topic}" for i, topic in enumerate("abcd")]

    def body(prompt: str) -> dict:
        return {"prompt": prompt, "n_predict": 10, "temperature": 0, "cache_prompt": False}

    alone = [
        httpx.post(server.base_url + "/completion", json=body(p), timeout=300).json()["content"]
        for p in prompts
    ]

    async def together() -> list[str]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            replies = await asyncio.gather(*(client.post("/completion", json=body(p)) for p in prompts))
        return [r.json()["content"] for r in replies]

    assert asyncio.run(together()) == alone


def test_slot_save_and_restore_round_trip(server: ServerProcess) -> None:
    """A recurrent state is restored whole: the next prompt extends what the slot held (its prompt and
    reply, as tokens), so the restored state is used, and it answers as the whole prompt does alone."""
    url = server.base_url
    tokens = httpx.post(url + "/tokenize", json={"content": "Remember this sentence, please."}).json()[
        "tokens"
    ]
    first = {"prompt": tokens, "n_predict": 4, "temperature": 0, "id_slot": 1, "return_tokens": True}
    generated = httpx.post(url + "/completion", json=first, timeout=300).json()["tokens"]
    slot = url + "/slots/1?action="
    saved = httpx.post(slot + "save", json={"filename": "q.bin"}, timeout=60).json()
    assert saved["n_saved"] == len(tokens) + len(generated) - 1, saved  # the last pick is never fed
    httpx.post(slot + "erase", timeout=60).raise_for_status()
    restored = httpx.post(slot + "restore", json={"filename": "q.bin"}, timeout=60).json()
    assert restored.get("n_restored") == saved["n_saved"], restored
    more = httpx.post(url + "/tokenize", json={"content": " And more."}).json()["tokens"]
    body = {"prompt": tokens + generated + more, "n_predict": 6, "temperature": 0, "id_slot": 1}
    after = httpx.post(url + "/completion", json=body, timeout=300).json()
    alone = httpx.post(url + "/completion", json=body | {"cache_prompt": False, "id_slot": 2}, timeout=300)
    assert after["timings"]["cache_n"] == saved["n_saved"]  # the restored state was used...
    assert after["content"] == alone.json()["content"]  # ...and is the state the prompt leads to


def test_an_agent_loop_processes_only_each_turns_new_tokens(server: ServerProcess) -> None:
    """Six turns of a growing chat (about 2,000 tokens by the end): from the second turn on, the tokens
    processed are what the previous prompt did not have, plus at most the checkpoint's END_OFFSET."""
    rows = run_chat(server.base_url, turns=6, words=260, n_predict=48)
    assert rows[-1]["prompt_tokens"] > 1800
    for before, turn in zip(rows, rows[1:], strict=False):
        new = turn["prompt_tokens"] - before["prompt_tokens"]
        assert turn["prompt_n"] <= new + END_OFFSET, (before, turn)
        assert turn["cache_n"] >= before["prompt_tokens"] - END_OFFSET, (before, turn)


def test_n_choices_share_the_prompts_state(server: ServerProcess) -> None:
    """`n` choices copy the leader's hybrid memory (KV cells and recurrent state): each greedy choice
    is the single answer."""
    single = chat(server, cache_prompt=False)["choices"][0]["message"]["content"]
    choices = chat(server, n=2, cache_prompt=False)["choices"]
    assert [c["message"]["content"] for c in choices] == [single, single]


def test_slots_and_metrics_report_the_hybrid_model(server: ServerProcess) -> None:
    slots = httpx.get(server.base_url + "/slots", timeout=30).json()
    assert len(slots) == 4 and all(s["n_ctx"] == 4096 for s in slots)
    metrics = httpx.get(server.base_url + "/metrics", timeout=30)
    assert metrics.status_code in (200, 501)  # 501 without --metrics, as llama-server
    props = httpx.get(server.base_url + "/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 4096
