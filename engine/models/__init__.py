"""Model architectures. `load_model` picks the class from the GGUF's architecture."""

from __future__ import annotations

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.gemma3 import Gemma3Model
from engine.models.llama import LlamaModel
from engine.models.qwen2 import Qwen2Model
from engine.models.qwen3 import Qwen3Model

ARCHITECTURES: dict[str, type[LlamaModel]] = {
    "llama": LlamaModel,
    "gemma3": Gemma3Model,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
}


def load_model(g: GGUFFile, backend: Backend) -> LlamaModel:
    return ARCHITECTURES[g.require_architecture()](g, backend)
