"""PromptBuilder: a request's prompt in its model's tokens, with no engine state.

It holds what a load leaves immutable: the tokenizer, the chat template and its tool-call format, the
vocabulary's special tokens, the GGUF's rerank template and the slot's context size. Chats are rendered
(their tools as the format wants them), prompts tokenized as llama-server does and fitted to the
context, /infill's and rerank's layouts built, and a chat's reasoning treatment resolved against its
rendered prompt. Long texts are tokenized on a worker thread; nothing here reaches the engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from engine.api import ReasoningSpec, ReasoningTags, ToolCallSpec
from engine.context_shift import truncate_prompt
from engine.text.chat import ChatTemplate, ChatTemplateError
from engine.text.fim import ExtraChunk, InfillLimits, infill_tokens
from engine.text.reasoning import resolve_spec
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import ToolCallFormat
from server.config.settings import Settings
from server.http import errors
from server.model.constraints import ToolPlan, plan_tools


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
    continue_final_message: bool | None = False
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
        """Text to token ids on a worker thread (a long text must not block the event loop)."""
        return await anyio.to_thread.run_sync(self.tokenizer.encode, text, add_special, parse_special)

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

    def fit_prompt(self, tokens: list[int]) -> Prompt:
        """The prompt as it will run: too long is 400, or cut with context shift."""
        n_ctx = self.n_ctx_slot
        if not tokens:
            raise errors.invalid_request("the prompt is empty")
        if len(tokens) < n_ctx:
            return Prompt(tokens)
        if not self.settings.context_shift:
            raise errors.exceed_context(len(tokens), n_ctx)
        return Prompt(truncate_prompt(tokens, n_ctx, self.settings.keep), truncated=True)

    def render_chat(self, chat: ChatInput) -> str:
        """The chat as the model's prompt; with tools, as their format wants them (its message changes,
        template variables and prompt fixes, llama.cpp's)."""
        kwargs = self.settings.chat_template_kwargs | chat.template_kwargs
        messages, tools, fmt = chat.messages, chat.tools, chat.tool_format
        if tools and fmt is not None:
            messages = fmt.prepare_messages(messages, tools)
            kwargs = fmt.template_context(tools) | kwargs
        elif (plain := self.plain_format()) is not None:  # GPT-OSS: past reasoning, tools or not
            messages = plain.prepare_messages(messages, ())
        try:
            text = self.template.render(
                messages,
                add_generation_prompt=chat.add_generation_prompt,
                tools=tools,
                with_starts=False,
                continue_final_message=chat.continue_final_message,
                **kwargs,
            ).text
        except (ChatTemplateError, ValueError) as exc:
            raise errors.invalid_request(str(exc)) from exc
        if tools and fmt is not None:
            thinking = bool(kwargs.get("enable_thinking", True))
            text = fmt.finish_prompt(self.template.source, text, chat.add_generation_prompt, thinking)
        return text

    async def chat(self, chat: ChatInput, fit: bool = True) -> Prompt:
        """A chat's prompt in one pass: rendered, tokenized, fitted to the context (`fit` False: as token
        counting answers, before any fitting), and its reasoning resolved against the rendered text."""
        text = self.render_chat(chat)
        tokens = await self.tokenize_prompt(text)
        prompt = self.fit_prompt(tokens) if fit else Prompt(tokens)
        fmt = chat.tool_format or self.plain_format()
        own_tags = fmt.reasoning_tags if fmt is not None else None
        return replace(prompt, text=text, reasoning=self.reasoning_spec(chat.reasoning, text, own_tags))

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

    def plain_format(self) -> ToolCallFormat | None:
        """The template's format when a chat without tools is read in it too (GPT-OSS's harmony)."""
        return self.tool_format if self.tool_format.parsed_without_tools else None

    def plain_parsing(self, streamed: bool, reasoning_format: str | None) -> ToolCallSpec | None:
        """How a chat without tools (or with tool_choice none) is read back: as llama-server reads a
        GPT-OSS answer whatever the request (reasoning from its analysis channel, content from its final
        one; common/parsers/gpt-oss.cpp); None (the text is content) for other formats, and under
        reasoning_format none, where llama-server keeps the analysis in the content."""
        fmt = self.plain_format()
        if fmt is None or (reasoning_format or self.settings.reasoning_format) == "none":
            return None
        return ToolCallSpec(fmt.name, (), stream_arguments=streamed)

    def tool_plan(
        self,
        tools: list[dict[str, Any]],
        choice: Any,
        parallel: bool | None,
        streamed: bool,
        answer_only: bool,
    ) -> ToolPlan | None:
        """A chat's tools in this model's format (server/model/constraints.py); `parallel` None: whether
        the template renders parallel calls, llama-server's default."""
        fmt, special = self.tool_format, self.special_tokens
        if parallel is None:
            parallel = self.template.caps.supports_parallel_tool_calls
        return plan_tools(fmt, special, tools, choice, parallel, streamed, answer_only)

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
        BOS query EOS document EOS (each special token where the vocabulary adds it)."""
        tok = self.tokenizer
        if self.rerank_template is not None:
            text = self.rerank_template.replace("{query}", query).replace("{document}", document)
            return tok.encode(text, False, True)
        bos = [tok.bos_id] if tok.add_bos else []
        eos = [tok.eos_id] if tok.add_eos else []
        return [*bos, *tok.encode(query, False, False), *eos, *tok.encode(document, False, False), *eos]
