"""Model architectures. `load_model` picks the class from the GGUF's architecture."""

from __future__ import annotations

from collections.abc import Callable

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.gemma3 import Gemma3Model
from engine.models.llama import LlamaModel
from engine.models.qwen2 import Qwen2Model

ARCHITECTURES: dict[str, type[LlamaModel]] = {"llama": LlamaModel, "gemma3": Gemma3Model, "qwen2": Qwen2Model}


def load_model(
    g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
) -> LlamaModel:
    """The model; `on_layer(done, total)` is told after each packed layer (load progress)."""
    return ARCHITECTURES[g.require_architecture()](g, backend, on_layer)
