"""Model architectures. `load_model` picks the class from the GGUF's architecture."""

from __future__ import annotations

from collections.abc import Callable

from engine.backend import Backend
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.models.bert import BertModel
from engine.models.encoder import EncoderModel
from engine.models.gemma3 import Gemma3Model
from engine.models.gemma4 import Gemma4Model
from engine.models.gemma_embedding import GemmaEmbeddingModel
from engine.models.gpt_oss import GptOssModel
from engine.models.jina_bert_v2 import JinaBertV2Model
from engine.models.llama import LlamaModel
from engine.models.mistral3 import Mistral3Model
from engine.models.mixtral import MixtralModel, has_experts
from engine.models.modern_bert import ModernBertModel
from engine.models.nomic_bert import NomicBertModel
from engine.models.phi3 import Phi3Model
from engine.models.qwen2 import Qwen2Model
from engine.models.qwen2moe import Qwen2MoeModel
from engine.models.qwen3 import Qwen3Model
from engine.models.qwen3moe import Qwen3MoeModel
from engine.models.qwen3next import Qwen3NextModel
from engine.models.qwen35 import Qwen35Model
from engine.models.qwen35moe import Qwen35MoeModel

# A loaded model: a decoder (LlamaModel and its families) or an encoder (EncoderModel's, embeddings only).
Model = LlamaModel | EncoderModel

ARCHITECTURES: dict[str, type[LlamaModel] | type[EncoderModel]] = {
    "llama": LlamaModel,
    "mistral3": Mistral3Model,
    "gemma3": Gemma3Model,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "phi3": Phi3Model,
    "qwen2moe": Qwen2MoeModel,
    "qwen3moe": Qwen3MoeModel,
    "gpt-oss": GptOssModel,
    "qwen35": Qwen35Model,
    "qwen35moe": Qwen35MoeModel,
    "qwen3next": Qwen3NextModel,
    "gemma4": Gemma4Model,
    # encoders (engine/models/encoder.py)
    "bert": BertModel,
    "nomic-bert": NomicBertModel,
    "jina-bert-v2": JinaBertV2Model,
    "modern-bert": ModernBertModel,
    "gemma-embedding": GemmaEmbeddingModel,
}


def model_class(g: GGUFFile) -> type[LlamaModel] | type[EncoderModel]:
    """The class of the file's architecture; a `llama` file with experts is Mixtral's."""
    arch = g.require_architecture()
    if arch == "llama" and has_experts(g):
        return MixtralModel
    return ARCHITECTURES[arch]


def load_model(g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None) -> Model:
    """The model of the file's architecture; `on_layer(done, total)` is told after each packed layer
    (load progress). A file with tensors the model does not use (an unknown norm, an incomplete set of
    biases) is refused rather than run without them."""
    arch = g.require_architecture()
    model = model_class(g)(g, backend, on_layer)
    unused = g.tensors.unread()
    if unused:
        more = f" (and {len(unused) - 3} more)" if len(unused) > 3 else ""
        raise UnsupportedModelError(f"{arch} tensors Llamba does not use: {', '.join(unused[:3])}{more}")
    return model
