"""The model behind the HTTP routes: loading, prompts, limits, counters. Routes stay thin on top of it."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from engine.context_shift import truncate_prompt
from engine.engine import Engine, EngineConfig, RequestHandle
from engine.llm import LLM
from engine.request import GenerationRequest, TokenEvent
from engine.sampling import SamplingParams
from engine.text.chat import ChatTemplate, ChatTemplateError
from server import errors
from server.cli import Settings

log = structlog.get_logger("server")


@dataclass
class Counters:
    """What /metrics reports (llama-server's llamacpp:* families)."""

    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    prompt_tokens_cached_total: int = 0
    requests_total: int = 0
    started: float = field(default_factory=time.time)

    def record(self, event: TokenEvent) -> None:
        t = event.timings
        if t is None:
            return
        self.prompt_tokens_total += t.prompt_n
        self.prompt_seconds_total += t.prompt_ms / 1e3
        self.tokens_predicted_total += t.predicted_n
        self.tokens_predicted_seconds_total += t.predicted_ms / 1e3
        self.prompt_tokens_cached_total += t.cache_n


class ModelService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.llm: LLM | None = None
        self.engine: Engine | None = None
        self.template: ChatTemplate | None = None
        self.load_error: str | None = None
        self.counters = Counters()
        self.fingerprint = "b0-llamba"
        self._loaded = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the model on a worker thread; /health answers 503 until this finishes."""
        try:
            await anyio.to_thread.run_sync(self._load_blocking)
        except Exception as exc:
            self.load_error = str(exc)
            log.error("model.load_failed", error=str(exc))
            raise

    def _load_blocking(self) -> None:
        s = self.settings
        llm = LLM.load(s.model, device=s.device, n_threads=s.threads)
        template = ChatTemplate.from_gguf_metadata(llm.gguf.metadata, s.chat_template)
        engine = Engine(
            llm,
            EngineConfig(
                n_slots=s.parallel,
                n_ctx=s.ctx_size,
                n_ubatch=min(s.ubatch_size, s.batch_size),
                slot_similarity=s.slot_similarity,
                cache_ram_mib=s.cache_ram,
                context_shift=s.context_shift,
                n_keep=s.keep,
            ),
        )
        engine.start()
        self.llm, self.template, self.engine = llm, template, engine
        log.info("model.loaded", path=str(llm.path), seconds=round(llm.load_seconds, 2), slots=s.parallel)

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def require_ready(self) -> tuple[LLM, Engine]:
        if self.llm is None or self.engine is None:
            raise errors.unavailable()
        return self.llm, self.engine

    # -- prompts ------------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict] | None, **kwargs: Any) -> str:
        if self.template is None:
            raise errors.unavailable()
        try:
            return self.template.render(
                messages, add_generation_prompt=True, tools=tools, with_starts=False, **kwargs
            ).text
        except (ChatTemplateError, ValueError) as exc:
            raise errors.invalid_request(str(exc)) from exc

    async def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """A prompt as llama-server tokenizes it: special tokens parsed, BOS per the model's rule."""
        llm, _ = self.require_ready()
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < llm.tokenizer.n_vocab]
            if bad:
                raise errors.invalid_request(f"token id {bad[0]} is outside the vocabulary")
            return list(prompt)
        tokens = await anyio.to_thread.run_sync(llm.tokenizer.encode, prompt, False, True)
        tok = llm.tokenizer
        if tok.add_bos and (not tokens or tokens[0] != tok.bos_id):
            tokens = [tok.bos_id, *tokens]
        return tokens

    def fit_prompt(self, tokens: list[int]) -> tuple[list[int], bool]:
        """The prompt as it will run, and whether it was cut: too long is 400, or cut with context shift."""
        _, engine = self.require_ready()
        if not tokens:
            raise errors.invalid_request("the prompt is empty")
        if len(tokens) < engine.n_ctx_slot:
            return tokens, False
        if not self.settings.context_shift:
            raise errors.exceed_context(len(tokens), engine.n_ctx_slot)
        return truncate_prompt(tokens, engine.n_ctx_slot, self.settings.keep), True

    def default_sampling(self) -> SamplingParams:
        s = self.settings
        return SamplingParams(
            temperature=s.temp,
            top_k=s.top_k,
            top_p=s.top_p,
            min_p=s.min_p,
            repeat_penalty=s.repeat_penalty,
            repeat_last_n=s.repeat_last_n,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            seed=s.seed,
        )

    def log_prompt(self, request_id: str, text: str) -> None:
        folder = self.settings.log_prompts_dir
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{int(time.time() * 1000)}-{request_id}.txt").write_text(text, encoding="utf-8")

    # -- generation ---------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        _, engine = self.require_ready()
        self.counters.requests_total += 1
        return engine.submit(request, asyncio.get_running_loop())

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:24]}"
