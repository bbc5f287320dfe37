"""The engine's public types: what crosses its surface. The server imports these and nothing else of
the engine's internals (its one seam, `server/model/`, aside).

A generation request goes in, token events come out; slot snapshots, model facts and control results
are read back. All are frozen values, safe to hand from the engine thread to the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from engine.media.chunks import MediaChunk
from engine.sampling import SamplingParams
from engine.speculative.base import SpecParams

if TYPE_CHECKING:  # the grammar engine loads only where grammars are used
    from engine.grammar import CompiledGrammar

CONTROL_ACTIONS = ("reasoning_end",)

# llama-server's --pooling: per-token vectors, their mean, the first token's, the last token's, or the
# rerank classifier's scores (of the last token with a causal model, as llama.cpp does).
Pooling = Literal["none", "mean", "cls", "last", "rank"]
POOLING_TYPES: tuple[Pooling, ...] = ("none", "mean", "cls", "last", "rank")


@dataclass(frozen=True)
class ReasoningTags:
    start: str = "<think>"
    ends: tuple[str, ...] = ("</think>", "</thinking>")
    # Markup that ends the block where it stands and stays in the answer (Qwen3.5 may open a tool call
    # right after its thinking, without the end tag).
    stops: tuple[str, ...] = ()

    @property
    def end(self) -> str:
        """The end tag forced when the block is ended for the model."""
        return self.ends[0]


@dataclass(frozen=True)
class ReasoningSpec:
    """How one request treats reasoning (None on a request: no reasoning handling at all)."""

    tags: ReasoningTags = field(default_factory=ReasoningTags)
    split: bool = True  # False (reasoning_format none): the raw text, tags included, all goes to content
    starts_open: bool = False  # the prompt ends with the start tag: generation begins inside the block
    budget: int = -1  # model tokens allowed inside the block; -1 unlimited, 0 closes it at once
    budget_message: str = ""  # forced before the end tag when the budget runs out
    controllable: bool = False  # reasoning_control: the block may be ended via the control endpoint
    # The prompt's text from the block's start tag on ("<think>\n") when it opened the block: without the
    # split (reasoning_format none) the answer's content starts with it, as llama-server parses the
    # generation prompt and the answer as one text.
    opening: str = ""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON text, as OpenAI sends it

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ToolCallDelta:
    """One step of one call, as llama-server streams it: `id` and `name` come once, in the call's first
    delta; `arguments` fragments follow (the first delta may carry the first fragment)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        delta: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {}
        if self.id is not None:
            delta["id"], delta["type"] = self.id, "function"
        if self.name is not None:
            function["name"] = self.name
        function["arguments"] = self.arguments
        delta["function"] = function
        return delta


def add_tool_call_steps(calls: list[ToolCall], steps: tuple[ToolCallDelta, ...]) -> None:
    """Apply streamed steps to the calls so far: a new index starts a call, a known one extends its
    arguments (what a non-streamed reply accumulates from the stream)."""
    for step in steps:
        if step.index == len(calls):
            calls.append(ToolCall(step.id or "", step.name or "", step.arguments))
        else:
            call = calls[step.index]
            calls[step.index] = ToolCall(call.id, call.name, call.arguments + step.arguments)


