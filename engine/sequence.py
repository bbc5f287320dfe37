"""One request's per-token state, and what one row of logits turns into.

The scheduler owns slots and batches; a Sequence owns everything that happens to its request's tokens:
what to feed next, the sampler (with its penalty history and RNG), the incremental detokenizer, stop
strings, the reasoning split and budget, the grammar's mask, tool-call parsing, logprobs and timings.
`advance` is its one entry point per generated token: logits in, a TokenEvent out. The text goes
detokenizer -> stop strings -> reasoning split -> tool-call parser, so streamed and whole replies are
the same. Speculative acceptance attaches here too (docs/architecture.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.api import ControlResult, GenerationRequest, PromptProgress, Timings, TokenEvent
from engine.grammar import GrammarMatcher
from engine.media.chunks import cut_before_media, is_marker
from engine.sampling import DryVocabulary, Sampler, SamplingParams
from engine.speculative import SpecParams
from engine.speculative.policy import AcceptanceRate
from engine.text.answer import AnswerReaders, answer_decoder, answer_readers
from engine.text.reasoning import ReasoningState, Split
from engine.text.stop import StopMatcher
from engine.text.tokenizer import IncrementalDecoder, Tokenizer
from engine.text.tool_calls import ParseDelta, ToolCallParser

Emit = Callable[[TokenEvent], None]


@dataclass
class Drafting:
    """One sequence's speculation: its settings, the adaptive draft length, and its statistics.

    The length doubles while whole drafts are accepted and falls to what was accepted (+1) when not; a
    draft refused outright also pauses drafting for a number of steps that doubles each time (up to
    32), so a sequence whose text does not repeat pays for almost no wasted verification.
    """

    params: SpecParams
    source: str = ""  # the speculator whose draft is being verified
    length: int = 0
    pause: int = 0  # steps to wait before the next draft
    misses: int = 0  # consecutive drafts refused outright
    n_drafted: int = 0
    n_accepted: int = 0
    n_verified: int = 0  # verification steps (llama-server's spec_decode_num_drafts_total)
    # Its per-token acceptance, which the draft policy prices its next draft with (learnt in
    # engine/speculative/batching.py `StepDrafts.settle`, with the engine-wide rate as prior).
    acceptance: AcceptanceRate = field(default_factory=AcceptanceRate)

    def __post_init__(self) -> None:
        self.length = self.params.n_max

    def next_length(self) -> int:
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.length

    def learn(self, n_drafted: int, n_accepted: int) -> None:
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        self.n_verified += 1
        if n_accepted == n_drafted:
            self.length, self.misses = min(self.params.n_max, 2 * self.length), 0
        elif n_accepted == 0:
            self.misses += 1
            self.pause = min(32, 2**self.misses)
            self.length = max(1, self.length // 2)
        else:
            self.length, self.misses = max(1, n_accepted + 1), 0


@dataclass
class Sequence:
    request: GenerationRequest
    emit: Emit  # where its events go (the request handle, across the thread boundary)
    slot_id: int
    sampler: Sampler
    decoder: IncrementalDecoder
    stopper: StopMatcher
    eog_ids: frozenset[int]
    reasoning: ReasoningState | None = None
    tool_parser: ToolCallParser | None = None
    grammar: GrammarMatcher | None = None
    n_tool_calls: int = 0  # calls the answer has started so far
    pending: list[int] = field(default_factory=list)  # to feed next: the prompt's rest, then the last pick
    n_cached: int = 0  # prompt tokens whose cells were reused
    n_generated: int = 0
    has_new_line: bool = False  # the answer's text has had a newline (/slots' next_token)
    t_start: float = field(default_factory=time.perf_counter)
    t_prompt_done: float = 0.0
    truncated: bool = False  # the prompt was cut or the context shifted
    # Tokens to feed instead of sampling (a reasoning block's forced end), taken one per step.
    forced: deque[int] = field(default_factory=deque)
    drafting: Drafting | None = None  # speculative decoding, when the request asks for it
    indent: IndentLimit | None = None  # the request's n_indent rule, when it sets one
    # The generated text, a piece a token (llama-server's generated_text: after stop strings, before the
    # reasoning split), which /slots shows under LLAMA_SERVER_SLOTS_DEBUG.
    text_pieces: list[str] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)  # draft tokens in the batch in flight
    drafts_accepted: int = 0  # of the last verified drafts
    # `n` choices (engine/choices.py): the slots of the other choices, which wait for this prompt (held).
    forks: list[int] = field(default_factory=list)
    held: bool = False  # a choice waiting for its leader's prompt cells; not in any batch until then

    @property
    def generating(self) -> bool:
        return self.t_prompt_done > 0

    def take(self, budget: int) -> list[int]:
        """The next tokens to feed, at most `budget`; the sequence wants logits once none are left."""
        n = cut_before_media(self.pending, budget, self.request.media)
        chunk, self.pending = self.pending[:n], self.pending[n:]
        return chunk

    # -- speculative decoding --------------------------------------------------------------------
    def draft_length(self, room: int) -> int:
        """How many draft tokens to verify next step (0: none): the adaptive length, within `room`
        (cells and batch budget left) and what n_predict leaves. Grammars and forced tokens draft none."""
        if self.drafting is None or self.grammar is not None or self.forced or not self.generating:
            return 0
        left = self.request.n_predict - self.n_generated - 1 if self.request.n_predict >= 0 else room
        return max(0, min(self.drafting.next_length(), room, left))

    def verify(self, rows: np.ndarray, room: bool) -> list[TokenEvent]:
        """Advance through the logits of a drafted part (one row per fed token): each pick is made with
        its draft token in hand, and the first pick that differs (or ends the sequence) ends the run.
        The events of every pick made; `drafts_accepted` is how many drafts they kept."""
        drafts = self.drafts
        events = []
        for i, row in enumerate(rows):
            draft = drafts[i] if i < len(drafts) else None
            event = self.advance(row, room or i < len(rows) - 1, draft)
            events.append(event)
            if event.finish_reason is not None or event.token != draft:
                break
        self.drafts_accepted = sum(e.token == d for e, d in zip(events, drafts, strict=False))
        if self.drafting is not None and drafts:
            self.drafting.learn(len(drafts), self.drafts_accepted)
        return events

    # -- one generated token ---------------------------------------------------------------------
    def advance(self, logits: np.ndarray, room: bool, draft: int | None = None) -> TokenEvent:
        """Pick the next token from `logits` (float32 [n_vocab]) and say what it means.

        `room`: whether the slot's context can hold another token; without it the sequence ends for
        length. `draft`: a speculative token for this position (the pick's distribution is unchanged).
        The event's finish_reason is set when the sequence ends.
        """
        if not self.generating:
            self.t_prompt_done = time.perf_counter()
        constrained = self._in_answer()
        if constrained and self.grammar is not None:
            token, forced = _rejection_sample(self.grammar, self.sampler, logits, self._next_token, draft)
        else:
            token, forced = self._next_token(logits, draft)
        probs = _token_probs(self.request.sampling, self.sampler, logits, token, forced)
        self.sampler.accept(token)
        self.n_generated += 1
        grammar_done = constrained and self._grammar_accepts(token)
        is_eog = token in self.eog_ids and not self.request.ignore_eos
        text, stop_word = ("", None) if is_eog else self.stopper.push(self.decoder.push(token))
        finish = self._finish_reason(is_eog or stop_word is not None or grammar_done, room)
        if grammar_done and not is_eog and stop_word is None and not self.request.ignore_eos:
            # llama.cpp samples the end-of-generation token a complete grammar leaves, one more step,
            # and counts it (tokens_predicted, completion_tokens); Llamba ends without the step.
            self.n_generated += 1
        finish = finish or _timed_out(self.request, self.t_prompt_done, text)
        if finish and stop_word is None:
            text += self.stopper.push(self.decoder.flush())[0] + self.stopper.flush()
        if self.indent is not None:
            text, cut = self.indent.push(text, finish is not None)
            if cut and not is_eog:  # llama-server: the limit, unless the token is an end of generation
                finish, stop_word = "length", None
        self.has_new_line = self.has_new_line or "\n" in text
        self.text_pieces.append(text)
        answer = self._read_answer(self._split(text, forced, finish is not None), finish is not None)
        if finish == "stop" and self.n_tool_calls:
            finish = "tool_calls"  # as llama-server: an answer that ends with calls asks for their results
        self.pending = [] if finish else [token]
        return TokenEvent(
            text=answer.content,
            reasoning_text=answer.reasoning,
            tool_calls=answer.tool_calls,
            token=token,
            finish_reason=finish,
            stop_word=stop_word,
            timings=self.timings() if finish or self.request.timings_per_token else None,
            n_prompt=len(self.request.prompt_tokens),
            n_generated=self.n_generated,
            id_slot=self.slot_id,
            truncated=self.truncated,
            **probs,
        )

    def _next_token(self, logits: np.ndarray, draft: int | None = None) -> tuple[int, bool]:
        """The token to feed next and whether it was forced rather than sampled."""
        if self.reasoning is not None and not self.forced:
            self.forced.extend(self.reasoning.budget_tokens())
        if self.forced:
            return self.forced.popleft(), True
        return self.sampler.sample(logits, draft), False

    def _in_answer(self) -> bool:
        """Whether the next token belongs to the answer (the grammar's part), not a reasoning block."""
        return not self.forced and (self.reasoning is None or not self.reasoning.in_reasoning)

    def _grammar_accepts(self, token: int) -> bool:
        """Feed the grammar the chosen token; True when it is complete (or broken): stop there."""
        if self.grammar is None:
            return False
        self.grammar.accept(token)
        return self.grammar.finished

    def _finish_reason(self, stopped: bool, room: bool) -> str | None:
        if stopped:
            return "stop"
        n_predict = self.request.n_predict
        if 0 <= n_predict <= self.n_generated or not room:
            return "length"
        return None

    def _split(self, text: str, forced: bool, final: bool) -> Split:
        return AnswerReaders(self.reasoning, self.tool_parser).split(text, forced, final)

    def _read_answer(self, split: Split, final: bool) -> ParseDelta:
        """The answer text through the format's parser: content, reasoning, calls."""
        parsed = AnswerReaders(self.reasoning, self.tool_parser).parse(split, final)
        self.n_tool_calls = max([self.n_tool_calls, *(d.index + 1 for d in parsed.tool_calls)])
        return parsed

    # -- other events ----------------------------------------------------------------------------
    def progress(self) -> TokenEvent:
        """A prompt-progress event (llama-server's): at the start (processed == cache), after each chunk."""
        total = len(self.request.prompt_tokens)
        elapsed_ms = 1e3 * (time.perf_counter() - self.t_start)
        progress = PromptProgress(total, self.n_cached, total - len(self.pending), elapsed_ms)
        timings = self.timings() if self.request.timings_per_token else None
        return TokenEvent(text="", progress=progress, timings=timings, n_prompt=total, id_slot=self.slot_id)

    def finished_early(self, reason: str, error: str | None = None) -> TokenEvent:
        """The final event of a sequence ended from outside (cancel, shutdown, a failed step)."""
        timings = self.timings()
        return TokenEvent(text="", finish_reason=reason, timings=timings, id_slot=self.slot_id, error=error)

    def timings(self) -> Timings:
        now, done = time.perf_counter(), self.t_prompt_done
        run = len(self.request.prompt_tokens) - (0 if done else len(self.pending)) - self.n_cached  # so far
        return Timings(
            cache_n=self.n_cached,
            prompt_n=max(0, run),
            prompt_ms=1e3 * ((done or (now if run > 0 else self.t_start)) - self.t_start),
            predicted_n=self.n_generated,
            predicted_ms=1e3 * (now - done) if done else 0.0,
            draft_n=self.drafting.n_drafted if self.drafting else 0,
            draft_n_accepted=self.drafting.n_accepted if self.drafting else 0,
            draft_steps=self.drafting.n_verified if self.drafting else 0,
        )

    def end_reasoning(self) -> ControlResult:
        """The reasoning_end action: the block's end tag is fed at the next steps."""
        if self.reasoning is None:
            return ControlResult(False, "the completion was not started with reasoning_control")
        result, tokens = self.reasoning.end_now()
        self.forced.extend(tokens)
        return result


def _token_probs(
    sampling: SamplingParams, sampler: Sampler, logits: np.ndarray, token: int, forced: bool
) -> dict:
    """The token's probability and the n_probs best: of the raw logits (log-probabilities), or, with
    post_sampling_probs, of what the chain drew from (a forced token had probability 1)."""
    if not sampling.n_probs:
        return {}
    if not sampling.post_sampling_probs:
        return {
            "logprob": sampler.token_logprob(logits, token),
            "top_logprobs": tuple(sampler.top_logprobs(logits, sampling.n_probs)),
        }
    if forced or sampler.last is None:
        return {"prob": 1.0, "top_probs": ((token, 1.0),)}
    drawn = sampler.last
    return {"prob": drawn.prob(token), "top_probs": tuple(drawn.top(sampling.n_probs))}


def _rejection_sample(
    grammar: GrammarMatcher,
    sampler: Sampler,
    logits: np.ndarray,
    next_token: Callable[[np.ndarray, int | None], tuple[int, bool]],
    draft: int | None,
) -> tuple[int, bool]:
    """llama.cpp's grammar-based rejection sampling (common_sampler_sample, as llama-server calls it):
    draw from the chain without the grammar and keep the pick if the grammar allows it; else mask the
    disallowed tokens and draw again (a second random number). An allowed token keeps its
    unconstrained chance and only the refused mass is redrawn under the mask, so this is not the masked
    distribution, and a seeded request draws what llama-server draws. `logits` is masked in place (the
    logprobs see the allowed tokens only). The raw copy costs 6 us a token on SmolLM2's 49k logits, 48 us
    on Gemma 3's 262k (this machine); the mask is prefetched either way. `next_token`: the sequence's
    pick (a forced token is kept as it is)."""
    raw = logits.copy()
    grammar.apply(logits)
    token, forced = next_token(raw, draft)
    if not forced and logits[token] == -np.inf:
        token = sampler.sample(logits, draft)
    return token, forced


def _timed_out(request: GenerationRequest, t_prompt_done: float, text: str) -> str | None:
    """llama-server's t_max_predict_ms: past the limit, a token whose text holds a newline ends it."""
    limit = request.t_max_predict_ms
    if limit <= 0 or "\n" not in text:
        return None
    return "length" if 1e3 * (time.perf_counter() - t_prompt_done) > limit else None


def indent_check(text: str, line: int, n_indent: int) -> tuple[int | None, int]:
    """llama-server's n_indent rule, run at each token once the generated text has had a newline: the
    line under check (from `line`, llama-server's last_nl_pos; 0: none yet, and the first line is never
    checked) ends the generation when a character other than a space or a tab (a newline too: an empty
    line) follows fewer than n_indent of them. Returns where the text is then cut (after the line's
    indentation; None: generation goes on) and the next line to check: the one after the first newline
    from `line`, one line a token, as llama-server."""
    cut = None
    if line > 0:
        pos = line
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - line < n_indent:
            cut, text = pos, text[:pos]
    nl = text.find("\n", line)
    return cut, line if nl < 0 else nl + 1


def indent_settled(text: str, line: int, n_indent: int) -> int:
    """How much of the generated text `indent_check` can no longer cut: up to the end of the indentation
    of the first line, from the one under check (`line`; 0: the one after the first newline), indented
    by fewer than n_indent spaces and tabs so far; all of it when there is none."""
    start = line or text.find("\n") + 1
    while start > 0:
        pos = start
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos - start < n_indent:
            return pos
        start = text.find("\n", pos) + 1
    return len(text)


@dataclass
class IndentLimit:
    """A request's n_indent over its generated text (after stop strings, before the reasoning split):
    the rule runs at each token as llama-server runs it, and the text it may still cut is held back, so
    a streamed reply is the whole reply's text (llama-server's stream has already sent it)."""

    n_indent: int
    text: str = ""  # the generated text so far
    sent: int = 0  # how much of it was handed on
    line: int = 0  # the line under check (llama-server's last_nl_pos)
    new_line: bool = False  # a token's text held a newline (has_new_line): the rule runs from the next

    def push(self, text: str, final: bool) -> tuple[str, bool]:
        """A token's text in: what may be handed on, and whether the rule ends the generation (the text
        cut). `final`: the generation ends anyway, so what is not cut goes out."""
        self.text += text
        cut = None
        if self.new_line:
            cut, self.line = indent_check(self.text, self.line, self.n_indent)
        self.new_line = self.new_line or "\n" in text
        if cut is not None:
            self.text = self.text[:cut]
        end = len(self.text)
        if not final and cut is None:
            end = indent_settled(self.text, self.line, self.n_indent)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out, cut is not None


def start_sequence(
    request: GenerationRequest,
    emit: Emit,
    slot_id: int,
    tokenizer: Tokenizer,
    n_cached: int,
    dry: DryVocabulary | None = None,
) -> Sequence:
    """A sequence whose slot already holds the first `n_cached` prompt tokens. `dry`: the tokenizer's
    DRY breaker tables (built here when not given), for a request with DRY on."""
    params = request.sampling
    breakers = None
    if "dry" in params.chain():
        breakers = (dry or DryVocabulary(tokenizer)).breakers(params.dry_sequence_breakers)
    sampler = Sampler(params, tokenizer.n_vocab, breakers)
    for token in request.prompt_tokens:
        if not is_marker(token):  # a medium's positions are no token (llama-server skips them too)
            sampler.accept(token)
    readers = answer_readers(request, lambda text: tokenizer.encode(text, False, True))
    return Sequence(
        request,
        emit,
        slot_id,
        sampler,
        answer_decoder(tokenizer, request),
        StopMatcher(list(request.stop)),
        tokenizer.eog_ids,
        readers.reasoning,
        readers.parser,
        request.grammar.matcher() if request.grammar is not None else None,
        pending=request.prompt_tokens[n_cached:],
        n_cached=n_cached,
        truncated=request.truncated,
        # no speculation over media: a draft model has no projector, and prompt lookup could draft a marker
        drafting=Drafting(request.speculative) if request.speculative and not request.media else None,
        indent=IndentLimit(request.n_indent) if request.n_indent > 0 else None,
    )
