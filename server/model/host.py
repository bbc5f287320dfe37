"""ModelHost: the model's lifecycle, and the one seam between the HTTP routes and the engine.

The host loads the model (server/model/loading.py), puts it to sleep and wakes it (--sleep-idle-seconds;
server/model/sleep.py decides when), drains and stops it, and keeps the facts routes report while it
sleeps. Once loaded it owns the two objects routes use: `prompts` (server/model/prompts.py: templates
and tokens, no engine state) and `client` (server/model/client.py: the engine's thread-safe surface).
Routes reach the model only through `current_model()`; of the engine they import only `engine.api`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
from dataclasses import dataclass, replace

import anyio
import structlog

from engine.api import EngineSnapshot, ModelInfo, ReasoningTags
from engine.text.reasoning import detect_tags
from server.config.settings import Settings
from server.http import errors
from server.model.admission import Admission
from server.model.client import Counters, EngineClient
from server.model.loading import Loaded, info_dict, load_model
from server.model.lora import LoraScales
from server.model.media import MediaEncoder
from server.model.prompts import PromptBuilder, template_caps
from server.state import app_state

log = structlog.get_logger("server")

DRAIN_POLL_S = 0.05  # how often a SIGTERM drain looks whether the live requests have ended


def current_model() -> ModelHost:
    """The app's ModelHost (from inside a request or app context)."""
    return app_state().model


@dataclass(frozen=True)
class Facts:
    """What the routes report about the model, kept while it sleeps."""

    info: ModelInfo
    n_slots: int
    n_ctx_slot: int
    template_source: str
    template_caps: dict[str, bool]  # under llama.cpp's names (/props)
    snapshot: EngineSnapshot = EngineSnapshot()
    modalities: frozenset[str] = frozenset()  # image, audio: what --mmproj's projector reads


class ModelHost:
    """The model's lifecycle and facts; once loaded, its prompt builder and engine client."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.fingerprint = "b0-llamba"
        self.load_error: str | None = None
        # Kept across sleeps: what /metrics counts, and --max-queue's live requests and the drain.
        self.counters = Counters()
        self.admission = Admission(settings.max_queue)
        # the LoRA adapters: global scales (POST /lora-adapters), named ones (adapters as models)
        self.lora = LoraScales(settings.lora, settings.lora_named)
        self._loaded: Loaded | None = None
        # Kept while the model sleeps (--sleep-idle-seconds): what /props, /models and /slots report.
        self._facts: Facts | None = None
        self.sleeping = False
        self._waking: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the model on a worker thread; /health answers 503 until this finishes."""
        try:
            self._loaded = loaded = await anyio.to_thread.run_sync(
                load_model, self.settings, self.admission, self.counters, self.lora
            )
            prompts = loaded.prompts
            caps = template_caps(prompts.template)
            self._facts = Facts(
                loaded.info,
                loaded.client.n_slots,
                prompts.n_ctx_slot,
                prompts.template.source,
                caps,
                modalities=loaded.media.modalities if loaded.media is not None else frozenset(),
            )
        except Exception as exc:
            self.load_error = str(exc)
            log.error("model.load_failed", error=str(exc))
            raise
        info = loaded.info
        log.info("model.loaded", path=str(info.path), slots=self.settings.parallel, info=info_dict(info))

    def stop(self) -> None:
        if self._loaded is not None:
            self._loaded.engine.stop()

    async def drain(self, timeout: float, forced: asyncio.Event) -> None:
        """Refuse new generations and wait until the live ones end, `timeout` passes or `forced` is set
        (a second SIGTERM); what is still running then is cancelled by `stop`."""
        self.admission.draining = True
        live = self.admission.live()
        log.info("server.draining", live=live, timeout=timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        while live and not forced.is_set() and asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(forced.wait(), DRAIN_POLL_S)
            live = self.admission.live()
        log.info("server.drained", cancelled=live)

    async def sleep(self) -> None:
        """Free the weights, KV cache and engine thread; the model's facts stay for /props and /models."""
        loaded = self._loaded
        if loaded is None or self.sleeping:
            return
        self._facts = replace(self._facts, snapshot=loaded.client.snapshot)  # type: ignore[arg-type]
        self._loaded, self.sleeping = None, True
        await anyio.to_thread.run_sync(loaded.engine.stop)
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

    @property
    def prompts(self) -> PromptBuilder:
        """The loaded model's prompt builder; 503 while it loads."""
        return self._require().prompts

    @property
    def media(self) -> MediaEncoder | None:
        """The loaded model's media encoder (--mmproj), None for a text-only model; 503 while it loads."""
        return self._require().media

    @property
    def modalities(self) -> frozenset[str]:
        """What the model reads besides text (kept while it sleeps)."""
        return self._known().modalities

    @property
    def client(self) -> EngineClient:
        """The loaded model's engine client; 503 while it loads."""
        return self._require().client

    # -- model facts (loaded, or sleeping; 503 while the first load runs) ------------------------------
    def _known(self) -> Facts:
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

    def template_caps(self) -> dict[str, bool]:
        return self._known().template_caps

    def reasoning_tags(self) -> ReasoningTags | None:
        """The thinking tags of the chat template, None when it has no thinking block."""
        return detect_tags(self.template_source()) if self.ready else None

    def snapshot(self) -> EngineSnapshot:
        """The engine's state as its thread last published it (slots, queue, counts); while the model
        sleeps, the one it published last."""
        if self.sleeping:
            return self._known().snapshot
        return self.client.snapshot

    async def cached_prompts(self) -> list[tuple[int, ...]]:
        """The token sequences the engine holds cells for (slots and host cache); none while asleep."""
        if self.sleeping or not self.loaded:
            return []
        return await self.client.cached_prompts()


def _return_memory() -> None:
    """Collect the freed model's arrays and hand the heap's free pages back to the system: glibc keeps
    them otherwise (engine/__init__.py raises its trim threshold to 1 GB for the forward passes)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
