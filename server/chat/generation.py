"""What the generation routes share: the engine request of a body and its prompt, built in one pass; a
whole generation collected; and the reply fragments several routes shape alike (usage, logprobs)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from engine.api import (
    GenerationRequest,
    SamplingParams,
    SpecParams,
    Timings,
    TokenEvent,
    ToolCall,
    ToolCallSpec,
    add_tool_call_steps,
)
from server.chat.schemas import CompletionRequest, GenerationFields
from server.chat.structured import answer_grammar
from server.chat.task_params import RunParams, task_params
from server.config.settings import Settings
from server.http import errors
from server.model.client import EngineClient
from server.model.constraints import ToolPlan
from server.model.host import ModelHost
from server.model.lora import LoraRequestError, UnknownAdapter
from server.model.prompts import Prompt, PromptBuilder
from server.model.sampling import SPEC_TYPES


def new_id(prefix: str) -> str:
    """A reply's id (also its engine request's, which control calls name)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


async def build_request(
    model: ModelHost,
    body: GenerationFields,
    prompt: Prompt,
    n_probs: int,
    request_id: str,
    tools: ToolPlan | None = None,
    reading: ToolCallSpec | None = None,
) -> GenerationRequest:
    """The engine request of a body and its prompt, whole in one pass: sampling, limits, stop strings,
    the prompt's reasoning treatment, speculation, and its grammar (the body's constraint, or its tools'
    calls, which are then also parsed out of the answer; `reading`: how a chat answer is read, over the
    tools' parsing; the prompt's prefill). A full queue is a 503 here (--max-queue), before any byte of
    the reply."""
    client, prompts, s = model.client, model.prompts, model.settings
    if not model.model_info().generates:
        raise errors.invalid_request(
            "the current context does not support logits computation: this model is an encoder, it serves "
            "embeddings and rerank only (/v1/embeddings, /rerank)"
        )
    client.check_queue(body.n_choices())
    try:
        sampling = body.sampling(s.sampling, prompts.n_vocab, prompts.encode_plain, n_probs)
    except ValueError as exc:
        raise errors.invalid_request(str(exc)) from exc
    sampling = whole_context_windows(sampling, model.n_ctx_slot)
    speculative = spec_params(s, body)
    run = run_params(s, body, prompt, speculative)
    lora, lora_hold, lora_params = lora_adapters(model, body)
    try:  # an aLoRA applies from its invocation in the prompt on (none there: the base)
        lora, lora_from = model.lora.activated(lora, lora_hold, prompt.tokens)
    except LoraRequestError as exc:
        raise errors.invalid_request(str(exc)) from None
    return GenerationRequest(
        prompt_tokens=prompt.tokens,
        media=prompt.media,
        sampling=sampling,
        n_predict=run.n_predict,
        stop=(body.stop_list() or s.reverse_prompts) + (tools.format.extra_stops if tools else ()),
        ignore_eos=run.ignore_eos,
        id_slot=body.id_slot,
        cache_prompt=body.cache_prompt,
        request_id=request_id,
        timings_per_token=body.timings_per_token,
        return_progress=body.return_progress,
        t_max_predict_ms=body.t_max_predict_ms,
        n_discard=body.n_discard,
        n_keep=run.n_keep,
        n_indent=body.n_indent,
        truncated=prompt.truncated,
        reasoning=prompt.reasoning,
        tool_calls=reading or (tools.parsing if tools else None),
        prefill=prompt.prefill,
        grammar=await answer_grammar(client, body, tools),
        speculative=speculative,
        slot_params=task_params(sampling, run) | lora_params,
        lora=lora,
        lora_from=lora_from,
        lora_hold=lora_hold,
    )


