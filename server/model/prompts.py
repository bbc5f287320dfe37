"""PromptBuilder: a request's prompt in its model's tokens, with no engine state.

It holds what a load leaves immutable: the tokenizer, the chat template and its tool-call format, the
vocabulary's special tokens, the GGUF's rerank template and the slot's context size. Chats are rendered
(their tools as the format wants them), prompts tokenized as llama-server does and fitted to the
context, /infill's and rerank's layouts built, and a chat's reasoning treatment resolved against its
rendered prompt. Long texts are tokenized on a worker thread; nothing here reaches the engine thread.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from engine.api import GenerationRequest, ReasoningSpec, ReasoningTags, ToolCallSpec
from engine.media.chunks import MediaChunk
from engine.memory.context_shift import truncate_prompt
from engine.text.answer import prefill_message as read_prefill
from engine.text.chat import ChatTemplate, ChatTemplateError, RenderedPrompt
from engine.text.fim import ExtraChunk, InfillLimits, infill_tokens
from engine.text.reasoning import detect_tags, resolve_spec
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import GENERIC, Prefill, ToolCallFormat
from server.config.settings import Settings
from server.http import errors
from server.model.constraints import ToolPlan, plan_tools, preserved_ids
from server.model.media import MediaPrompt, media_tokens

Media = Mapping[int, MediaChunk]  # a prompt's media chunks by the marker id their positions hold


# Texts up to this long tokenize on the event loop (PromptBuilder.tokenize): the hop to a worker thread and
# back cost 150-330 us against 9-23 us for a 44-character sentence (SmolLM2's BPE, MiniLM's WordPiece;
# 2026-12-08, EPYC znver3); 1 KB takes 134-389 us on the loop.
INLINE_TOKENIZE_CHARS = 256


@dataclass(frozen=True)
class ReasoningAsk:
    """What a chat request asks of reasoning: its format (None: --reasoning-format), its budget of
    tokens and the message forced when it runs out, and whether the block may be ended by control."""

    format: str | None = None
    budget: int = -1
    message: str = ""
    controllable: bool = False


@dataclass(frozen=True)
class ChatInput:
    """A chat as the prompt builder takes it (server/chat/job.py builds it from a request body)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_format: ToolCallFormat | None = None  # the tools' format: their messages, variables and fixes
    continue_final_message: bool | str | None = False
    add_generation_prompt: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # over --chat-template-kwargs
    reasoning: ReasoningAsk = ReasoningAsk()


@dataclass(frozen=True)
class Prompt:
    """A prompt as it will run: its tokens (fitted to the context), whether they were cut, and for a
    chat its text and how its reasoning block is treated."""

    tokens: list[int]
    truncated: bool = False
    text: str = ""
    reasoning: ReasoningSpec | None = None
    prefill: str = ""  # the continued assistant message's text at the end of `text` (engine.api)
    media: Media = field(default_factory=dict)  # its media chunks by marker id


def prefill_message(request: GenerationRequest) -> tuple[str, str]:
    """(content, reasoning) of the assistant message a chat answer continues, as the answer's own
    reading reads it (empty without a prefill): llama-server reports the message joined with the
    continuation."""
    delta = read_prefill(request)
    return delta.content, delta.reasoning


def template_caps(template: ChatTemplate) -> dict[str, bool]:
    """The chat template's capabilities under llama.cpp's names, sorted as it writes them (/props
    `chat_template_caps`): the system role, tools, calls, parallel calls and object arguments as
    Llamba's probes found them (minja's way: what a render shows, where llama.cpp's own engine
    watches what the template reads); content parts go to a template that reads them as they came,
    else as text; reasoning effort is what the template names; no template here keeps every turn's
    reasoning."""
    caps = template.caps
    return {
        "supports_object_arguments": caps.requires_object_arguments,
        "supports_parallel_tool_calls": caps.supports_parallel_tool_calls,
        "supports_preserve_reasoning": False,
        "supports_reasoning_effort": "reasoning_effort" in template.source,
        "supports_string_content": True,
        "supports_system_role": caps.supports_system_role,
        "supports_tool_calls": caps.supports_tool_calls,
        "supports_tools": caps.supports_tools,
        "supports_typed_content": caps.supports_typed_content,
    }


