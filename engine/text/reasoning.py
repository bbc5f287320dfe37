"""Reasoning blocks on the text stream: split thinking from the answer, bound it, and end it on request.

A thinking model writes `<think>...</think>` (or its own tags) before the answer. The splitter routes the
text between the tags to `reasoning` and the rest to `content`, holding back a tag split across tokens the
way StopMatcher holds back a partial stop string. Like llama-server, only a block that opens the output
(or that the prompt already opened) is reasoning: once it closes, a later `<think>` is answer text.

Budget and control end the block by forcing tokens: the sequence feeds the budget message and the end
tag instead of sampled tokens, so the model sees them in its context as if it had written them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from engine.api import ControlResult, ReasoningSpec, ReasoningTags

# (start tag, end tags) of the thinking formats we know; the first whose start tag the template mentions
# wins. Several end tags are accepted because models trained on one sometimes write the other.
KNOWN_TAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("<|START_THINKING|>", ("<|END_THINKING|>",)),
    ("<seed:think>", ("</seed:think>",)),
    ("[THINK]", ("[/THINK]",)),
    ("<think>", ("</think>", "</thinking>")),
)

REASONING_FORMATS = ("none", "deepseek", "auto")
REASONING_MODES = ("on", "off", "auto")


@dataclass(frozen=True)
class Split:
    content: str = ""
    reasoning: str = ""

    def __add__(self, other: Split) -> Split:
        return Split(self.content + other.content, self.reasoning + other.reasoning)


def detect_tags(template_source: str) -> ReasoningTags | None:
    """The thinking tags a chat template uses, or None if it has no thinking block."""
    for start, ends in KNOWN_TAGS:
        if start in template_source or ends[0] in template_source:
            return ReasoningTags(start, ends)
    return None


def end_before_start(spec: ReasoningSpec | None) -> ControlResult:
    """Whether reasoning_end can apply to a request still waiting for a slot: only when its prompt
    already opened the block (it then starts by closing it)."""
    if spec is None or not spec.controllable:
        return ControlResult(False, "the completion was not started with reasoning_control")
    if not spec.starts_open:
        return ControlResult(False, "the completion is not in a reasoning block")
    return ControlResult(True)


def prompt_opens_block(prompt_text: str, tags: ReasoningTags) -> bool:
    """Whether the rendered prompt leaves a thinking block open for the model to continue."""
    return prompt_text.rstrip().endswith(tags.start)


def resolve_spec(
    reasoning_format: str,
    template_source: str,
    prompt_text: str,
    budget: int = -1,
    budget_message: str = "",
    controllable: bool = False,
    own_tags: ReasoningTags | None = None,
) -> ReasoningSpec | None:
    """A request's ReasoningSpec from the effective settings; None when nothing would ever happen.

    `auto` splits when the template has a thinking block; `deepseek` splits with the template's tags or
    the default ones; `none` leaves the text alone (the prompt's open block at its start, as llama.cpp
    parses the generation prompt with the answer) but still tracks the block, so a budget still applies.
    `own_tags` (a tool-call format's own thinking tags) win over what the template shows.
    """
    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}")
    found = own_tags or detect_tags(template_source)
    tags = found or ReasoningTags()
    split = reasoning_format == "deepseek" or (reasoning_format == "auto" and found is not None)
    opens = prompt_opens_block(prompt_text, tags)
    if not split and budget < 0 and not controllable and not opens:
        return None
    opening = prompt_text[prompt_text.rstrip().rfind(tags.start) :] if opens else ""
    return ReasoningSpec(tags, split, opens, budget, budget_message, controllable, opening)


def partial_suffix(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of the tags."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:n]):
                best = n
                break
    return best


class _State(Enum):
    AWAIT_START = "await_start"  # nothing but whitespace yet: a start tag may still open the block
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningSplitter:
    """Splits a text stream into reasoning and content. Text is held back only while it may still be
    (part of) a tag, or is whitespace that the split trims (around the reasoning, before the answer)."""

    def __init__(self, tags: ReasoningTags, starts_open: bool = False) -> None:
        self.tags = tags
        self._state = _State.REASONING if starts_open else _State.AWAIT_START
        self._trim_lead = starts_open  # drop whitespace at the start of the current section
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        return self._state is _State.REASONING

    def push(self, text: str) -> Split:
        buf, self._held = self._held + text, ""
        out = Split()
        while buf:
            if self._trim_lead:
                buf = buf.lstrip()
                if not buf:
                    break
                self._trim_lead = False
            if self._state is _State.AWAIT_START:
                buf = self._await_start(buf)
            elif self._state is _State.REASONING:
                reasoning, buf = self._reasoning(buf)
                out += Split(reasoning=reasoning)
            else:
                out, buf = out + Split(content=buf), ""
        return out

    def flush(self) -> Split:
        """The end of the stream: what was held back was not a tag after all."""
        held, self._held = self._held, ""
        if self._state is _State.REASONING:
            return Split(reasoning=held.rstrip())
        return Split(content=held)

    def _await_start(self, buf: str) -> str:
        stripped = buf.lstrip()
        if stripped.startswith(self.tags.start):
            self._state, self._trim_lead = _State.REASONING, True
            return stripped[len(self.tags.start) :]
        if self.tags.start.startswith(stripped):  # whitespace and maybe the start tag's beginning
            self._held = buf
            return ""
        self._state = _State.CONTENT  # an answer without a thinking block, kept verbatim
        return buf

    def _reasoning(self, buf: str) -> tuple[str, str]:
        """(reasoning text to emit, rest of buf to process in the next state)."""
        tags = self.tags
        found = min(((buf.find(t), t) for t in (*tags.ends, *tags.stops) if t in buf), default=None)
        if found is not None:
            at, tag = found
            self._state, self._trim_lead = _State.CONTENT, True
            rest = buf[at:] if tag in tags.stops and tag not in tags.ends else buf[at + len(tag) :]
            return buf[:at].rstrip(), rest
        keep = partial_suffix(buf, (*tags.ends, *tags.stops))
        body = buf[: len(buf) - keep]
        emit = body.rstrip()  # trailing whitespace waits: it is dropped if the end tag follows
        self._held = buf[len(emit) :]
        return emit, ""


class ReasoningState:
    """One sequence's reasoning: the splitter plus the budget. Lives on the engine thread only.

    `encode` turns text into token ids without BOS; it is used for the forced message and end tag.
    """

    def __init__(self, spec: ReasoningSpec, encode: Callable[[str], list[int]]) -> None:
        self.spec = spec
        self.splitter = ReasoningSplitter(spec.tags, spec.starts_open)
        self._encode = encode
        self.n_reasoning = 0  # tokens the model itself wrote inside the block
        self.ending = False  # the end sequence is queued (budget or control): nothing more to force
        self._opening = spec.opening  # raw content's start (reasoning_format none), given once

    @property
    def in_reasoning(self) -> bool:
        return self.splitter.in_reasoning

    def budget_tokens(self) -> list[int]:
        """Tokens to force now: the budget message and the end tag, once, when the budget is spent."""
        budget = self.spec.budget
        if self.ending or budget < 0 or not self.in_reasoning or self.n_reasoning < budget:
            return []
        self.ending = True
        message = self._encode(self.spec.budget_message) if self.spec.budget_message else []
        return message + self._encode(self.spec.tags.end)

    def end_now(self) -> tuple[ControlResult, list[int]]:
        """The reasoning_end action: the end tag to force at the next step (no budget message)."""
        if not self.spec.controllable:
            return ControlResult(False, "the completion was not started with reasoning_control"), []
        if self.ending:
            return ControlResult(True), []  # already being ended: nothing more to do
        if not self.in_reasoning:
            return ControlResult(False, "the completion is not in a reasoning block"), []
        self.ending = True
        return ControlResult(True), self._encode(self.spec.tags.end)

    def push(self, text: str, forced: bool) -> Split:
        split = self.splitter.push(text)
        if not forced and self.in_reasoning:
            self.n_reasoning += 1
        if self.spec.split:
            return split
        opening, self._opening = self._opening, ""
        return Split(content=opening + text)

    def flush(self) -> Split:
        split = self.splitter.flush()
        if self.spec.split:
            return split
        opening, self._opening = self._opening, ""
        return Split(content=opening)
