"""ModelService: the one seam between the HTTP routes and the engine.

Routes reach the model only through this object: loading state, model facts (`model_info()`), the
tokenizer and chat template, engine requests (`submit`), control and slot actions, and the engine's
state as the snapshot its thread publishes. Nothing here reads engine state across threads: the
tokenizer and template are immutable once loaded, and everything else goes through the engine's
thread-safe surface. Routes import no `engine.*` module but the public types of `engine.api`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import structlog

from engine.api import (
    POOLING_TYPES,
    ControlResult,
    EmbeddingRequest,
    EngineSnapshot,
    GenerationRequest,
    ModelInfo,
    Pooling,
    TokenEvent,
)
from engine.context_shift import truncate_prompt
from engine.engine import Engine, EngineConfig, EngineStopped
from engine.grammar import CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec
from engine.handle import RequestHandle
from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.slot_files import SLOT_ACTIONS, SlotBusyError, SlotFileError, slot_path
from engine.speculative.draft import check_vocabulary
from engine.text.chat import ChatTemplate, ChatTemplateError
from engine.text.fim import ExtraChunk, InfillLimits, infill_tokens
from engine.text.reasoning import ReasoningSpec, ReasoningTags, detect_tags, resolve_spec
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import ToolCallFormat, detect_format
from server.config.settings import Settings
from server.http import errors
from server.model.admission import Admission
from server.state import app_state

log = structlog.get_logger("server")

# The engine answers calls between two steps; this only bounds the wait if it is stopping and never will.
CALL_TIMEOUT = 60.0
DRAIN_POLL_S = 0.05  # how often a SIGTERM drain looks whether the live requests have ended


def service() -> ModelService:
    """The app's ModelService (from inside a request or app context)."""
    return app_state().model


@dataclass
class Counters:
    """What /metrics reports (llama-server's llamacpp:* families)."""

    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    prompt_tokens_cached_total: int = 0
    drafted_total: int = 0  # speculative tokens verified
    drafted_accepted_total: int = 0
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
        self.drafted_total += t.draft_n
        self.drafted_accepted_total += t.draft_n_accepted


@dataclass(frozen=True)
class Loaded:
    """What exists once the model is loaded: all of it or none of it."""

    llm: LLM
    engine: Engine
    template: ChatTemplate
    info: ModelInfo
    grammars: GrammarCompiler
    tool_format: ToolCallFormat  # how the template's model writes tool calls
    pooling: Pooling  # what embedding requests pool (engine/embedding.py)
    # --grammar/--grammar-file or -j/-jf, compiled once at load: the constraint of requests without one.
    default_grammar: CompiledGrammar | None = None


# Where each load stage starts in the whole load's progress (router mode reports it on /models/sse); the
# repack stage advances layer by layer.
LOAD_STAGES = {"read": (0.02, 0.03), "repack": (0.05, 0.65), "compile": (0.72, 0.0), "grammar": (0.9, 0.0)}


def _log_progress(stage: str, fraction: float) -> None:
    """A load stage as a log event (a router reads its children's JSON logs)."""
    start, span = LOAD_STAGES[stage]
    log.info("model.load_progress", stage=stage, value=round(start + span * fraction, 3))


def _info_dict(info: ModelInfo) -> dict[str, Any]:
    fields = ("name", "arch", "n_vocab", "n_ctx_train", "n_embd", "n_params", "size")
    return {"path": str(info.path), **{name: getattr(info, name) for name in fields}}


@dataclass(frozen=True)
class Facts:
    """What the routes report about the model, kept while it sleeps."""

    info: ModelInfo
    n_slots: int
    n_ctx_slot: int
    template_source: str
    snapshot: EngineSnapshot = EngineSnapshot()


def _release(loaded: Loaded) -> None:
    loaded.engine.stop()


