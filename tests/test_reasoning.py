"""Reasoning on the text stream (engine/text/reasoning.py) and its budget/control in the scheduler and
sequence, without HTTP.

The scheduler tests feed scripted logits instead of a model's: each step's logits are one-hot on the next
scripted token, so what the sequence generates is exactly the script except where it forces tokens. A
stand-in is the right tool here: these tests pin which tokens are forced at which step, and a real
model's own picks are not the test's to choose (the HTTP tests in test_reasoning_server.py run the real
model end to end).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.api import GenerationRequest, TokenEvent
from engine.backend import cpu_backend
from engine.gguf import GGUFFile
from engine.memory.kv import KVCache
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.slots import SlotPool
from engine.text.reasoning import (
    ReasoningSpec,
    ReasoningSplitter,
    ReasoningState,
    ReasoningTags,
    Split,
    detect_tags,
    resolve_spec,
)
from engine.text.tokenizer import Tokenizer
from server.config.parse import parse_settings

TAGS = ReasoningTags()


def split_stream(pieces: list[str], starts_open: bool = False) -> tuple[list[Split], Split]:
    """Every push's output and the total (flush included) of a splitter fed `pieces`."""
    splitter = ReasoningSplitter(TAGS, starts_open)
    outs = [splitter.push(p) for p in pieces]
    outs.append(splitter.flush())
    total = Split()
    for out in outs:
        total += out
    return outs, total


# -- the splitter ------------------------------------------------------------------------------------
def test_open_prompt_splits_reasoning_from_answer() -> None:
    _, total = split_stream(["\nThe sky", " is blue.", "\n", "</think>", "\n\n", "It is", " blue."], True)
    assert total == Split(content="It is blue.", reasoning="The sky is blue.")


def test_tags_split_over_many_pieces_are_recognised() -> None:
    pieces = ["<", "th", "ink", ">", "\nhm", "m.", "</", "th", "ink", ">", "Yes", "."]
    outs, total = split_stream(pieces)
    assert total == Split(content="Yes.", reasoning="hmm.")
    for out in outs:  # no tag fragment ever leaks, in either channel
        assert "<" not in out.content + out.reasoning and ">" not in out.content + out.reasoning


def test_text_that_mentions_think_in_the_answer_stays_content() -> None:
    pieces = ["plan", "</think>", "Use the <think>", " tag, then </think>", " closes it."]
    _, total = split_stream(pieces, starts_open=True)
    assert total == Split(content="Use the <think> tag, then </think> closes it.", reasoning="plan")


def test_an_answer_without_a_block_is_kept_verbatim() -> None:
    _, total = split_stream(["  Hello", " <think> is a tag", "."])
    assert total == Split(content="  Hello <think> is a tag.")


def test_a_start_tag_prefix_that_is_not_a_tag_is_released() -> None:
    outs, total = split_stream(["<th", "ought>"])
    assert outs[0] == Split()  # held: it could still become <think>
    assert total == Split(content="<thought>")


def test_a_partial_end_tag_inside_reasoning_is_released_as_reasoning() -> None:
    _, total = split_stream(["a </thi", "s is not a tag", "</think>b"], starts_open=True)
    assert total == Split(content="b", reasoning="a </this is not a tag")


def test_think_inside_reasoning_is_reasoning_text() -> None:
    _, total = split_stream(["I wrote <think> here", "</think>ok"], starts_open=True)
    assert total == Split(content="ok", reasoning="I wrote <think> here")


def test_the_alternative_end_tag_closes_the_block() -> None:
    _, total = split_stream(["x", "</thinking>", "y"], starts_open=True)
    assert total == Split(content="y", reasoning="x")


def test_no_push_returns_an_empty_or_whitespace_only_piece() -> None:
    pieces = ["\n", "Step", " one", "\n\n", "Step", " two", "\n", "</", "think", ">", "\n\n", "Done", "\n"]
    outs, total = split_stream(pieces, starts_open=True)
    assert total == Split(content="Done\n", reasoning="Step one\n\nStep two")
    for out in outs[:-1]:
        assert out.reasoning == "" or out.reasoning.strip()


def test_unterminated_reasoning_is_flushed_trimmed() -> None:
    _, total = split_stream(["still thinking", " </thi", "  "], starts_open=True)
    assert total == Split(reasoning="still thinking </thi")


# -- the budget state --------------------------------------------------------------------------------
def fake_encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_budget_forces_message_then_end_tag_once() -> None:
    state = ReasoningState(ReasoningSpec(TAGS, starts_open=True, budget=2, budget_message="ok"), fake_encode)
    assert state.budget_tokens() == []
    state.push("a", forced=False)
    assert state.budget_tokens() == []
    state.push("b", forced=False)
    assert state.budget_tokens() == fake_encode("ok</think>")
    assert state.budget_tokens() == []  # never twice


