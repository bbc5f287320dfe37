"""Side by side with llama-server 0c1e570: every field its parameter readers take, alone and in realistic
combinations, on each route (scripts/llama_server_fields.py has the cases). The real llama-server's answers
on the same model and flags are tests/golden/llama_server_fields.json (recorded with that script); here
Llamba answers the same requests. Statuses must be equal; where both answer 200 the reply has the same key
paths and, where both decode greedily, the same text and counts; /props, /slots and /metrics carry every
key llama-server writes with its type; count_tokens and /apply-template give its numbers and text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scripts.llama_server_fields import probe, surfaces
from tests.conftest import load_golden
from tests.server_process import ServerProcess

LEVEL_INDEPENDENT = "statuses, reply shapes and greedy answers with a clear margin (no near ties)"

SPECULATION = "Llamba acts on per-request speculation (llama-server 0c1e570 compiles its reader out), so it "
SPECULATION += "checks the values"
# Where Llamba answers otherwise on purpose (docs/compatibility.md says so too): case -> the reason.
DIFFERENT_ON_PURPOSE: dict[str, str] = {
    "/v1/completions suffix#0": "an insertion point on a model without FIM tokens is a 501, not ignored",
    "combo completions-multi-prompt": "one prompt per /v1/completions request (not built yet)",
    "combo completion-mixed-prompt": "one prompt per /completion request (not built yet)",
    "/completion n_cmpl=usual": "several choices are served on /v1/completions and /v1/chat/completions only",
}
# The OpenAI and Anthropic fields' cases that send a value of the wrong type (the schema's are named so).
WRONG_TYPE = {
    "/v1/chat/completions logprobs#1",
    "/v1/completions logprobs#1",
    "/v1/chat/completions response_format#3",
    "/v1/chat/completions tools#1",
    "/v1/chat/completions chat_template_kwargs#1",
    "/v1/messages stop_sequences#1",
    "/v1/messages top_k#1",
    "/v1/messages system#2",
}
# Greedy answers that differ, and why.
GRAMMAR_CHAT = "llama-server 0c1e570's constrained chat answers on SmolLM2 are not JSON or the grammar's one "
GRAMMAR_CHAT += (
    "token (the same json_object request gave '```j' at max_tokens 4 and '{' at 8); Llamba's follow "
)
GRAMMAR_CHAT += "the grammar, ending when it is complete (its end token counted, as llama.cpp counts it)"
USAGE_N = "usage counts every choice's tokens (OpenAI's rule); llama-server 0c1e570 counts the first one's"
NEAR_TIE = (
    "the first token is a near tie (Llamba: 'The' -1.58, 'Two' -1.78; llama.cpp's own builds differ by "
)
NEAR_TIE += "0.12 nats on SmolLM2's logits)"
VALUES_DIFFER: dict[str, str] = {
    "/v1/chat/completions grammar=usual": GRAMMAR_CHAT,
    "/v1/chat/completions json_schema=usual": GRAMMAR_CHAT,
    "/v1/chat/completions response_format#0": GRAMMAR_CHAT,
    "combo chat-json-object": GRAMMAR_CHAT,
    "combo chat-json-schema": GRAMMAR_CHAT,
    "/v1/chat/completions n#1": USAGE_N,
    "/v1/chat/completions n_cmpl=usual": USAGE_N,
    "/v1/completions n#1": USAGE_N,
    "/v1/completions n_cmpl=usual": USAGE_N,
    "/v1/completions echo=usual": "Llamba echoes the prompt (OpenAI's echo); llama-server 0c1e570 ignores it",
    "combo completions-echo-logprobs": "Llamba echoes the prompt (OpenAI's echo); llama-server ignores it",
    "/v1/messages system#0": NEAR_TIE,
    "/v1/messages system#1": NEAR_TIE,
}
# Sampled, not greedy: their values depend on the random draw (a seed of -1 is random).
SAMPLED = ("temperature=usual", "dynatemp_range", "xtc_probability", "mirostat=", "samplers-chain", "seed")


def why_different(name: str, ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why a status differs on purpose, or None."""
    if name in DIFFERENT_ON_PURPOSE:
        return DIFFERENT_ON_PURPOSE[name]
    if ours["status"] == 400 and theirs["status"] == 500:
        return "a client's bad value is a 400 here, not a server error"
    if ours["status"] == 400 and theirs["status"] == 200:
        if "speculative." in name:
            return SPECULATION
        if name.endswith("=wrong-type") or name in WRONG_TYPE:
            return "llama-server ignores a wrongly typed value; Llamba names the field in a 400"
    return None


@pytest.fixture(scope="module")
def answers(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return probe(server.base_url)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return load_golden("llama_server_fields")


@pytest.fixture(scope="module")
def fresh() -> Iterator[ServerProcess]:
    """A server as the golden's surfaces were read from: the same flags, no request yet."""
    proc = ServerProcess("-m", "smollm2", "-np", "4", "-c", "4096", "--metrics").wait_healthy()
    yield proc
    proc.stop()


def test_every_case_was_recorded(answers: dict[str, Any], reference: dict[str, Any]) -> None:
    assert answers.keys() == reference["cases"].keys(), "re-record: scripts/llama_server_fields.py --write"


def test_statuses_equal_llama_servers(answers: dict[str, Any], reference: dict[str, Any]) -> None:
    differ = [
        f"{name}: Llamba {answers[name]['status']} llama-server {theirs['status']} "
        f"{answers[name].get('error', '')[:100]} | {theirs.get('error', '')[:100]}"
        for name, theirs in reference["cases"].items()
        if answers[name]["status"] != theirs["status"] and why_different(name, answers[name], theirs) is None
    ]
    assert not differ, "\n".join(differ)


def test_replies_have_llama_servers_keys(answers: dict[str, Any], reference: dict[str, Any]) -> None:
    differ = []
    for name, theirs in reference["cases"].items():
        ours = answers[name]
        if ours["status"] == theirs["status"] == 200:
            missing, extra = set(theirs["keys"]) - set(ours["keys"]), set(ours["keys"]) - set(theirs["keys"])
            if missing or extra:
                differ.append(f"{name}: missing {sorted(missing)} extra {sorted(extra)}")
    assert not differ, "\n".join(differ)


def test_greedy_replies_have_llama_servers_values(answers: dict[str, Any], reference: dict[str, Any]) -> None:
    differ = []
    for name, theirs in reference["cases"].items():
        ours = answers[name]
        greedy = not any(s in name for s in SAMPLED) and name not in VALUES_DIFFER
        if ours["status"] == theirs["status"] == 200 and greedy and ours["values"] != theirs["values"]:
            differ.append(f"{name}:\n  Llamba       {ours['values']}\n  llama-server {theirs['values']}")
    assert not differ, "\n".join(differ)


def test_props_slots_and_metrics_carry_llama_servers_keys(
    fresh: ServerProcess, reference: dict[str, Any]
) -> None:
    """Every key path llama-server writes, with its JSON type (Llamba's own keys may be there too:
    docs/compatibility.md lists them); a slot busy with a request shows its progress."""
    ours, theirs = surfaces(fresh.base_url), reference["surfaces"]
    for part in ("props", "slots idle", "slots busy", "slots after", "models entry", "models data"):
        differ = {
            path: (ours[part].get(path), kind)
            for path, kind in theirs[part].items()
            if ours[part].get(path) != kind
        }
        assert not differ, f"{part}: {differ}"
    assert set(theirs["metrics"]) <= set(ours["metrics"])
    for name in theirs:
        if name.startswith(("count_tokens", "apply-template")):
            assert ours[name] == theirs[name], name