@dataclass(frozen=True)
class ToolCallSpec:
    """How a request's answer is read for tool calls (engine/text/tool_calls); None on a request: all
    of it is content."""

    format: str  # a format name of engine.text.tool_calls.FORMATS
    tools: tuple[dict[str, Any], ...] = ()  # the request's tools (MiniMax types its XML arguments by them)
    # llama-server's streaming parse (calls announced early, arguments as they come) or its final parse
    # (calls whole at the end; a broken call leaves everything from its marker as content).
    stream_arguments: bool = True
    calls: bool = True  # False: no tools (or tool_choice none): only the format's other markup is read
    fenced_json: bool = False  # an answer schema: a ```json fence around the answer is taken off
    # Special tokens the answer's text shows (the format's markers: llama-server's preserved tokens,
    # which its detokenizer renders though they are control tokens), by id.
    preserved: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1: until end of generation or the slot's context is full
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    id_slot: int = -1  # -1: the engine chooses
    cache_prompt: bool = True
    request_id: str = ""
    timings_per_token: bool = False  # timings on every event, not only the last
    return_progress: bool = False  # an event after every prompt chunk, with `progress`
    # llama-server's time limit: once this many ms passed since the first token, the next token whose
    # text holds a newline ends the generation ("length", stop_type limit); <= 0: no limit
    t_max_predict_ms: int = -1
    n_discard: int = 0  # tokens a context shift drops after the kept ones; 0: half of the rest
    # tokens of the prompt a context shift keeps (-1: all of them; one more where the model adds BOS, as
    # llama-server counts); None: the engine's n_keep (--keep)
    n_keep: int | None = None
    # llama-server's n_indent (> 0): a generated line, after the first, indented by fewer spaces and tabs
    # ends the generation ("length", stop_type limit), the text cut where its indentation ends
    n_indent: int = 0
    truncated: bool = False  # the prompt was cut to fit the context (context shift)
    reasoning: ReasoningSpec | None = None  # None: the text is left alone (no split, budget or control)
    tool_calls: ToolCallSpec | None = None  # None: no tool-call parsing
    # The assistant message the answer continues (a prefill), as the prompt ends with it: the reasoning
    # split and the parser read it before the first token, so the answer is read as its continuation.
    prefill: str = ""
    grammar: CompiledGrammar | None = None  # constrains the answer (outside reasoning blocks)
    speculative: SpecParams | None = None  # None: no speculative decoding
    # What /slots shows as this request's `params` (llama-server's task params, written by the server):
    # the engine only hands it on in its snapshots, while the request runs and after, until the next.
    slot_params: Mapping[str, Any] = field(default_factory=dict)
    # Media chunks by the marker id their positions hold in prompt_tokens (engine/media/chunks.py).
    media: Mapping[int, MediaChunk] = field(default_factory=dict)
    # The LoRA adapters it runs under: (adapter id, scale) pairs, zero scales left out, by id
    # (engine/lora.py's adapter_set); () the base model. Its cached cells are reused only under this set.
    lora: tuple[tuple[int, float], ...] = ()
    # The position `lora` applies from (an aLoRA's activation, engine/lora.py's `activation`): the prompt's
    # tokens before it run as the base model's, and their cells are reused as the base's.
    lora_from: int = 0
    # Those adapters' weights (engine/lora.py's LoraAdapter), held while the request lives: an adapter
    # unloaded at runtime meanwhile is freed only after the requests running under it end.
    lora_hold: tuple[Any, ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class EmbeddingRequest:
    """Run a prompt and answer with its pooled final hidden states (or, pooling rank, the classifier's
    scores) instead of generating. Its one event carries `embedding`: [n_tokens, n_embd] for pooling
    none, [n_embd] pooled, [n_cls_out] for rank; not normalised (the route does llama-server's
    `embd_normalize`). Every token is evaluated (no prefix reuse): each token's state is wanted."""

    prompt_tokens: list[int]
    pooling: Pooling = "mean"
    request_id: str = ""
    id_slot: int = -1
    cache_prompt: bool = False  # the slot pool's view: nothing of a slot's cells is kept
    return_progress: bool = False
    reasoning: None = None  # no reasoning block to end (the control endpoint's view)
    media: Mapping[int, MediaChunk] = field(default_factory=dict)  # as GenerationRequest's


@dataclass(frozen=True)
class Timings:
    """llama-server's `timings` object."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0  # speculative tokens verified
    draft_n_accepted: int = 0
    draft_steps: int = 0  # verification steps of drafts (for /metrics, not in the object)

    @property
    def predicted_steps(self) -> int:
        """Decode steps the generation cost: the first token is free, it comes from the logits of the
        prompt's last batch (llama-server's rates divide by these, not by predicted_n)."""
        return max(0, self.predicted_n - 1)

    def as_dict(self) -> dict[str, float | int]:
        steps = self.predicted_steps
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 * steps / self.predicted_ms if self.predicted_ms else 0.0,
        } | ({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n else {})


@dataclass(frozen=True)
class PromptProgress:
    """llama-server's `prompt_progress`: how much of the prompt is processed."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "total": self.total,
            "cache": self.cache,
            "processed": self.processed,
            "time_ms": self.time_ms,
        }


