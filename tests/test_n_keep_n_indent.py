"""llama-server's per-request `n_keep` and `n_indent` (0c1e570): the rules as pure functions, then on the
engine with SmolLM2 (a context shift keeps the request's first tokens; a short-indented line ends the
generation) and on a server (every generation route takes both; bad values are 400s)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from engine.api import GenerationRequest, TokenEvent
from engine.engine import Engine, EngineConfig
from engine.llm import LLM
from engine.memory.context_shift import keep_count, truncate_prompt
from engine.sampling import SamplingParams
from engine.sequence import IndentLimit, indent_check, indent_settled
from tests.server_process import ServerProcess

# -- n_keep: how many tokens a context shift keeps ---------------------------------------------------


def test_keep_count_is_llama_servers() -> None:
    assert keep_count(0, 20, False, 64) == 0
    assert keep_count(8, 20, False, 64) == 8
    assert keep_count(8, 20, True, 64) == 9  # one more where the model adds BOS
    assert keep_count(-1, 20, False, 64) == 20  # all the prompt
    assert keep_count(-1, 20, True, 64) == 21
    assert keep_count(100, 20, False, 64) == 60  # at most the slot's context less 4
    assert keep_count(-1, 200, True, 64) == 60


def test_prompt_truncation_keeps_n_keep_and_minus_one_keeps_what_fits() -> None:
    prompt = list(range(301))
    kept = truncate_prompt(prompt, n_ctx=128, n_keep=10)
    assert kept[:10] == prompt[:10] and kept[10] != 10 and len(kept) < 128
    whole = truncate_prompt(prompt, n_ctx=128, n_keep=-1)  # all the prompt: the context less 4
    assert whole[:124] == prompt[:124] and whole[-1] == 300 and len(whole) < 128


# -- n_indent: the rule, run as llama-server runs it ---------------------------------------------------


def llama_server_indent(pieces: list[str], n_indent: int) -> tuple[str, int | None]:
    """llama-server's process_token loop (server-context.cpp, 0c1e570) over a generation's pieces: the
    text it ends with, and the index of the piece whose step stopped it (None: it did not)."""
    text, has_new_line, last_nl_pos = "", False, 0
    for i, piece in enumerate(pieces):
        text += piece
        if has_new_line:
            if last_nl_pos > 0:
                pos, n = last_nl_pos, 0
                while pos < len(text) and text[pos] in (" ", "\t"):
                    n, pos = n + 1, pos + 1
                if pos < len(text) and n < n_indent:
                    return text[:pos], i
            found = text.find("\n", last_nl_pos)
            if found != -1:
                last_nl_pos = found + 1
        if "\n" in piece:
            has_new_line = True
    return text, None


def run_limit(pieces: list[str], n_indent: int) -> tuple[list[str], int | None]:
    """What IndentLimit hands on piece by piece (the last piece is the generation's last) and where it
    stopped."""
    limit, out = IndentLimit(n_indent), []
    for i, piece in enumerate(pieces):
        text, cut = limit.push(piece, final=i == len(pieces) - 1)
        out.append(text)
        if cut:
            return out, i
    return out, None


CODE = ["def f(x):", "\n   ", " y", " =", " x", "\n   ", " return", " y", "\n\n", "print", "(f", "(2", "))"]


@pytest.mark.parametrize(
    ("pieces", "n_indent"),
    [
        (CODE, 4),  # the empty line after the body stops it (a newline is not indentation)
        (CODE, 5),  # the first body line is short: cut after its four spaces
        (CODE, 1),
        (["a\n", "b", "c", "d"], 1),  # the line after the first newline is checked a token later
        (["a\n", "  b", "\n", "c", "\n"], 2),
        (["a", "\n\n\n", "  x", "y", "z"], 2),  # several newlines in one piece: one line a step
        (["a\n", "\t", "\t", "b\n", " c", "d", "e"], 2),  # tabs count as spaces do
        (["x\n", "    ", "  ", "a\n", "b"], 4),  # a line whose indentation spans pieces
        (["only one line", " of text"], 3),  # the first line is never checked
        (["a\n", "b"], 4),  # generation ends before the check runs: the line stays
    ],
)
def test_indent_limit_matches_llama_servers_loop(pieces: list[str], n_indent: int) -> None:
    expected, stopped_at = llama_server_indent(pieces, n_indent)
    out, at = run_limit(pieces, n_indent)
    assert "".join(out) == expected and at == stopped_at


def test_indent_examples() -> None:
    assert llama_server_indent(CODE, 4) == ("def f(x):\n    y = x\n    return y\n", 9)
    assert llama_server_indent(CODE, 5) == ("def f(x):\n    ", 3)
    assert llama_server_indent(["a\n", "b", "c", "d"], 1) == ("a\n", 2)
    assert llama_server_indent(["a\n", "b"], 4) == ("a\nb", None)


def test_indent_limit_holds_back_only_what_it_may_cut() -> None:
    out, at = run_limit(CODE, 4)
    assert at == 9
    # handed on as soon as settled: the first line at once, an indented line once its indentation is 4
    assert out[:3] == ["def f(x):", "\n   ", " y"]
    # the empty line is held from its start (it may be cut) and never handed on
    assert "".join(out) == "def f(x):\n    y = x\n    return y\n"


def test_indent_check_and_settled() -> None:
    assert indent_check("a\nb", 0, 2) == (None, 2)  # no line under check yet: it becomes the next one
    assert indent_check("a\nb", 2, 2) == (2, 2)
    assert indent_check("a\n  b\nc", 2, 2) == (None, 6)
    assert indent_check("a\n \tb", 2, 2) == (None, 2)  # passes; no newline after it yet
    assert indent_check("a\n ", 2, 2) == (None, 2)  # indentation only so far: not decided
    assert indent_settled("abc", 0, 4) == 3
    assert indent_settled("a\n  b", 0, 4) == 4  # the short line's text may be cut, not its indentation
    assert indent_settled("a\n    b\n  ", 2, 4) == 10  # the next line is checked later
    assert indent_settled("a\n    b\n    c", 2, 4) == 13


# -- on the engine, with SmolLM2 ------------------------------------------------------------------------


async def _run(engine: Engine, request: GenerationRequest) -> tuple[str, TokenEvent]:
    text, final = "", None
    async for event in engine.submit(request):
        text += event.text
        final = event
    assert final is not None
    return text, final


def _generate(engine: Engine, request: GenerationRequest) -> tuple[str, TokenEvent, list[int]]:
    """The request's text, last event, and the slot's cells once it ended."""

    async def run() -> tuple[str, TokenEvent, list[int]]:
        text, final = await _run(engine, request)
        cells = await asyncio.wrap_future(engine.call(lambda: list(engine.pool[final.id_slot].tokens)))
        return text, final, cells

    return asyncio.run(run())


def test_a_context_shift_keeps_the_requests_first_tokens(smollm2_llm: LLM) -> None:
    engine = Engine(
        smollm2_llm, EngineConfig(n_slots=1, n_ctx=64, context_shift=True, cache_ram_mib=0, n_keep=3)
    )
    engine.start(warm_up=False)
    prompt = smollm2_llm.tokenizer.encode("Once upon a time, in a land far away, there lived", True, True)
    base = GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=90, ignore_eos=True)
    assert not smollm2_llm.tokenizer.add_bos  # SmolLM2 adds no BOS: n_keep is the count as asked
    try:
        runs = {n: _generate(engine, replace(base, n_keep=n)) for n in (8, 0, -1)}
        default = _generate(engine, base)  # no n_keep: the engine's (--keep 3)
    finally:
        engine.stop()
    for n_keep, (_, final, cells) in runs.items():
        assert final.truncated and final.n_generated == 90, n_keep  # the slot shifted
        assert len(cells) < len(prompt) + 90
    assert runs[8][2][:8] == prompt[:8] and runs[8][2][8] != prompt[8]
    assert runs[0][2][:8] != prompt[:8]  # without n_keep the prompt's start is discarded
    assert runs[-1][2][: len(prompt)] == prompt  # -1: all the prompt
    assert default[2][:3] == prompt[:3] and default[2][3] != prompt[3]
    assert runs[8][0] != runs[0][0]  # what is kept changes what follows


def test_n_indent_ends_the_generation_at_a_short_line(smollm2_llm: LLM) -> None:
    engine = Engine(smollm2_llm, EngineConfig(n_slots=1, n_ctx=512, cache_ram_mib=0))
    engine.start(warm_up=False)
    prompt = smollm2_llm.tokenizer.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):", True, True)
    base = GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=60)
    try:
        free_text, free = asyncio.run(_run(engine, base))
        text, final = asyncio.run(_run(engine, replace(base, n_indent=4)))
    finally:
        engine.stop()
    expected, stopped_at = llama_server_indent(list(free_text), 4)  # whatever the pieces, the text is this
    assert text == expected and text != free_text and free_text.startswith(text)
    assert final.finish_reason == "length" and final.n_generated < free.n_generated
    assert all(line.startswith("    ") for line in text.split("\n")[1:-1])
    rest = free_text[len(text) :]
    assert rest[:1] not in ("", " ", "\t")  # the cut line was indented less than 4


# -- on a server ------------------------------------------------------------------------------------------

# Lines forever under a grammar: the text is the grammar's whatever the model, until a limit ends it.
INDENTED = {
    "grammar": 'root ::= "x\\n" "    a\\n" "    b\\n" "c\\n" ("    d\\n")+',
    "ignore_eos": True,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def shifting() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-c", "128", "-np", "1", "--context-shift").wait_healthy()
    yield proc
    proc.stop()


def post(server: ServerProcess, path: str, body: object) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def streamed_text(server: ServerProcess, path: str, body: dict) -> tuple[str, list[dict]]:
    with httpx.stream("POST", server.base_url + path, json={**body, "stream": True}, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    if path == "/completion":
        return "".join(c["content"] for c in chunks), chunks
    return "".join(
        c["choices"][0].get("delta", {}).get("content") or "" for c in chunks if c["choices"]
    ), chunks


def test_n_indent_on_the_routes(shifting: ServerProcess) -> None:
    body = {"prompt": "Code:\n", "n_predict": 60, **INDENTED}
    free = post(shifting, "/completion", body).json()
    assert free["tokens_predicted"] == 60 and free["content"].startswith("x\n    a\n    b\nc\n    d\n")
    cut = post(shifting, "/completion", {**body, "n_indent": 4}).json()
    assert cut["content"] == "x\n    a\n    b\n" and cut["stop_type"] == "limit"
    assert cut["tokens_predicted"] < 60
    text, chunks = streamed_text(shifting, "/completion", {**body, "n_indent": 4})
    assert text == cut["content"] and chunks[-1]["stop_type"] == "limit"
    deeper = post(shifting, "/completion", {**body, "n_indent": 6}).json()
    assert deeper["content"] == "x\n    "  # cut where the short line's indentation ends
    v1 = post(shifting, "/v1/completions", {**body, "max_tokens": 60, "n_indent": 4}).json()
    assert v1["choices"][0]["text"] == "x\n    a\n    b\n" and v1["choices"][0]["finish_reason"] == "length"
    chat = {"messages": [{"role": "user", "content": "Code"}], "max_tokens": 60, **INDENTED, "n_indent": 4}
    reply = post(shifting, "/v1/chat/completions", chat).json()
    assert reply["choices"][0]["message"]["content"] == "x\n    a\n    b\n"
    assert reply["choices"][0]["finish_reason"] == "length"
    text, _ = streamed_text(shifting, "/v1/chat/completions", chat)
    assert text == "x\n    a\n    b\n"
    # the Anthropic route takes llama-server's fields as extras (not `grammar`): the model's own text
    anthropic = {"messages": chat["messages"], "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    free_text = post(shifting, "/v1/messages", anthropic).json()["content"][0]["text"]
    message = post(shifting, "/v1/messages", {**anthropic, "n_indent": 4})
    assert message.status_code == 200, message.text
    text = message.json()["content"][0]["text"]
    assert text == llama_server_indent(list(free_text), 4)[0] and len(text) < len(free_text)
    assert message.json()["stop_reason"] == "max_tokens"


def test_n_keep_on_a_shifting_server(shifting: ServerProcess) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 150, "temperature": 0, "ignore_eos": True}
    kept = post(shifting, "/completion", {**body, "n_keep": 3, "id_slot": 0}).json()
    assert kept["truncated"] is True and kept["tokens_predicted"] == 150
    params = httpx.get(shifting.base_url + "/slots", timeout=30).json()[0]["params"]
    assert params["n_keep"] == 3 and "n_indent" not in params  # llama-server lists n_keep only
    free = post(shifting, "/completion", body).json()
    assert free["truncated"] is True and kept["content"] != free["content"]
    prompt = [(i * 37) % 40000 + 100 for i in range(301)]  # too long: cut keeping n_keep tokens
    cut = post(shifting, "/completion", {"prompt": prompt, "n_predict": 1, "n_keep": 10}).json()
    assert cut["truncated"] is True and cut["tokens_evaluated"] < 128
    chat = {"messages": [{"role": "user", "content": "Tell a long story"}], "max_tokens": 150}
    reply = post(shifting, "/v1/chat/completions", {**chat, "n_keep": -1, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 150


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_keep", "many"), ("n_keep", "3"), ("n_keep", -2), ("n_indent", "x"), ("n_indent", -1)],
)
def test_bad_values_are_400_in_the_routes_shape(shifting: ServerProcess, field: str, value: object) -> None:
    native = post(shifting, "/completion", {"prompt": "Hi", "n_predict": 1, field: value})
    assert native.status_code == 400 and field in native.text
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, field: value}
    reply = post(shifting, "/v1/chat/completions", chat)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    message = post(shifting, "/v1/messages", chat)
    assert message.status_code == 400 and message.json()["type"] == "error"