def _as_llama_server_gives(message: dict[str, Any]) -> dict[str, Any]:
    """A message as llama-server 0c1e570 hands it to a template (common/chat.cpp's common_chat_msg
    to_json_oaicompat): null content is "" (ChatTemplate's normalising does that), each earlier call is
    its type, its function's name and arguments, and its id, the arguments as JSON text (an object
    sent by the client is dumped compactly, as nlohmann's dump())."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [_call_as_given(call) for call in calls]}


def _call_as_given(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call  # ChatTemplate's normalising reports what is wrong with it
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    given: dict[str, Any] = {
        "type": "function",
        "function": {"name": function.get("name"), "arguments": arguments},
    }
    if call.get("id"):
        given["id"] = call["id"]
    return given


def _history_as_given(template: ChatTemplate) -> ChatTemplate:
    """The template with the conversation's tool calls and tool results rendered as they come, for a
    template without tool support whose chat leaves the tools out (tool_choice auto or none): as
    llama-server 0c1e570, which has no polyfills, hands them to such a template (SmolLM2's shows an
    empty assistant turn and a `tool` turn with the result). Where Llamba describes the tools itself
    (llama.cpp's generic JSON format: `required`, a named function, the tool loop's rounds) the
    template's own view polyfills them, so the model sees earlier calls as the JSON it is asked to
    write (engine/text/template_caps.py). Only the tool-history polyfills are off: object arguments
    and a system turn merged into the next are as the template's probe found. A shallow copy: the
    compiled template is shared."""
    view = copy.copy(template)
    caps = replace(template.caps, supports_tool_calls=True, supports_tool_responses=True)
    view.__dict__["caps"] = caps  # over the template's cached probe (a cached_property)
    return view


def _continuation(fmt: ToolCallFormat, source: str) -> Callable[[str, str, Prefill], tuple[str, str]]:
    """How a prefilled assistant message continues, in the format's words (its reasoning tags, else the
    template `source`'s)."""
    tags = fmt.reasoning_tags or detect_tags(source)
    return lambda prompt, generation_prompt, prefill: fmt.continue_prompt(
        prompt, generation_prompt, prefill, tags
    )


def _continued(chat: ChatInput) -> bool | str | None:
    """The chat's continue_final_message, decided on the chat as sent: a format may fold its last turns
    into an assistant message (Gemma 4's older template) that is no prefill."""
    last = chat.messages[-1] if chat.messages else None
    if chat.continue_final_message is None and last is not None and last.get("role") != "assistant":
        return False
    return chat.continue_final_message


def _finished(
    fmt: ToolCallFormat, source: str, rendered: RenderedPrompt, add_generation_prompt: bool, kwargs: dict
) -> RenderedPrompt:
    """The prompt with the format's fixes (llama.cpp's): known template bugs, thinking switched off, a
    closed turn reopened."""
    thinking = bool(kwargs.get("enable_thinking", True))
    return replace(rendered, text=fmt.finish_prompt(source, rendered.text, add_generation_prompt, thinking))