def test_budget_zero_forces_at_once_and_forced_tokens_do_not_count() -> None:
    state = ReasoningState(ReasoningSpec(TAGS, starts_open=True, budget=0), fake_encode)
    assert state.budget_tokens() == fake_encode("</think>")
    state.push("</think>", forced=True)
    assert state.n_reasoning == 0 and not state.in_reasoning


def test_a_block_the_model_closes_stops_the_budget() -> None:
    state = ReasoningState(ReasoningSpec(TAGS, starts_open=True, budget=3), fake_encode)
    for piece in ("a", "</think>", "b", "c", "d"):
        state.push(piece, forced=False)
        assert state.budget_tokens() == []
    assert state.n_reasoning == 1


def test_end_now_needs_control_and_an_open_block() -> None:
    plain = ReasoningState(ReasoningSpec(TAGS, starts_open=True), fake_encode)
    assert plain.end_now()[0].success is False
    spec = ReasoningSpec(TAGS, starts_open=True, controllable=True, budget_message="not used")
    state = ReasoningState(spec, fake_encode)
    result, tokens = state.end_now()
    assert result.success and tokens == fake_encode("</think>")
    assert state.end_now() == (result, [])  # already ending: success, nothing more forced
    closed = ReasoningState(ReasoningSpec(TAGS, controllable=True), fake_encode)
    closed.push("no block here", forced=False)
    assert closed.end_now()[0].success is False


def test_format_none_keeps_raw_text_but_still_tracks_the_block() -> None:
    state = ReasoningState(ReasoningSpec(TAGS, split=False, starts_open=True, budget=1), fake_encode)
    assert state.push("x", forced=False) == Split(content="x")
    assert state.budget_tokens() == fake_encode("</think>")
    assert state.push("</think>", forced=True) == Split(content="</think>")
    assert state.flush() == Split()


# -- resolving a request's spec ----------------------------------------------------------------------
THINK_TEMPLATE = "{{ '<|im_start|>assistant\\n<think>\\n' }}"


def test_auto_splits_only_when_the_template_has_a_thinking_block() -> None:
    assert detect_tags(THINK_TEMPLATE) == TAGS
    assert detect_tags("{{ '[THINK]' }}") == ReasoningTags("[THINK]", ("[/THINK]",))
    assert resolve_spec("auto", "chatml", "prompt") is None
    spec = resolve_spec("auto", THINK_TEMPLATE, "x<|im_start|>assistant\n<think>\n")
    assert spec is not None and spec.split and spec.starts_open
    closed = resolve_spec("deepseek", THINK_TEMPLATE, "x<think>\n\n</think>\n\n")
    assert closed is not None and not closed.starts_open
    raw = resolve_spec("none", THINK_TEMPLATE, "<think>\n", budget=4)
    assert raw is not None and not raw.split and raw.budget == 4
    with pytest.raises(ValueError):
        resolve_spec("deepseek-legacy", THINK_TEMPLATE, "")


def test_cli_reasoning_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _ = parse_settings(
        ["--reasoning-format", "deepseek", "-rea", "off", "--reasoning-budget", "7"]
        + ["--reasoning-budget-message", "Enough."]
    )
    assert (settings.reasoning_format, settings.reasoning) == ("deepseek", "off")
    assert (settings.reasoning_budget, settings.reasoning_budget_message) == (7, "Enough.")
    monkeypatch.setenv("LLAMA_ARG_THINK_BUDGET", "0")
    monkeypatch.setenv("LLAMA_ARG_THINK", "none")
    settings, _ = parse_settings([])
    assert settings.reasoning_budget == 0 and settings.reasoning_format == "none"


# -- the scheduler with a scripted model --------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf)


