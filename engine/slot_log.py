"""The slots' lifecycle as log events: the moments llama-server logs for each slot (chosen, task launched,
prompt cached and processed, timings, released), with the numbers its lines carry.

The engine only names the events and their fields (structured, for JSON logs); their llama-server wording
is the server's log renderer's (`server/http/llama_log.py`), which prompt-cache profilers read. Every call
runs on the engine thread between two steps: a formatted line written to the log's streams, nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from engine.api import Timings

if TYPE_CHECKING:
    from engine.embedding import EmbeddingSequence
    from engine.sequence import Sequence
    from engine.slots import Slot

log = structlog.get_logger("engine")


def selected_by_similarity(slot: Slot, f_sim: float, thold: float, f_keep: float) -> None:
    log.info("slot.selected", id_slot=slot.id, id_task=-1, by="lcp", f_sim=f_sim, thold=thold, f_keep=f_keep)


def selected_by_lru(slot: Slot) -> None:
    t_last = int(slot.last_used * 1e6) if slot.last_used else -1  # llama-server's never-used slot: -1
    log.info("slot.selected", id_slot=slot.id, id_task=-1, by="lru", t_last=t_last)


def selected_by_id(slot: Slot) -> None:
    log.info("slot.selected", id_slot=slot.id, id_task=-1, by="id")


def launched(slot: Slot, n_ctx: int, n_keep: int, n_prompt: int, n_past: int) -> None:
    """A task took the slot: its prompt's length and the cells it keeps (llama-server's n_past)."""
    ids = {"id_slot": slot.id, "id_task": slot.id_task}
    log.info("slot.launch", **ids, is_child=0)
    log.info("slot.new_prompt", **ids, n_ctx_slot=n_ctx, n_keep=n_keep, n_prompt=n_prompt)
    log.info("slot.cache_reuse", **ids, n_past=n_past)


def prompt_chunk(slot: Slot, seq: Sequence | EmbeddingSequence, batch_tokens: int) -> None:
    """A prompt chunk is in the step's batch (`batch_tokens`: the batch's tokens so far)."""
    n_prompt, n_tokens = len(seq.request.prompt_tokens), len(slot.tokens)
    ids = {"id_slot": slot.id, "id_task": slot.id_task, "n_tokens": n_tokens, "batch_n_tokens": batch_tokens}
    log.info("slot.prompt_progress", **ids, progress=n_tokens / n_prompt if n_prompt else 0.0)
    if not seq.pending:
        log.info("slot.prompt_done", **ids)


def finished(slot: Slot, seq: Sequence | EmbeddingSequence, timings: Timings | None) -> None:
    """The task ended (a generation's timings first, as llama-server prints them) and the slot is free."""
    ids = {"id_slot": slot.id, "id_task": slot.id_task}
    if timings is not None:
        fields = timings.as_dict()
        log.info("slot.timings", **ids, **fields, draft_steps=timings.draft_steps)
    truncated = int(getattr(seq, "truncated", False))
    log.info("slot.release", **ids, n_tokens=len(slot.tokens), truncated=truncated)