@dataclass(frozen=True)
class TokenEvent:
    """One generated token (token is None on a final event that carries no new token)."""

    text: str  # text now safe to emit (UTF-8 complete, not part of a possible stop string); may be ""
    reasoning_text: str = ""  # the same, for text inside a reasoning block (`text` is then the answer)
    token: int | None = None
    logprob: float | None = None  # of the raw logits (n_probs), with the best n_probs tokens
    top_logprobs: tuple[tuple[int, float], ...] = ()
    prob: float | None = None  # with post_sampling_probs instead: after the sampler chain
    top_probs: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    stop_word: str | None = None
    timings: Timings | None = None
    n_prompt: int = 0
    n_generated: int = 0
    id_slot: int = -1
    error: str | None = None
    progress: PromptProgress | None = None  # set on prompt-progress events (no token, no text)
    truncated: bool = False  # on the final event: the context was shifted or the prompt cut
    n_cells: int = 0  # on the final event: tokens the slot's cells hold (llama-server's tokens_cached)
    tool_calls: tuple[ToolCallDelta, ...] = ()  # tool-call steps this event completes (see ToolCallDelta)
    embedding: np.ndarray | None = None  # an EmbeddingRequest's answer (float32), on its final event


@dataclass(frozen=True)
class ControlResult:
    """The outcome of a control action on a running request."""

    success: bool
    message: str = ""

    def as_dict(self) -> dict[str, bool | str]:
        return {"success": True} if self.success else {"success": False, "message": self.message}


@dataclass(frozen=True)
class SlotProgress:
    """Where a slot's request is (llama-server's slot stats): prompt tokens run and reused, tokens
    generated and the limit left. An idle slot's is the reset one llama-server reports."""

    n_prompt_processed: int = 0  # prompt tokens evaluated so far (not those reused from the cells)
    n_prompt_cached: int = 0  # prompt tokens whose cells were reused
    n_decoded: int = 0  # tokens generated
    n_remain: int = -1  # tokens n_predict still allows; -1: no limit (or idle)
    has_next_token: bool = False  # the request goes on
    has_new_line: bool = False  # its text has had a newline


@dataclass(frozen=True)
class SlotSnapshot:
    """One slot as the engine thread last saw it: llama-server's /slots facts. `has_task`: the slot
    runs a request or ran one (llama-server then reports that task's id, params and progress)."""

    id: int
    id_task: int
    n_ctx: int
    is_processing: bool
    n_cached: int  # tokens whose cells the slot holds (llama-server's n_prompt_tokens)
    speculative: bool = False  # its request drafts speculative tokens
    has_task: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)  # the request's `slot_params`
    progress: SlotProgress = SlotProgress()
    # The request's prompt tokens and generated text pieces: live references (the engine thread appends
    # to `text`), no copies per step; /slots reads them only under LLAMA_SERVER_SLOTS_DEBUG.
    prompt: Sequence[int] = ()
    text: Sequence[str] = ()


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state, published by its thread after every step and command batch."""

    slots: tuple[SlotSnapshot, ...] = ()
    n_waiting: int = 0  # requests not yet in a slot
    n_steps: int = 0  # forward passes run (llama-server's n_decode_total)
    n_tokens_processed: int = 0
    n_busy_slot_steps: int = 0  # the busy slots of every forward pass, summed (n_busy_slots_per_decode)

    @property
    def n_busy(self) -> int:
        return sum(s.is_processing for s in self.slots)


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model that routes report (/v1/models meta, /props)."""

    path: Path
    name: str
    arch: str
    vocab_type: int  # llama.cpp's: 1 SentencePiece, 2 byte-level BPE
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_params: int
    size: int  # bytes of the weights
    backend: str
    chat_template: str  # the GGUF's own template, "" when it has none
    n_cls_out: int = 0  # scores of the rerank classifier head (cls.output), 0 when the GGUF has none
    ftype: str = ""  # the file type as llama.cpp names it ("Q4_1", "Q4_K - Medium"; engine/ftype.py)
    bos_token: str = ""  # the BOS and EOS tokens' text ("" when the vocabulary has none)
    eos_token: str = ""
    generates: bool = True  # False for an encoder (BERT and kin): embeddings and rerank only