def _return_memory() -> None:
    """Collect the freed model's arrays and hand the heap's free pages back to the system: glibc keeps
    them otherwise (engine/__init__.py raises its trim threshold to 1 GB for the forward passes)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class ModelService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.fingerprint = "b0-llamba"
        self.load_error: str | None = None
        self._loaded: Loaded | None = None
        # Kept while the model sleeps (--sleep-idle-seconds): what /props, /models and /slots report.
        self._facts: Facts | None = None
        self.sleeping = False
        self._waking: asyncio.Task[None] | None = None
        self.admission = Admission(settings.max_queue)  # --max-queue
        self.draining = False  # SIGTERM with --shutdown-timeout: in-flight requests finish, new ones 503

    # -- lifecycle ----------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the model on a worker thread; /health answers 503 until this finishes."""
        try:
            self._loaded = loaded = await anyio.to_thread.run_sync(self._load_blocking)
            self._facts = Facts(
                loaded.info, loaded.engine.config.n_slots, loaded.engine.n_ctx_slot, loaded.template.source
            )
        except Exception as exc:
            self.load_error = str(exc)
            log.error("model.load_failed", error=str(exc))
            raise
        info = self._loaded.info
        log.info("model.loaded", path=str(info.path), slots=self.settings.parallel, info=_info_dict(info))

    def _load_blocking(self) -> Loaded:
        s = self.settings
        llm = LLM.load(s.model, device=s.device, n_threads=s.threads, mlock=s.mlock, progress=_log_progress)
        template = ChatTemplate.from_gguf_metadata(llm.gguf.metadata, s.chat_template)
        config = EngineConfig(
            n_slots=s.parallel,
            n_ctx=s.ctx_size,
            n_ubatch=min(s.ubatch_size, s.batch_size),
            slot_similarity=s.slot_similarity,
            cache_ram_mib=s.cache_ram,
            context_shift=s.context_shift,
            n_keep=s.keep,
            cache_type_k=s.cache_type_k,
            cache_type_v=s.cache_type_v,
            fail_forward=_injected_failures(),
            n_threads=s.threads or 0,
            adaptive_threads=s.adaptive_threads,
        )
        draft = None
        if s.model_draft:  # draft-simple speculation: refused at start-up if it speaks another vocabulary
            draft = LLM.load(s.model_draft, device=s.device, n_threads=s.threads)
            check_vocabulary(draft, llm)
        pooling = self._pooling_of(llm)
        if s.embedding and pooling == "rank" and llm.model.rank_head is None:
            raise ValueError("pooling rank needs a reranker: the model has no classifier head (cls.output)")
        engine = Engine(llm, config, draft)
        _log_progress(
            "compile", 0.0
        )  # the engine's start compiles (or loads) every kernel in a warm-up batch
        engine.start()
        _log_progress("grammar", 0.0)
        # The grammar engine's view of the vocabulary holds the GIL for 0.1 s (SmolLM2) to 1.6 s (Gemma
        # 3): built here, at load, never while requests are served.
        grammars = GrammarCompiler.for_tokenizer(llm.tokenizer)
        default = self._default_grammar(grammars)
        fmt = detect_format(template.source)
        return Loaded(llm, engine, template, llm.info(), grammars, fmt, pooling, default)

    def _default_grammar(self, grammars: GrammarCompiler) -> CompiledGrammar | None:
        """The server-wide constraint, compiled for this model; a bad one fails the load, naming its flag."""
        s = self.settings
        if s.grammar is None and s.json_schema is None:
            return None
        if s.grammar is not None:
            spec, flag = GrammarSpec.gbnf(s.grammar), "--grammar"
        else:
            spec, flag = GrammarSpec.json_schema(s.json_schema), "--json-schema"
        try:
            return grammars.compile(spec)
        except GrammarError as exc:
            raise ValueError(f"{flag}: {exc}") from None

    def default_grammar(self) -> CompiledGrammar | None:
        return self._require().default_grammar

    def _pooling_of(self, llm: LLM) -> Pooling:
        """--pooling, else the GGUF's pooling_type (llama.cpp's numbering), else none: llama.cpp's rule."""
        if self.settings.pooling is not None:
            return self.settings.pooling  # type: ignore[return-value]
        stored = llm.gguf.arch_value("pooling_type")
        return POOLING_TYPES[int(stored)] if stored is not None and 0 <= int(stored) < 5 else "none"

    def stop(self) -> None:
        if self._loaded is not None:
            self._loaded.engine.stop()

    async def drain(self, timeout: float, forced: asyncio.Event) -> None:
        """Refuse new generations and wait until the live ones end, `timeout` passes or `forced` is set
        (a second SIGTERM); what is still running then is cancelled by `stop`."""
        self.draining = True
        live = self.admission.live()
        log.info("server.draining", live=live, timeout=timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        while live and not forced.is_set() and asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(forced.wait(), DRAIN_POLL_S)
            live = self.admission.live()
        log.info("server.drained", cancelled=live)

    # -- sleeping (--sleep-idle-seconds; server/model/sleep.py decides when) ------------------------------
    async def sleep(self) -> None:
        """Free the weights, KV cache and engine thread; the model's facts stay for /props and /models."""
        loaded = self._loaded
        if loaded is None or self.sleeping:
            return
        self._facts = replace(self._facts, snapshot=loaded.engine.snapshot)  # type: ignore[arg-type]
        self._loaded, self.sleeping = None, True
        await anyio.to_thread.run_sync(_release, loaded)
        del loaded
        await anyio.to_thread.run_sync(_return_memory)
        log.info("model.sleeping")

    async def wake(self) -> None:
        """Load the model again (one load however many requests wait for it)."""
        if not self.sleeping:
            return
        if self._waking is None:
            self._waking = asyncio.get_running_loop().create_task(self._wake())
        await asyncio.shield(self._waking)

    async def _wake(self) -> None:
        try:
            await self.load()
            self.sleeping = False
            log.info("model.awake")
        finally:
            self._waking = None

    @property
    def loaded(self) -> bool:
        """The weights are in memory (not loading, not sleeping)."""
        return self._loaded is not None

    @property
    def ready(self) -> bool:
        """The model is loaded, or sleeps (and wakes on the next request)."""
        return self._loaded is not None or self.sleeping

    def _require(self) -> Loaded:
        if self._loaded is None:
            raise errors.unavailable()
        return self._loaded

    def require_ready(self) -> None:
        """503 (loading) unless the model is loaded."""
        self._require()

    # -- model facts ----------------------------------------------------------------------------------
    def _known(self) -> Facts:
        """The model's facts: loaded, or sleeping (503 while the first load runs)."""
        if self._facts is None or not self.ready:
            raise errors.unavailable()
        return self._facts

    def model_info(self) -> ModelInfo:
        return self._known().info

    @property
    def n_slots(self) -> int:
        return self._known().n_slots

    @property
    def n_ctx_slot(self) -> int:
        return self._known().n_ctx_slot

    def template_source(self) -> str:
        return self._known().template_source

    def snapshot(self) -> EngineSnapshot:
        """The engine's state as its thread last published it (slots, queue, counts); while the model
        sleeps, the one it published last."""
        if self.sleeping:
            return self._known().snapshot
        return self._require().engine.snapshot

    async def cached_prompts(self) -> list[tuple[int, ...]]:
        """The token sequences the engine holds cells for (slots and host cache); none while asleep."""
        if self.sleeping or not self.loaded:
            return []
        future = self._require().engine.cached_prompts()
        return await asyncio.wait_for(asyncio.wrap_future(future), CALL_TIMEOUT)

    # -- tokens and templates -------------------------------------------------------------------------
    @property
    def _tokenizer(self) -> Tokenizer:
        return self._require().llm.tokenizer

    async def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """Text to token ids on a worker thread (a long text must not block the event loop)."""
        return await anyio.to_thread.run_sync(self._tokenizer.encode, text, add_special, parse_special)

    def encode_plain(self, text: str) -> list[int]:
        """A short text's tokens as llama-server tokenizes a logit_bias string (no special tokens), here
        on the loop: such texts are a few words."""
        return self._tokenizer.encode(text, False, False)

    def check_tokens(self, tokens: list[int]) -> list[int]:
        """400 for a token id outside the vocabulary."""
        n_vocab = self._tokenizer.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise errors.invalid_request(f"token id {bad[0]} is outside the vocabulary")
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(self.check_tokens(tokens))

    def piece(self, token: int) -> bytes:
        """The bytes token `token` stands for (special tokens rendered)."""
        return self._tokenizer.token_to_piece(token)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict] | None,
        tool_format: ToolCallFormat | None = None,
        continue_final_message: bool | None = False,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The chat as the model's prompt; with tools, as their format wants them (its message changes,
        template variables and prompt fixes, llama.cpp's). `kwargs` go over --chat-template-kwargs."""
        template = self._require().template
        kwargs = self.settings.chat_template_kwargs | kwargs
        if tools and tool_format is not None:
            messages = tool_format.prepare_messages(messages, tools)
            kwargs = tool_format.template_context(tools) | kwargs
        try:
            text = template.render(
                messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                with_starts=False,
                continue_final_message=continue_final_message,
                **kwargs,
            ).text
        except (ChatTemplateError, ValueError) as exc:
            raise errors.invalid_request(str(exc)) from exc
        if tools and tool_format is not None:
            thinking = bool(kwargs.get("enable_thinking", True))
            text = tool_format.finish_prompt(template.source, text, add_generation_prompt, thinking)
        return text

    async def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """A prompt as llama-server tokenizes it: special tokens parsed, BOS per the model's rule."""
        if isinstance(prompt, list):
            return list(self.check_tokens(prompt))
        tokens = await self.tokenize(prompt, False, True)
        tok = self._tokenizer
        if tok.add_bos and (not tokens or tokens[0] != tok.bos_id):
            tokens = [tok.bos_id, *tokens]
        return tokens

    async def infill_prompt(
        self, prefix: str | list[int], suffix: str | list[int], extra: list[tuple[str, str]], prompt: str
    ) -> list[int]:
        """llama-server's /infill prompt from the model's FIM tokens (501 when it has none): the
        extra chunks are (filename, text); prefix and suffix are text or token ids."""
        tok = self._tokenizer
        missing = tok.fim.missing()
        if missing:
            reasons = " ".join(f"{role} token is missing." for role in missing)
            raise errors.not_supported(f"Infill is not supported by this model: {reasons}")

        def build() -> list[int]:
            def encode(text: str) -> list[int]:
                return tok.encode(text, False, False)

            def part(value: str | list[int]) -> list[int]:
                return encode(value) if isinstance(value, str) else self.check_tokens(list(value))

            s = self.settings
            limits = InfillLimits(s.batch_size, s.n_predict, self.n_ctx_slot)
            chunks = [ExtraChunk(text, filename) for filename, text in extra]
            prompt_ids = tok.encode(prompt, False, True)
            bos = tok.bos_id if tok.add_bos else None
            return infill_tokens(tok.fim, encode, part(prefix), part(suffix), chunks, prompt_ids, limits, bos)

        return await anyio.to_thread.run_sync(build)

    def fit_prompt(self, tokens: list[int]) -> tuple[list[int], bool]:
        """The prompt as it will run, and whether it was cut: too long is 400, or cut with context shift."""
        n_ctx = self.n_ctx_slot
        if not tokens:
            raise errors.invalid_request("the prompt is empty")
        if len(tokens) < n_ctx:
            return tokens, False
        if not self.settings.context_shift:
            raise errors.exceed_context(len(tokens), n_ctx)
        return truncate_prompt(tokens, n_ctx, self.settings.keep), True

    # -- reasoning --------------------------------------------------------------------------------------
    def reasoning_spec(
        self,
        fmt: str | None,
        prompt_text: str,
        budget: int,
        message: str,
        controllable: bool,
        own_tags: ReasoningTags | None = None,
    ) -> ReasoningSpec | None:
        """How a chat request treats reasoning: the request's choices over the server's defaults;
        `own_tags` (a tool-call format's own) over the template's."""
        s = self.settings
        budget = 0 if s.reasoning == "off" else budget  # off: a template that opens the block gets it closed
        fmt = fmt or s.reasoning_format
        source = self.template_source()
        return resolve_spec(fmt, source, prompt_text, budget, message, controllable, own_tags)

    def reasoning_tags(self) -> ReasoningTags | None:
        """The thinking tags of the chat template, None when it has no thinking block."""
        return detect_tags(self.template_source()) if self.ready else None

    # -- structured output ------------------------------------------------------------------------------
    def tool_format(self) -> ToolCallFormat:
        return self._require().tool_format

    def special_tokens(self) -> dict[str, int]:
        """The vocabulary's special tokens by text (a grammar names them as tokens)."""
        return self._require().grammars.special_tokens

    async def compile_grammar(self, spec: GrammarSpec, field: str) -> CompiledGrammar:
        """`spec` compiled for this model (a worker thread; ~1-2 ms); 400 naming `field` if it can't be."""
        grammars = self._require().grammars
        try:
            return await anyio.to_thread.run_sync(grammars.compile, spec)
        except GrammarError as exc:
            raise errors.invalid_request(f"'{field}': {exc}") from None

    # -- generation -----------------------------------------------------------------------------------
    def default_sampling(self) -> SamplingParams:
        """The server's sampler settings (its flags): what a request's fields override."""
        return self.settings.sampling

    def check_queue(self, wanted: int = 1) -> None:
        """503 with Retry-After when the server is shutting down or the queue for slots is full
        (--max-queue): called while a request is prepared, before any byte of its reply."""
        self._refuse_while_draining()
        self.admission.check(self.n_slots, wanted)

    def _refuse_while_draining(self) -> None:
        if self.draining:
            raise errors.APIError(
                503, "the server is shutting down", "unavailable_error", headers={"Retry-After": "1"}
            )

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self._refuse_while_draining()
        engine = self._require().engine
        self.counters.requests_total += 1
        handle = engine.submit(request, asyncio.get_running_loop())
        self.admission.track(handle)
        return handle

    def submit_choices(self, requests: list[GenerationRequest]) -> list[RequestHandle]:
        """`n` choices of one prompt: evaluated once, its cells copied to the other choices' slots."""
        self._refuse_while_draining()
        engine = self._require().engine
        self.counters.requests_total += 1
        handles = engine.submit_choices(requests, asyncio.get_running_loop())
        self.admission.track(*handles)
        return handles

    async def control(self, request_id: str, action: str) -> ControlResult:
        engine = self._require().engine
        try:
            return await asyncio.wait_for(asyncio.wrap_future(engine.control(request_id, action)), 10.0)
        except TimeoutError:
            return ControlResult(False, "the engine did not answer in time")
        except EngineStopped as exc:
            return ControlResult(False, str(exc))

    async def slot_action(self, slot_id: int, action: str, filename: object) -> dict[str, Any]:
        """llama-server's POST /slots/<id>?action=...; errors in its shapes."""
        engine = self._require().engine
        save_dir = self.settings.slot_save_path
        if save_dir is None:
            raise errors.not_supported(
                "This server does not support slots action. Start it with `--slot-save-path`"
            )
        if not 0 <= slot_id < self.n_slots:
            raise errors.invalid_request(f"Invalid slot id {slot_id}: the server has {self.n_slots} slots")
        if action not in SLOT_ACTIONS:
            raise errors.invalid_request("Invalid action")
        try:
            path = None if action == "erase" else slot_path(Path(save_dir), filename)
            if action == "save":
                Path(save_dir).mkdir(parents=True, exist_ok=True)
            future = engine.slot_action(slot_id, action, path)
            return await asyncio.wait_for(asyncio.wrap_future(future), CALL_TIMEOUT)
        except SlotFileError as exc:
            raise errors.invalid_request(str(exc)) from None
        except (SlotBusyError, EngineStopped) as exc:
            raise errors.unavailable(str(exc)) from None
        except OSError as exc:  # the save directory is missing or not writable
            raise errors.APIError(500, f"failed to save slot: {exc.strerror}", "server_error") from None

    # -- embeddings and rerank --------------------------------------------------------------------------
    @property
    def pooling(self) -> Pooling:
        return self._require().pooling

    async def embed(self, prompts: list[list[int]]) -> list[TokenEvent]:
        """Each prompt's final event (its `embedding`), run as concurrent engine requests; cancelling
        the caller (a client gone) cancels every one still running."""
        loaded = self._require()
        loop = asyncio.get_running_loop()
        self.check_queue()  # one request, however many inputs: it is never refused for its size
        self.counters.requests_total += 1
        handles = [loaded.engine.submit(EmbeddingRequest(p, loaded.pooling), loop) for p in prompts]
        self.admission.track(*handles)
        try:
            events = [await _final_event(h) for h in handles]
        finally:
            for handle in handles:
                handle.cancel()  # a no-op for the finished ones
        for event in events:
            self.counters.record(event)  # /metrics: their prompt tokens
        return events

    async def rerank_tokens(self, query: str, document: str) -> list[int]:
        """The rerank prompt's tokens, on a worker thread (documents may be long)."""
        return await anyio.to_thread.run_sync(self._rerank_tokens, query, document)

    def _rerank_tokens(self, query: str, document: str) -> list[int]:
        """llama-server's rerank prompt: the GGUF's `rerank` template with {query} and {document}, else
        BOS query EOS document EOS (each special token where the vocabulary adds it)."""
        tok = self._tokenizer
        template = self._require().llm.gguf.metadata.get("tokenizer.chat_template.rerank")
        if isinstance(template, str):
            text = template.replace("{query}", query).replace("{document}", document)
            return tok.encode(text, False, True)
        bos = [tok.bos_id] if tok.add_bos else []
        eos = [tok.eos_id] if tok.add_eos else []
        return [*bos, *tok.encode(query, False, False), *eos, *tok.encode(document, False, False), *eos]

    # -- request bookkeeping ----------------------------------------------------------------------------
    def log_prompt(self, request_id: str, text: str) -> None:
        folder = self.settings.log_prompts_dir
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{int(time.time() * 1000)}-{request_id}.txt").write_text(text, encoding="utf-8")

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:24]}"


async def _final_event(handle: RequestHandle) -> TokenEvent:
    async for event in handle:
        if event.finish_reason is not None:
            if event.embedding is None:
                raise errors.APIError(500, f"the request ended: {event.finish_reason}", "server_error")
            return event
    raise errors.APIError(500, "the request ended without an answer", "server_error")


def _injected_failures() -> frozenset[int]:
    """LLAMBA_FAIL_FORWARD="3,7": forward passes that fail as a broken kernel would (the error-path tests
    need a real server whose engine step raises; nothing else can make a correct kernel fail on demand)."""
    spec = os.environ.get("LLAMBA_FAIL_FORWARD", "")
    return frozenset(int(n) for n in spec.split(",") if n.strip())