@dataclass(frozen=True, eq=False)
class PromptBuilder:
    """One loaded model's prompts: made of what the load left immutable, so any task may use it."""

    settings: Settings
    tokenizer: Tokenizer
    template: ChatTemplate
    tool_format: ToolCallFormat  # how the template's model writes tool calls
    special_tokens: dict[str, int]  # the vocabulary's special tokens by text (a grammar names them)
    rerank_template: str | None  # the GGUF's tokenizer.chat_template.rerank
    n_ctx_slot: int
    n_vocab: int

    # -- tokens -----------------------------------------------------------------------------------------
    async def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """Text to token ids; a long text on a worker thread (it must not block the event loop)."""
        encode = functools.partial(self.tokenizer.encode, text, add_special, parse_special)
        return encode() if len(text) <= INLINE_TOKENIZE_CHARS else await anyio.to_thread.run_sync(encode)

    def encode_plain(self, text: str) -> list[int]:
        """A short text's tokens as llama-server tokenizes a logit_bias string (no special tokens), here
        on the loop: such texts are a few words."""
        return self.tokenizer.encode(text, False, False)

    def check_tokens(self, tokens: list[int]) -> list[int]:
        """400 for a token id outside the vocabulary."""
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise errors.invalid_request(f"token id {bad[0]} is outside the vocabulary")
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(self.check_tokens(tokens))

    def piece(self, token: int) -> bytes:
        """The bytes token `token` stands for (special tokens rendered)."""
        return self.tokenizer.token_to_piece(token)

    # -- prompts ----------------------------------------------------------------------------------------
    async def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """A prompt as llama-server tokenizes it: special tokens parsed, BOS per the model's rule."""
        if isinstance(prompt, list):
            return list(self.check_tokens(prompt))
        tokens = await self.tokenize(prompt, False, True)
        tok = self.tokenizer
        if tok.add_bos and (not tokens or tokens[0] != tok.bos_id):
            tokens = [tok.bos_id, *tokens]
        return tokens

    def fit_prompt(self, tokens: list[int], n_keep: int | None = None, media: Media | None = None) -> Prompt:
        """The prompt as it will run: too long is 400, or cut with context shift, keeping the request's
        first `n_keep` tokens (None: the server's --keep). A prompt with `media` is never cut (the
        server turns context shift off with --mmproj, as llama-server)."""
        n_ctx = self.n_ctx_slot
        if not tokens:
            raise errors.invalid_request("the prompt is empty")
        if len(tokens) < n_ctx:
            return Prompt(tokens, media=media or {})
        if not self.settings.context_shift or media:
            raise errors.exceed_context(len(tokens), n_ctx)
        keep = self.settings.keep if n_keep is None else n_keep
        return Prompt(truncate_prompt(tokens, n_ctx, keep), truncated=True)

    def render_chat(self, chat: ChatInput) -> str:
        """The chat as the model's prompt; with tools, as their format wants them (its message changes,
        template variables and prompt fixes, llama.cpp's)."""
        return self.render(chat).text

    def render(self, chat: ChatInput) -> RenderedPrompt:
        """The chat rendered, with a continued assistant message (a prefill) written as the template's
        format writes one (its thinking tags, GPT-OSS channels)."""
        kwargs = self.settings.chat_template_kwargs | chat.template_kwargs
        messages, tools, fmt = chat.messages, chat.tools, chat.tool_format
        template, finishing = self.template, fmt if tools else None
        if tools and fmt is not None:
            messages = fmt.prepare_messages(messages, tools)
            kwargs = fmt.template_context(tools) | kwargs
        elif not self.describes_tools:  # tools left out: the history as llama-server gives it
            messages, template = [_as_llama_server_gives(m) for m in messages], _history_as_given(template)
        elif self.tool_format.prepares_messages_without_tools:  # GPT-OSS, Gemma 4: tools or not
            messages, finishing = self.tool_format.prepare_messages(messages, ()), self.tool_format
        try:
            rendered = template.render(
                messages,
                add_generation_prompt=chat.add_generation_prompt,
                tools=tools,
                with_starts=False,
                continue_final_message=_continued(chat),
                continuation=_continuation(fmt or self.tool_format, self.template.source),
                **kwargs,
            )
        except (ChatTemplateError, ValueError) as exc:
            raise errors.invalid_request(str(exc)) from exc
        if finishing is not None and not rendered.prefill_text:
            rendered = _finished(
                finishing, self.template.source, rendered, chat.add_generation_prompt, kwargs
            )
        return rendered

    async def chat(
        self, chat: ChatInput, fit: bool = True, n_keep: int | None = None, media: MediaPrompt | None = None
    ) -> Prompt:
        """A chat's prompt in one pass: rendered, tokenized, fitted to the context (`fit` False: as token
        counting answers, before any fitting; `n_keep`: the request's, for a prompt cut to fit), and its
        reasoning resolved against the rendered text (with a prefill, the text before it: the answer's
        reading starts with the prefill's). `media`: its media, tokenized as mtmd does."""
        rendered = self.render(chat)
        text = rendered.text
        tokenized = media_tokens(self.tokenize, self.tokenizer, text, media) if media else None
        tokens = await (tokenized or self.tokenize_prompt(text))
        chunks = {c.marker: c for c in media.chunks} if media else {}
        prompt = self.fit_prompt(tokens, n_keep, chunks) if fit else Prompt(tokens, media=chunks)
        own_tags = (chat.tool_format or self.tool_format).reasoning_tags
        before = text[: len(text) - len(rendered.prefill_text)]
        reasoning = self.reasoning_spec(chat.reasoning, before, own_tags)
        return replace(prompt, text=text, reasoning=reasoning, prefill=rendered.prefill_text)

    def reasoning_spec(
        self, ask: ReasoningAsk, prompt_text: str, own_tags: ReasoningTags | None = None
    ) -> ReasoningSpec | None:
        """How a chat treats reasoning: the request's choices over the server's defaults; `own_tags` (a
        tool-call format's own) over the template's."""
        s = self.settings
        budget = 0 if s.reasoning == "off" else ask.budget  # off: a block the template opens is closed
        fmt = ask.format or s.reasoning_format
        source = self.template.source
        return resolve_spec(fmt, source, prompt_text, budget, ask.message, ask.controllable, own_tags)

    def tool_plan(
        self,
        tools: list[dict[str, Any]],
        choice: Any,
        parallel: bool | None,
        streamed: bool,
        answer_only: bool,
        keep_tools: bool = False,
    ) -> ToolPlan | None:
        """A chat's tools in this model's format (server/model/constraints.py); `parallel` None: whether
        the template renders parallel calls, llama-server's default; `keep_tools`: a tool loop's later
        round, whose tools stay described as its first round offered them."""
        fmt, special = self.tool_format, self.special_tokens
        if parallel is None:
            parallel = self.template.caps.supports_parallel_tool_calls
        describes = self.describes_tools or keep_tools
        return plan_tools(fmt, special, tools, choice, parallel, streamed, answer_only, describes)

    @property
    def describes_tools(self) -> bool:
        """Whether the template has tool support: a tool-call format of its own, or a generic-format
        template that renders a `tools` list (minja's probe). Without it, tools under tool_choice auto
        are left out, as llama-server leaves them (server/model/constraints.py's plan_tools)."""
        return self.tool_format is not GENERIC or self.template.caps.supports_tools

    def answer_reading(self, tools: ToolPlan | None, schema: bool, streamed: bool) -> ToolCallSpec:
        """How a chat answer is read: its tools' parsing, or without tools (or with tool_choice none)
        the template format's other markup only, as llama-server runs its format's parser on every chat
        answer (GPT-OSS channels, Functionary's header); `schema`: the answer has a JSON schema, and a
        ```json fence around it is taken off."""
        if tools is not None:
            return tools.parsing
        fmt = self.tool_format
        preserved = preserved_ids(fmt, self.special_tokens) if fmt.markup_without_calls else ()
        return ToolCallSpec(fmt.name, (), streamed, calls=False, fenced_json=schema, preserved=preserved)

    async def infill_prompt(
        self, prefix: str | list[int], suffix: str | list[int], extra: list[tuple[str, str]], prompt: str
    ) -> list[int]:
        """llama-server's /infill prompt from the model's FIM tokens (501 when it has none): the extra
        chunks are (filename, text); prefix and suffix are text or token ids."""
        tok = self.tokenizer
        missing = tok.fim.missing()
        if missing:
            reasons = " ".join(f"{role} token is missing." for role in missing)
            raise errors.not_supported(f"Infill is not supported by this model: {reasons}")

        def build() -> list[int]:
            def part(value: str | list[int]) -> list[int]:
                return self.encode_plain(value) if isinstance(value, str) else self.check_tokens(list(value))

            s = self.settings
            limits = InfillLimits(s.batch_size, s.n_predict, self.n_ctx_slot)
            chunks = [ExtraChunk(text, filename) for filename, text in extra]
            prompt_ids = tok.encode(prompt, False, True)
            bos = tok.bos_id if tok.add_bos else None
            return infill_tokens(
                tok.fim, self.encode_plain, part(prefix), part(suffix), chunks, prompt_ids, limits, bos
            )

        return await anyio.to_thread.run_sync(build)

    async def rerank_tokens(self, query: str, document: str) -> list[int]:
        """The rerank prompt's tokens, on a worker thread (documents may be long)."""
        return await anyio.to_thread.run_sync(self._rerank_tokens, query, document)

    def _rerank_tokens(self, query: str, document: str) -> list[int]:
        """llama-server's rerank prompt: the GGUF's `rerank` template with {query} and {document}, else
        `rerank_layout`."""
        if self.rerank_template is not None:
            text = self.rerank_template.replace("{query}", query).replace("{document}", document)
            return self.tokenizer.encode(text, False, True)
        return rerank_layout(self.tokenizer, query, document)


def rerank_layout(tok: Tokenizer, query: str, document: str) -> list[int]:
    """llama-server's format_prompt_rerank without a template: BOS query EOS SEP document EOS, each
    special token where the vocabulary adds it, SEP standing in for a vocabulary without EOS (WordPiece)."""
    eos_id = tok.eos_id if tok.eos_id >= 0 else tok.sep_id
    eos = [eos_id] if tok.add_eos and eos_id is not None else []
    sep = [tok.sep_id] if tok.add_sep and tok.sep_id is not None else []
    bos = [tok.bos_id] if tok.add_bos else []
    return [*bos, *tok.encode(query, False, False), *eos, *sep, *tok.encode(document, False, False), *eos]
