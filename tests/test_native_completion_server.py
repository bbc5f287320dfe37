"""llama-server's native /completion on a real server: its prompt forms (token arrays, strings, mixed
arrays, `prompt_string` objects, several prompts answered as a list), `generation_settings` and
`response_fields` in the reply, `backend_sampling` (accepted: one sampler here), and `--kv-unified`
(each slot may use the whole context; the busy slots share it, and overflowing it fails them all with
llama-server's 500; a starting request moves the idle slots' cells to the host prompt cache)."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import httpx
import pytest

from server.config.parse import parse_settings
from tests.server_process import ServerProcess

PROMPT = "I believe the meaning of life is"


def post(server: ServerProcess, body: object, path: str = "/completion") -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def test_prompt_forms_give_the_same_answer(server: ServerProcess) -> None:
    tokens = post(server, {"content": PROMPT, "add_special": True}, "/tokenize").json()["tokens"]
    greedy = {"temperature": 0, "n_predict": 6}
    alone = post(server, {"prompt": PROMPT, **greedy})
    assert alone.status_code == 200 and isinstance(alone.json(), dict)
    forms = [tokens, PROMPT, {"prompt_string": PROMPT}, [tokens[0], PROMPT[len("I") :]]]
    replies = post(server, {"prompt": forms, **greedy})
    assert replies.status_code == 200, replies.text
    body = replies.json()
    assert isinstance(body, list) and [r["index"] for r in body] == [0, 1, 2, 3]
    assert all(r["content"] == alone.json()["content"] for r in body[:3])
    # a mixed array is one prompt: token ids with text between them
    mixed = post(server, {"prompt": [tokens[0], " believe", *tokens[2:4], "x"], **greedy})
    assert mixed.status_code == 200 and isinstance(mixed.json()["content"], str)
    one_object = post(server, {"prompt": {"prompt_string": PROMPT}, **greedy})
    assert one_object.json()["content"] == alone.json()["content"]


@pytest.mark.parametrize(
    ("prompt", "extra", "message"),
    [
        ([], {}, '"prompt" must not be empty'),
        ({"prompt_string": "x", "multimodal_data": ["AAAA"]}, {}, "does not support multimodal"),
        ({"prompt_string": "x", "other": 1}, {}, "other"),
        (["a", "b"], {"stream": True}, "several prompts"),
        ([[99999999]], {}, "outside the vocabulary"),
    ],
)
def test_bad_prompts_are_400(server: ServerProcess, prompt: object, extra: dict, message: str) -> None:
    r = post(server, {"prompt": prompt, "n_predict": 1, **extra})
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_generation_settings_and_response_fields(server: ServerProcess) -> None:
    body = post(server, {"prompt": "Once upon a time", "n_predict": 3, "temperature": 0}).json()
    settings = body["generation_settings"]
    assert settings["n_predict"] == 3 and settings["temperature"] == 0 and settings["logit_bias"] == []
    assert (
        body["prompt"] == "Once upon a time" and body["index"] == 0 and isinstance(body["has_new_line"], bool)
    )
    banned = post(server, {"prompt": "Once", "n_predict": 2, "ignore_eos": True, "logit_bias": [[42, 1.5]]})
    bias = banned.json()["generation_settings"]["logit_bias"]
    # ignore_eos bans every end-of-generation token (-inf, JSON null), as llama-server reports it
    assert {"bias": 1.5, "token": 42} in bias and {"bias": None, "token": 2} in bias
    assert all(b["bias"] is None for b in bias if b["token"] != 42)
    fields = ["content", "generation_settings/n_predict", "prompt", "missing/path"]
    kept = post(server, {"prompt": "Once", "n_predict": 4, "response_fields": fields}).json()
    assert set(kept) == {"content", "generation_settings/n_predict", "prompt"}
    assert kept["generation_settings/n_predict"] == 4 and kept["prompt"] == "Once"


def test_the_last_stream_chunk_has_the_generation_settings(server: ServerProcess) -> None:
    body = {"prompt": "Once", "n_predict": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/completion", json=body, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "generation_settings" not in chunks[0]
    assert chunks[-1]["stop"] and chunks[-1]["generation_settings"]["n_predict"] == 3


def test_backend_sampling_changes_nothing(server: ServerProcess) -> None:
    body = {"prompt": PROMPT, "n_predict": 5, "seed": 4242, "n_probs": 3, "post_sampling_probs": True}
    body["cache_prompt"] = False  # both runs evaluate the whole prompt
    on, off = (post(server, body | {"backend_sampling": flag}).json() for flag in (True, False))
    assert (
        on["content"] == off["content"] and on["completion_probabilities"] == off["completion_probabilities"]
    )


def test_underscored_flag_names_read_as_dashed() -> None:
    settings, ignored = parse_settings(["--ctx_size", "128", "--kv_unified", "--backend_sampling"])
    assert settings.ctx_size == 128 and settings.kv_unified and ignored == ["--backend-sampling"]
    settings, _ = parse_settings(["--reverse-prompt=--ctx_size"])  # a value is never rewritten
    assert settings.reverse_prompts == ("--ctx_size",)


@pytest.fixture(scope="module")
def unified() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "-m", "smollm2", "-np", "4", "-c", "256", "--kv-unified", "--cache-ram", "100", "--verbose"
    )
    yield proc.wait_healthy()
    proc.stop()


def run_together(server: ServerProcess, n_predicts: list[int]) -> list[httpx.Response]:
    bodies = [{"prompt": "A", "n_predict": n, "ignore_eos": True, "temperature": 0} for n in n_predicts]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: post(server, b), bodies))


def test_kv_unified_slots_share_the_whole_context(unified: ServerProcess) -> None:
    props = httpx.get(unified.base_url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 256  # each slot may use all of it
    alone = post(unified, {"prompt": "A", "n_predict": 200, "ignore_eos": True, "temperature": 0})
    assert alone.json()["timings"]["predicted_n"] == 200  # far past 256 / 4 cells
    fits = run_together(unified, [80, 40, 80, 80])  # at most 3 x 80 cells at once
    assert [r.json()["timings"]["predicted_n"] for r in fits] == [80, 40, 80, 80]


def test_kv_unified_overflow_fails_the_busy_slots(unified: ServerProcess) -> None:
    replies = run_together(unified, [90, 90, 90, 90])  # 360 cells > 256
    failed = [r for r in replies if r.status_code != 200]
    assert failed, [r.json()["timings"] for r in replies]
    for r in failed:
        assert (
            r.status_code == 500 and "context size has been exceeded" in r.json()["error"]["message"].lower()
        )
    for r in replies:  # none is cut short: an answer has all its tokens
        assert r.status_code != 200 or r.json()["timings"]["predicted_n"] == 90
    assert post(unified, {"prompt": "A", "n_predict": 8}).status_code == 200  # the pool serves again


LONG = "Once upon a time in a land far away, there lived a brave knight who traveled across mountains " * 2


def test_kv_unified_moves_idle_slots_to_the_host_cache(unified: ServerProcess) -> None:
    assert "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__" in unified.log_path.read_text()
    first = post(unified, {"prompt": LONG, "id_slot": 0, "n_predict": 2}).json()["timings"]
    seen = len(unified.log_path.read_text())
    assert post(unified, {"prompt": "The quick brown fox", "id_slot": 1, "n_predict": 2}).status_code == 200
    assert "__TEST_TAG_CACHE_IDLE_SLOT__" in unified.log_path.read_text()[seen:]  # slot 0 saved, emptied
    again = post(unified, {"prompt": LONG, "id_slot": 0, "n_predict": 2}).json()["timings"]
    assert again["cache_n"] > 0 and again["prompt_n"] < first["prompt_n"]  # from the host cache
