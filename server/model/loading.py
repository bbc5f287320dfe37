"""Loading a model: its weights (and a draft model's), the engine thread started and warmed up, and the
two objects routes reach it through, the prompt builder and the engine client. All of it or none of it:
a load that fails leaves nothing behind but its error. Runs on a worker thread (ModelHost.load).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import structlog

from engine.api import POOLING_TYPES, ModelInfo, Pooling
from engine.control_vector import apply_control_vector, load_control_vectors
from engine.engine import Engine, EngineConfig
from engine.grammar import CompiledGrammar, GrammarCompiler, GrammarError
from engine.llm import LLM
from engine.media.mmproj import load_projector
from engine.speculative.draft import check_vocabulary
from engine.text.chat import ChatTemplate
from engine.text.tool_calls import detect_format
from server.config.settings import Settings
from server.model.admission import Admission
from server.model.client import Counters, EngineClient, Grammars
from server.model.constraints import schema_spec
from server.model.gbnf import gbnf_spec
from server.model.llama_schema import SchemaError
from server.model.lora import LoraScales
from server.model.media import MediaEncoder, vocab_lookups
from server.model.prompts import PromptBuilder

log = structlog.get_logger("server")

# Where each load stage starts in the whole load's progress (router mode reports it on /models/sse); the
# repack stage advances layer by layer.
LOAD_STAGES = {"read": (0.02, 0.03), "repack": (0.05, 0.65), "compile": (0.72, 0.0), "grammar": (0.9, 0.0)}


@dataclass(frozen=True)
class Loaded:
    """What exists once the model is loaded."""

    info: ModelInfo
    engine: Engine
    prompts: PromptBuilder
    client: EngineClient
    media: MediaEncoder | None = None  # --mmproj's projector


def load_model(settings: Settings, admission: Admission, counters: Counters, lora: LoraScales) -> Loaded:
    """The model of --model loaded, its engine started; the client shares the host's `admission` and
    `counters` (they outlive a load while the model sleeps), and `lora`'s adapters are hooked in."""
    s = settings
    llm = LLM.load(s.model, device=s.device, n_threads=s.threads, mlock=s.mlock, progress=_log_progress)
    # --lora, --lora-scaled, named ones: checked against the model and hooked in, or the load fails (one line)
    lora.attach(llm.model, llm.gguf, llm.tokenizer)
    if s.control_vectors:  # summed, checked against the model's width, or the load fails (one line)
        apply_control_vector(
            llm.model, load_control_vectors(s.control_vectors), *s.control_vector_layer_range
        )
        log.info("model.control_vectors", files=[path for path, _ in s.control_vectors])
    if len(lora):
        log.info("model.lora_adapters", adapters=lora.paths)
    template = ChatTemplate.from_gguf_metadata(llm.gguf.metadata, s.chat_template)
    config = _engine_config(settings)
    draft = _load_draft(settings, llm)
    pooling = _pooling_of(settings, llm)
    if s.embedding and pooling == "rank" and llm.model.rank_head is None:
        # llama-server serves this too (the score is the last token's first hidden component): say so.
        log.warning(
            "model.rerank_without_classifier", detail="no cls.output in the model: scores are not trained"
        )
    projector = _load_projector(settings, llm)
    # the tokens a projector puts between its chunks (idefics3's), found or the load fails (one line)
    lookups = vocab_lookups(llm.tokenizer, getattr(projector, "lookup_texts", ()))
    engine = Engine(llm, config, draft)
    _log_progress("compile", 0.0)  # the engine's start compiles (or loads) every kernel in a warm-up batch
    engine.start()
    _log_progress("grammar", 0.0)
    # The grammar engine's view of the vocabulary holds the GIL for 0.1 s (SmolLM2) to 1.6 s (Gemma
    # 3): built here, at load, never while requests are served.
    compiler = GrammarCompiler.for_tokenizer(llm.tokenizer)
    grammars = Grammars(compiler, _default_grammar(settings, compiler))
    rerank = llm.gguf.metadata.get("tokenizer.chat_template.rerank")
    prompts = PromptBuilder(
        settings,
        llm.tokenizer,
        template,
        tool_format=detect_format(template.source),
        special_tokens=compiler.special_tokens,
        rerank_template=rerank if isinstance(rerank, str) else None,
        n_ctx_slot=engine.n_ctx_slot,
        n_vocab=llm.tokenizer.n_vocab,
    )
    client = EngineClient(engine, grammars, pooling, settings, admission, counters)
    media = MediaEncoder(projector, engine, config.n_ubatch, lookups) if projector is not None else None
    return Loaded(llm.info(), engine, prompts, client, media)


