"""/slots and /props as llama-server (0c1e570) writes them, on a real server: every key of its
`server_slot::to_json` with its type (a slot that never ran a request has only its identity; a busy or
once-busy one has the request's params and progress), progress that moves while a long prompt is
processed in small batches and while tokens are generated; /props' keys (model_ftype, the template's
caps, BOS/EOS, the endpoint switches, the complete default params), the -m name as the default alias,
and /completion's tokens_cached (the slot's cells, as llama-server counts them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess

# llama-server's task_params::to_json(only_metrics = true): each slot's params. (Both servers write an
# object's keys sorted: nlohmann's objects are std::maps, Quart sorts them.)
PARAM_KEYS = [
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
    "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty",
    "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay",
    "max_tokens", "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "n_probs", "min_keep",
    "chat_format", "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers",
    "speculative.types", "timings_per_token", "post_sampling_probs", "backend_sampling", "lora",
]  # fmt: skip
PARAM_TYPES = {"seed": int, "temperature": float, "top_k": int, "max_tokens": int, "stream": bool,
               "chat_format": str, "samplers": list, "speculative.types": str, "lora": list}  # fmt: skip
IDENTITY = {"id": int, "n_ctx": int, "speculative": bool, "is_processing": bool}
TASK = {
    "id_task": int,
    "n_prompt_tokens": int,
    "n_prompt_tokens_processed": int,
    "n_prompt_tokens_cache": int,
    "params": dict,
    "next_token": list,
}
NEXT_TOKEN = {"has_next_token": bool, "has_new_line": bool, "n_remain": int, "n_decoded": int}
PROPS = {
    "default_generation_settings": dict, "total_slots": int, "model_alias": str, "model_ftype": str,
    "model_path": str, "modalities": dict, "media_marker": str, "endpoint_slots": bool,
    "endpoint_props": bool, "endpoint_metrics": bool, "ui": bool, "ui_settings": dict,
    "chat_template": str, "chat_template_caps": dict, "bos_token": str, "eos_token": str,
    "build_info": str, "is_sleeping": bool, "cors_proxy_enabled": bool,
}  # fmt: skip
CAPS = {
    "supports_object_arguments", "supports_parallel_tool_calls", "supports_preserve_reasoning",
    "supports_reasoning_effort", "supports_string_content", "supports_system_role",
    "supports_tool_calls", "supports_tools", "supports_typed_content",
}  # fmt: skip
# A prompt of about 1500 tokens: 47 batches of 32, so a poll sees it part way.
LONG_PROMPT = " ".join(f"Item {i} is a small red box." for i in range(180))


@pytest.fixture(scope="module")
def small_batches() -> Iterator[ServerProcess]:
    """Two slots, batches of 32 tokens: a long prompt takes many steps."""
    proc = ServerProcess("-m", "smollm2", "-c", "4096", "-np", "2", "-b", "32", "-ub", "32", "--metrics")
    yield proc.wait_healthy()
    proc.stop()


def typed(obj: dict[str, Any], types: dict[str, type]) -> None:
    for key, kind in types.items():
        assert key in obj, f"{key} missing from {sorted(obj)}"
        value = obj[key]
        assert isinstance(value, kind) and (kind is not int or not isinstance(value, bool)), (key, value)


def test_an_unused_slot_has_its_identity_only(small_batches: ServerProcess) -> None:
    slots = httpx.get(small_batches.base_url + "/slots", timeout=30).json()
    assert [s["id"] for s in slots] == [0, 1]
    for slot in slots:
        typed(slot, IDENTITY)
        assert slot["is_processing"] is False and "params" not in slot and "next_token" not in slot
        assert slot["n_cached"] == 0  # Llamba's own, kept


def test_progress_moves_while_a_long_prompt_is_processed_and_generated(small_batches: ServerProcess) -> None:
    url = small_batches.base_url
    seen: list[dict[str, Any]] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not done.is_set():
                seen.extend(s for s in http.get("/slots").json() if s["is_processing"])

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        body = {"prompt": LONG_PROMPT, "n_predict": 24, "ignore_eos": True, "temperature": 0, "id_slot": 1}
        reply = httpx.post(url + "/completion", json=body, timeout=300).json()
    finally:
        done.set()
        poller.join()
    n_prompt = reply["tokens_evaluated"]
    assert n_prompt > 1000 and reply["tokens_predicted"] == 24
    assert seen, "no poll saw the slot busy"
    for slot in seen:
        typed(slot, IDENTITY | TASK)
        typed(slot["next_token"][0], NEXT_TOKEN)
        assert slot["id"] == 1 and set(slot["params"]) == set(PARAM_KEYS)
        typed(slot["params"], PARAM_TYPES)
        assert slot["params"]["n_predict"] == slot["params"]["max_tokens"] == 24
        assert slot["params"]["chat_format"] == "Content-only" and slot["params"]["seed"] == 2**32 - 1
    processed = [s["n_prompt_tokens_processed"] for s in seen]
    decoded = [s["next_token"][0]["n_decoded"] for s in seen]
    assert any(0 < p < n_prompt for p in processed), "no poll saw the prompt part way"
    assert processed == sorted(processed) and decoded == sorted(decoded)  # they only grow
    generating = [s for s in seen if s["next_token"][0]["n_decoded"] > 0]
    assert len({s["next_token"][0]["n_decoded"] for s in generating}) >= 2, "n_decoded did not move"
    for slot in generating:
        nt = slot["next_token"][0]
        assert slot["n_prompt_tokens_processed"] == n_prompt and nt["has_next_token"] is True
        assert nt["n_remain"] == 24 - nt["n_decoded"]
    # Idle again: the last request's params, its progress reset (llama-server's slot reset).
    idle = httpx.get(url + "/slots", timeout=30).json()[1]
    typed(idle, IDENTITY | TASK)
    assert idle["is_processing"] is False and idle["params"]["n_predict"] == 24
    assert idle["next_token"][0] | {"stopping_word": ""} == {
        "has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0, "stopping_word": ""
    }  # fmt: skip
    assert idle["n_prompt_tokens"] == idle["n_cached"] == reply["tokens_cached"] == n_prompt + 24 - 1


def test_fail_on_no_slot(small_batches: ServerProcess) -> None:
    url = small_batches.base_url
    assert httpx.get(url + "/slots", params={"fail_on_no_slot": 1}, timeout=30).status_code == 200


def test_props_and_models_as_llama_server_writes_them(small_batches: ServerProcess) -> None:
    url = small_batches.base_url
    props = httpx.get(url + "/props", timeout=30).json()
    typed(props, PROPS)
    assert props["model_alias"] == "smollm2" and props["model_ftype"] == "Q4_1"  # -m as given
    assert props["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert (props["endpoint_slots"], props["endpoint_props"], props["endpoint_metrics"]) == (
        True,
        False,
        True,
    )
    assert set(props["chat_template_caps"]) == CAPS and props["chat_template_caps"]["supports_system_role"]
    assert props["bos_token"] and props["eos_token"] == "<|im_end|>"
    params = props["default_generation_settings"]["params"]
    assert set(PARAM_KEYS) <= set(params) and params["max_tokens"] == params["n_predict"] == -1
    assert props["default_generation_settings"]["n_ctx"] == 2048
    [model] = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    assert (model["id"], model["aliases"]) == ("smollm2", ["smollm2"])
    assert model["meta"]["ftype"] == "Q4_1" and model["meta"]["n_ctx"] == 2048


def test_slots_debug_adds_the_prompt_and_the_generated_text() -> None:
    """LLAMA_SERVER_SLOTS_DEBUG=1, as llama-server: each slot that ran a request shows its prompt
    (special tokens rendered) and its generated text, while it runs and after."""
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "512", env={"LLAMA_SERVER_SLOTS_DEBUG": "1"})
    try:
        url = proc.wait_healthy().base_url
        assert "prompt" not in httpx.get(url + "/slots", timeout=30).json()[0]  # no request yet
        body = {
            "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 12,
            "temperature": 0,
        }
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        [slot] = httpx.get(url + "/slots", timeout=30).json()
        assert (
            slot["prompt"].startswith("<|im_start|>system") and "Count to five.<|im_end|>" in slot["prompt"]
        )
        assert slot["generated"] == reply["choices"][0]["message"]["content"] != ""
    finally:
        proc.stop()


def test_slots_without_debug_leave_the_text_out(small_batches: ServerProcess) -> None:
    httpx.post(small_batches.base_url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=120)
    assert not {"prompt", "generated"} & {
        k for s in httpx.get(small_batches.base_url + "/slots").json() for k in s
    }