def lora_adapters(
    model: ModelHost, body: GenerationFields
) -> tuple[tuple[tuple[int, float], ...], tuple[Any, ...], dict]:
    """The request's LoRA adapter set (the adapter its `model` names, else its `lora` scales, else the
    global ones; a 400 naming a bad entry, the route's 404 for a model name that is no adapter), the
    adapters' weights it holds while it runs, and its /slots params' `lora` (the request's own list, as
    llama-server shows it)."""
    asked = getattr(body, "lora", None)
    try:
        lora, hold = model.lora.for_request(asked, adapter_model(model, body.model))
    except LoraRequestError as exc:
        raise errors.invalid_request(str(exc)) from None
    except UnknownAdapter as exc:  # unloaded since the name was read
        raise errors.not_found(f"model '{exc.args[0]}' not found") from None
    own = [{"id": i, "scale": x} for i, x in model.lora.parse(asked).items()] if asked else []
    return lora, hold, ({"lora": own} if own else {})


def adapter_model(model: ModelHost, asked: str | None) -> str | None:
    """The named LoRA adapter a request's `model` asks for; None: the base model. Without named adapters
    `model` is not read (llama-server's rule); with them (vLLM's) a name that is neither the base model's
    (its id or an -a alias) nor an adapter's is the route's 404."""
    lora = model.lora
    if not asked:
        return None
    if lora.is_name(asked):  # also an adapter named by its file's task name (no check of other names)
        return asked
    if not lora.serves_names:
        return None
    if asked in (model.settings.model_alias, *model.settings.aliases):
        return None
    raise errors.not_found(f"model '{asked}' not found")


def run_params(
    settings: Settings, body: GenerationFields, prompt: Prompt, spec: SpecParams | None
) -> RunParams:
    """The request's limits and reading as llama-server's task params name them (/slots)."""
    return RunParams(
        n_predict=body.max_new_tokens(settings.n_predict),
        n_keep=settings.keep if body.n_keep is None else body.n_keep,
        n_discard=body.n_discard,
        ignore_eos=settings.ignore_eos if body.ignore_eos is None else body.ignore_eos,
        stream=body.stream,
        timings_per_token=body.timings_per_token,
        chat=bool(prompt.text),
        reasoning_format=getattr(body, "reasoning_format", None) or settings.reasoning_format,
        spec_types=spec.types if spec is not None else (),
    )


def whole_context_windows(sampling: SamplingParams, n_ctx_slot: int) -> SamplingParams:
    """`repeat_last_n: -1` and `dry_penalty_last_n: -1` mean the slot's context, as llama-server maps
    them (its generation_settings then show the size); a window past a context shift stays this size."""
    windows = {"repeat_last_n": sampling.repeat_last_n, "dry_penalty_last_n": sampling.dry_penalty_last_n}
    mapped = {name: n_ctx_slot for name, n in windows.items() if n == -1}
    return replace(sampling, **mapped) if mapped else sampling


def spec_params(settings: Settings, body: GenerationFields) -> SpecParams | None:
    """The request's speculation: its `speculative.*` fields over the server's --spec-* settings."""
    base = settings.spec
    types = _spec_types(body.speculative_type, base.types, bool(settings.model_draft))
    asked = {
        "n_max": body.speculative_n_max,
        "n_min": body.speculative_n_min,
        "p_min": body.speculative_p_min,
    }
    try:  # checked even when nothing speculates: a bad value is never silently ignored
        params = replace(base, types=types, **{k: v for k, v in asked.items() if v is not None})
    except ValueError as exc:
        raise errors.invalid_request(f"'speculative': {exc}") from None
    return params if params.enabled else None


def _spec_types(asked: str | list[str] | None, default: tuple[str, ...], has_draft: bool) -> tuple[str, ...]:
    """`speculative.type` (a name, a comma list or a list; "none" turns it off) or the server's types."""
    if asked is None:
        return default
    names = tuple(t.strip() for t in (asked.split(",") if isinstance(asked, str) else asked))
    for name in names:
        if name != "none" and name not in SPEC_TYPES:
            known = ", ".join(SPEC_TYPES)
            raise errors.invalid_request(f"'speculative.type': unknown type {name!r} (known: none, {known})")
        if name == "draft-simple" and not has_draft:
            raise errors.invalid_request("'speculative.type': draft-simple needs a draft model (-md)")
    return () if "none" in names else names