class ScriptedRun:
    """Drives a Scheduler whose 'model' picks the next token of a script (greedy over one-hot logits)."""

    def __init__(self, tokenizer: Tokenizer, script: list[int]) -> None:
        self.tokenizer = tokenizer
        pool = SlotPool(KVCache(1, 1, 512, 1, 1, cpu_backend()), slot_similarity=0.1, prompt_cache=None)
        self.scheduler = Scheduler(pool, tokenizer, n_ubatch=64)
        self.script = list(script)
        self.events: list[TokenEvent] = []

    def submit(self, spec: ReasoningSpec, n_predict: int, request_id: str = "r") -> None:
        prompt = self.tokenizer.encode("<|im_start|>assistant\n<think>\n", False, True)
        request = GenerationRequest(
            prompt, SamplingParams(temperature=0), n_predict, request_id=request_id, reasoning=spec
        )
        self.scheduler.waiting.append((request, self.events.append))
        self.scheduler.admit()

    def step(self) -> None:
        self.scheduler.admit()
        planned = self.scheduler.build_batch()
        assert planned is not None
        _, outputs = planned
        pick = self.script[0] if self.script else self.tokenizer.eos_id
        logits = np.full((len(outputs), self.tokenizer.n_vocab), -10.0, dtype=np.float32)
        logits[:, pick] = 10.0
        n_events = len(self.events)
        self.scheduler.apply(logits, outputs)
        # The model 'wrote' its token only if it was not overridden by a forced one.
        if self.script and any(e.token == pick for e in self.events[n_events:]):
            self.script.pop(0)

    def run(self) -> None:
        while self.scheduler.has_work():
            self.step()

    def text(self) -> tuple[str, str]:
        return "".join(e.reasoning_text for e in self.events), "".join(e.text for e in self.events)

    def tokens(self) -> list[int]:
        return [e.token for e in self.events if e.token is not None]


def words(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, False, True)


def test_scheduler_forces_message_and_end_tag_after_the_budget(tokenizer: Tokenizer) -> None:
    thinking = words(tokenizer, " one two three four five six")
    answer = words(tokenizer, "\n\nThe answer.")
    message = " Time to answer."
    run = ScriptedRun(tokenizer, thinking[:3] + answer)
    spec = ReasoningSpec(TAGS, starts_open=True, budget=3, budget_message=message)
    run.submit(spec, n_predict=40)
    run.run()
    forced = words(tokenizer, message) + words(tokenizer, "</think>")
    assert run.tokens() == thinking[:3] + forced + answer + [tokenizer.eos_id]
    assert run.text() == ("one two three Time to answer.", "The answer.")
    assert run.events[-1].timings is not None and run.events[-1].timings.predicted_n == len(run.tokens())


def test_scheduler_budget_zero_closes_before_the_first_model_token(tokenizer: Tokenizer) -> None:
    answer = words(tokenizer, "Hi.")
    run = ScriptedRun(tokenizer, answer)
    run.submit(ReasoningSpec(TAGS, starts_open=True, budget=0), n_predict=20)
    run.run()
    assert run.tokens()[:3] == words(tokenizer, "</think>")
    assert run.text() == ("", "Hi.")


def test_scheduler_control_ends_the_block_at_the_next_step(tokenizer: Tokenizer) -> None:
    thinking = words(tokenizer, " a b c d e f g h")
    run = ScriptedRun(tokenizer, thinking[:2] + words(tokenizer, "Done."))
    run.submit(ReasoningSpec(TAGS, starts_open=True, controllable=True), n_predict=30, request_id="c")
    run.step()  # prefill + first token
    run.step()
    result = run.scheduler.control("c", "reasoning_end")
    assert result.success
    run.run()
    end = words(tokenizer, "</think>")
    assert run.tokens() == thinking[:2] + end + words(tokenizer, "Done.") + [tokenizer.eos_id]
    assert run.text() == ("a b", "Done.")
    assert run.scheduler.control("c", "reasoning_end").success is False  # finished


def test_scheduler_control_answers_for_every_kind_of_request(tokenizer: Tokenizer) -> None:
    run = ScriptedRun(tokenizer, words(tokenizer, " x y z"))
    run.submit(ReasoningSpec(TAGS, starts_open=True), n_predict=5, request_id="plain")
    assert "reasoning_control" in run.scheduler.control("plain", "reasoning_end").message
    assert run.scheduler.control("nobody", "reasoning_end").success is False
    assert run.scheduler.control("plain", "explode").success is False


def test_scheduler_control_before_admission_applies_at_start(tokenizer: Tokenizer) -> None:
    run = ScriptedRun(tokenizer, words(tokenizer, "Fine."))
    run.submit(ReasoningSpec(TAGS, starts_open=True), n_predict=5, request_id="busy")
    spec = ReasoningSpec(TAGS, starts_open=True, controllable=True)
    prompt = tokenizer.encode("<think>\n", False, True)
    waiting = GenerationRequest(prompt, SamplingParams(temperature=0), 8, request_id="w", reasoning=spec)
    events: list[TokenEvent] = []
    run.scheduler.waiting.append((waiting, events.append))
    assert run.scheduler.control("w", "reasoning_end").success  # the only slot is busy: still waiting
    run.run()
    tokens = [e.token for e in events if e.token is not None]
    assert tokens[:3] == words(tokenizer, "</think>")
