"""How one chat answer is read: the reasoning split, then its format's parser (both from its request).

The engine's sequence reads every generated piece through them (engine/sequence.py); a prefill (the
assistant message the answer continues) is read first, so the answer is read as its continuation, and
what the prefill itself reads as is the message the server puts before the answer (llama-server parses
the prefilled message and the answer as one text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.api import GenerationRequest
from engine.text.reasoning import ReasoningState, Split
from engine.text.tokenizer import IncrementalDecoder, Tokenizer
from engine.text.tool_calls import FORMATS, AnswerReading, IdFactory, ParseDelta, ToolCallParser


@dataclass
class AnswerReaders:
    """One answer's reasoning state (None: the text is left alone) and parser (None: all content)."""

    reasoning: ReasoningState | None
    parser: ToolCallParser | None

    def split(self, text: str, forced: bool, final: bool) -> Split:
        if self.reasoning is None:
            return Split(content=text)
        split = self.reasoning.push(text, forced)
        return split + self.reasoning.flush() if final else split

    def parse(self, split: Split, final: bool) -> ParseDelta:
        """The answer part of `split` through the parser: content, reasoning and call steps."""
        if self.parser is None:
            return ParseDelta(split.content, split.reasoning)
        parsed = self.parser.push(split.content)
        if final:
            parsed += self.parser.flush()
        return ParseDelta(parsed.content, split.reasoning + parsed.reasoning, parsed.tool_calls)

    def read(self, text: str, forced: bool = False, final: bool = False) -> ParseDelta:
        return self.parse(self.split(text, forced, final), final)


class PreservingDecoder(IncrementalDecoder):
    """The answer's detokenizer: control tokens stay hidden except the format's markers the parser
    reads (llama-server renders a request's preserved tokens: a GPT-OSS GGUF's `<|channel|>` is one)."""

    def __init__(self, tokenizer: Tokenizer, preserved: frozenset[int]) -> None:
        super().__init__(tokenizer)
        self._preserved = preserved

    def push(self, token: int) -> str:
        return self._utf8.decode(self._tokenizer.token_to_piece(token, token in self._preserved))


def answer_decoder(tokenizer: Tokenizer, request: GenerationRequest) -> IncrementalDecoder:
    """The detokenizer of `request`'s answer (its format's preserved tokens rendered)."""
    calls = request.tool_calls
    if calls is None or not calls.preserved:
        return IncrementalDecoder(tokenizer)
    return PreservingDecoder(tokenizer, frozenset(calls.preserved))


def answer_readers(
    request: GenerationRequest, encode: Callable[[str], list[int]], new_id: IdFactory | None = None
) -> AnswerReaders:
    """The readers of `request`'s answer, its prefill read already (what that read gave is
    `prefill_message`'s). `encode` makes the reasoning budget's forced tokens; `new_id` the ids."""
    readers = _fresh_readers(request, encode, new_id)
    if request.prefill:
        readers.read(request.prefill, forced=True)
    return readers


def prefill_message(request: GenerationRequest) -> ParseDelta:
    """What the request's prefill reads as (content and reasoning; calls are not continued): the
    message the answer continues, as llama-server reports it before the answer."""
    if not request.prefill:
        return ParseDelta()
    delta = _fresh_readers(request, lambda text: []).read(request.prefill, forced=True)
    return ParseDelta(delta.content, delta.reasoning)


def _fresh_readers(
    request: GenerationRequest, encode: Callable[[str], list[int]], new_id: IdFactory | None = None
) -> AnswerReaders:
    spec = request.reasoning
    reasoning = ReasoningState(spec, encode) if spec is not None else None
    parser = None
    calls = request.tool_calls
    if calls is not None:
        reading = AnswerReading(calls.calls, spec is not None and spec.split, calls.fenced_json)
        fmt = FORMATS[calls.format]
        parser = fmt.answer_parser(calls.tools, new_id, calls.stream_arguments, reading)
    return AnswerReaders(reasoning, parser)