async def completion_request(model: ModelHost, raw: Any) -> tuple[CompletionRequest, Prompt]:
    """A validated completion body and its prompt tokens fitted to the context."""
    body = CompletionRequest.model_validate(raw)
    prompts = model.prompts  # 503 while the model loads
    return body, prompts.fit_prompt(await prompts.tokenize_prompt(body.prompt), body.n_keep)


@dataclass
class Outcome:
    """Everything a finished generation produced, for non-streaming replies."""

    text: str = ""
    reasoning: str = ""  # the reasoning block's text, when the request splits it out
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)
    final: TokenEvent | None = None

    @property
    def finish_reason(self) -> str:
        return (self.final.finish_reason if self.final else None) or "stop"

    @property
    def timings(self) -> Timings | None:
        return self.final.timings if self.final else None

    @property
    def n_generated(self) -> int:
        return self.final.timings.predicted_n if self.final and self.final.timings else len(self.tokens)

    def add(self, event: TokenEvent) -> None:
        raise_if_failed(event)
        self.text += event.text
        self.reasoning += event.reasoning_text
        add_tool_call_steps(self.tool_calls, event.tool_calls)
        if event.token is not None:
            self.tokens.append(event.token)
            self.events.append(event)
        if event.finish_reason is not None:
            self.final = event


def raise_if_failed(event: TokenEvent) -> None:
    """A request the engine ended with an error (a failed step) is a 500 naming the failure; in a stream
    that already sent bytes, `sse.errors_as_events` turns it into the closing error event."""
    if event.finish_reason == "error":
        raise errors.APIError(500, event.error or "the engine failed while generating", "server_error")


def replayable(request: GenerationRequest) -> bool:
    """Whether the request decodes the same tokens when run again (a resumed durable stream): greedy,
    or seeded sampling; the kernels' batch invariance does the rest."""
    return request.sampling.greedy or not request.sampling.random_seed


async def collect(client: EngineClient, request: GenerationRequest) -> Outcome:
    out = Outcome()
    async for event in client.events(request):
        out.add(event)
    return out


def usage(n_prompt: int, outcome_final: TokenEvent | None) -> dict[str, Any]:
    t = outcome_final.timings if outcome_final else None
    completion = t.predicted_n if t else 0
    return {
        "completion_tokens": completion,
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": t.cache_n if t else 0},
    }


def piece_info(prompts: PromptBuilder, token: int, value: float, key: str = "logprob") -> dict[str, Any]:
    raw = prompts.piece(token)
    return {
        "id": token,
        "token": raw.decode("utf-8", errors="replace"),
        "bytes": list(raw),
        key: value,
    }


def has_probs(event: TokenEvent) -> bool:
    return event.token is not None and (event.logprob is not None or event.prob is not None)


def openai_logprobs(prompts: PromptBuilder, events: list[TokenEvent]) -> list[dict[str, Any]]:
    """OpenAI's logprobs.content entries (llama-server adds the token id). With post_sampling_probs,
    llama-server's other shape: `prob` and `top_probs` (probabilities after the sampler chain)."""
    content = []
    for ev in events:
        if not has_probs(ev):
            continue
        assert ev.token is not None
        if ev.prob is not None:
            entry = piece_info(prompts, ev.token, ev.prob, "prob")
            entry["top_probs"] = [piece_info(prompts, t, q, "prob") for t, q in ev.top_probs]
        else:
            entry = piece_info(prompts, ev.token, ev.logprob or 0.0)
            entry["top_logprobs"] = [piece_info(prompts, t, lp) for t, lp in ev.top_logprobs]
        content.append(entry)
    return content


def stop_type(event: TokenEvent | None) -> str:
    """llama-server's stop_type: eos, word, limit or none."""
    if event is None or event.finish_reason in (None, "cancelled", "error"):
        return "none"
    if event.stop_word is not None:
        return "word"
    return "eos" if event.finish_reason == "stop" else "limit"
