"""Speculative decoding over HTTP: llama-server's flags and per-request `speculative.*` fields, what it
reports (timings, /metrics, /slots), and bad settings refused at start-up or with a 400."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from cli.bench_serve import REPEAT_TEXT
from tests.server_process import REPO, ServerProcess

# Prose to repeat word for word (llamba-bench's repeat workload): SmolLM2 copies it, so its n-gram
# drafts are accepted and pay even on a loaded machine's step times. The code it was before is partly
# rewritten by the model, and the draft policy may then rightly verify nothing (CI of 2026-12-03).
ASK = "Repeat the following text exactly, word for word, with no changes:\n\n" + REPEAT_TEXT
COPY = {"messages": [{"role": "user", "content": ASK}], "max_tokens": 64}


@pytest.fixture(scope="module")
def spec_server():  # type: ignore[no-untyped-def]
    args = ("--spec-type", "ngram-simple", "--draft-max", "8", "--spec-ngram-size-n", "4", "--metrics")
    proc = ServerProcess("-m", "smollm2", "-np", "2", "-c", "2048", *args).wait_healthy()
    yield proc
    proc.stop()


def reply(server: ServerProcess, **extra: object) -> dict:
    body = {**COPY, "temperature": 0, **extra}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()


def test_the_server_speculates_and_the_reply_is_unchanged(
    spec_server: ServerProcess, server: ServerProcess
) -> None:
    drafted = reply(spec_server)
    plain = reply(server)  # the shared server has no --spec-type
    assert drafted["choices"][0]["message"] == plain["choices"][0]["message"]
    timings = drafted["timings"]
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert "draft_n" not in plain["timings"]
    metrics = httpx.get(spec_server.base_url + "/metrics").text
    spec = {
        ln.split()[0]: float(ln.split()[1]) for ln in metrics.splitlines() if ln.startswith("llamacpp:spec_")
    }
    assert spec["llamacpp:spec_decode_num_draft_tokens_total"] >= timings["draft_n"]  # llama-server's names
    assert spec["llamacpp:spec_decode_num_accepted_tokens_total"] >= timings["draft_n_accepted"]
    assert spec["llamacpp:spec_decode_num_drafts_total"] > 0  # verification steps
    slots = httpx.get(spec_server.base_url + "/slots").json()
    assert all(slot["speculative"] is False for slot in slots)  # idle: nothing drafting


def test_a_request_turns_speculation_on_or_off(spec_server: ServerProcess, server: ServerProcess) -> None:
    # The shared server's draft policy prices drafts with the step costs earlier tests taught it and may
    # find them not worth verifying (CI=true suite, 2026-12-03: none in 64 tokens); it still verifies a
    # few every 64th step (policy.EXPLORE_EVERY), so 160 tokens see drafts either way.
    longer = {"max_tokens": 160, "ignore_eos": True}
    on = reply(server, **longer, **{"speculative.type": "ngram-simple", "speculative.n_max": 4})
    assert on["timings"]["draft_n"] > 0
    off = reply(spec_server, **longer, **{"speculative.type": "none"})
    assert "draft_n" not in off["timings"]
    assert on["choices"][0]["message"] == off["choices"][0]["message"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"speculative.n_max": -1}, "speculative"),
        ({"speculative.n_max": 100_000}, "speculative"),
        ({"speculative.type": "mtp-magic"}, "speculative.type"),
        ({"speculative.type": "draft-simple"}, "draft model"),
        ({"speculative.p_min": "high"}, "speculative.p_min"),
    ],
)
def test_bad_speculative_fields_are_400(server: ServerProcess, extra: dict, named: str) -> None:
    response = httpx.post(server.base_url + "/v1/chat/completions", json={**COPY, **extra}, timeout=60)
    assert response.status_code == 400 and named in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--spec-type", "ngram-mod"], "--spec-type 'ngram-mod' is not supported"),
        (["--spec-type", "draft-simple"], "needs a draft model"),
        (["--spec-type", "ngram-simple", "--draft-max", "-2"], "n_max"),
    ],
)
def test_bad_speculative_flags_stop_the_server_with_one_line(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and says in done.stderr.strip().splitlines()[-1]


def test_a_draft_model_of_another_vocabulary_stops_the_server() -> None:
    proc = ServerProcess("-m", "smollm2", "-md", "gemma3")
    try:
        assert proc.proc.wait(timeout=300) == 1
        assert "another vocabulary" in proc.log()
    finally:
        proc.stop()