def _load_projector(settings: Settings, llm: LLM) -> Any:
    """--mmproj's projector on the model's backend; one line when it cannot serve this model."""
    if not settings.mmproj:
        return None
    projector = load_projector(settings.mmproj, llm.backend)
    model = llm.model
    if not model.reads_media or (projector.non_causal and not model.non_causal_media):
        why = "places no media rows" if not model.reads_media else "attends to them causally only"
        raise ValueError(f"--mmproj: the {llm.info().arch} architecture {why} (not built yet)")
    if projector.n_embd_text != llm.model.hp.n_embd:
        raise ValueError(
            f"mismatch between text model (n_embd = {llm.model.hp.n_embd}) and mmproj"
            f" (n_embd = {projector.n_embd_text})"
        )
    log.info("model.mmproj", path=settings.mmproj, modalities=sorted(projector.modalities))
    return projector


def _engine_config(settings: Settings) -> EngineConfig:
    s = settings
    return EngineConfig(
        n_slots=s.parallel,
        n_ctx=s.ctx_size,
        kv_unified=s.kv_unified,
        cache_idle_slots=s.cache_idle_slots,
        n_ubatch=min(s.ubatch_size, s.batch_size),
        slot_similarity=s.slot_similarity,
        cache_ram_mib=s.cache_ram,
        ctx_checkpoints=s.ctx_checkpoints,
        checkpoint_min_step=s.checkpoint_min_step,
        context_shift=s.context_shift and not s.mmproj,  # as llama-server: no shift with media
        n_keep=s.keep,
        cache_type_k=s.cache_type_k,
        cache_type_v=s.cache_type_v,
        fail_forward=_injected_failures(),
        n_threads=s.threads or 0,
        adaptive_threads=s.adaptive_threads,
    )


def _load_draft(settings: Settings, llm: LLM) -> LLM | None:
    """--model-draft's model (draft-simple speculation): refused at start-up if it speaks another
    vocabulary than `llm`."""
    if not settings.model_draft:
        return None
    draft = LLM.load(settings.model_draft, device=settings.device, n_threads=settings.threads)
    check_vocabulary(draft, llm)
    return draft


def _default_grammar(settings: Settings, compiler: GrammarCompiler) -> CompiledGrammar | None:
    """The server-wide constraint, compiled for this model; a bad one fails the load, naming its flag."""
    s = settings
    if s.grammar is None and s.json_schema is None:
        return None
    if s.grammar is not None:
        try:  # llama.cpp's reading of GBNF, as for a request's grammar
            spec, flag = gbnf_spec(s.grammar), "--grammar"
        except GrammarError as exc:
            raise ValueError(f"--grammar: {exc}") from None
    else:
        try:  # llama.cpp's meaning, as for a request's schema (but {} is any value here, as in llama.cpp)
            spec, flag = schema_spec(s.json_schema, request=False), "--json-schema"
        except SchemaError as exc:
            raise ValueError(f"--json-schema: invalid JSON schema {exc}") from None
    try:
        return compiler.compile(spec)
    except GrammarError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _pooling_of(settings: Settings, llm: LLM) -> Pooling:
    """--pooling, else the GGUF's pooling_type (llama.cpp's numbering), else none: llama.cpp's rule."""
    if settings.pooling is not None:
        return settings.pooling  # type: ignore[return-value]
    stored = llm.gguf.arch_value("pooling_type")
    return POOLING_TYPES[int(stored)] if stored is not None and 0 <= int(stored) < 5 else "none"


def _log_progress(stage: str, fraction: float) -> None:
    """A load stage as a log event (a router reads its children's JSON logs)."""
    start, span = LOAD_STAGES[stage]
    log.info("model.load_progress", stage=stage, value=round(start + span * fraction, 3))


def info_dict(info: ModelInfo) -> dict[str, Any]:
    """The model's facts as the `model.loaded` log event carries them."""
    fields = ("name", "arch", "n_vocab", "n_ctx_train", "n_embd", "n_params", "size")
    return {"path": str(info.path), **{name: getattr(info, name) for name in fields}}


def _injected_failures() -> frozenset[int]:
    """LLAMBA_FAIL_FORWARD="3,7": forward passes that fail as a broken kernel would (the error-path tests
    need a real server whose engine step raises; nothing else can make a correct kernel fail on demand)."""
    spec = os.environ.get("LLAMBA_FAIL_FORWARD", "")
    return frozenset(int(n) for n in spec.split(",") if n.strip())
