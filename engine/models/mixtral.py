"""Mixtral (and any `llama` GGUF with `expert_count`): llama's decoder with routed experts in every layer.

llama.cpp keeps Mixtral under the `llama` architecture; a file is a mixture of experts when its metadata
has `llama.expert_count` (8 in Mixtral 8x7B, 2 of them used per token). Routing: softmax over the
experts, the top k, their probabilities divided by their sum. The experts' tensors are the merged 3-D
`ffn_{gate,up,down}_exps` that llama.cpp's converter has written since 2024; older files with one tensor
per expert (`ffn_gate.0.weight`) are refused at load, naming the layout.
"""

from __future__ import annotations

from engine.gguf import GGUFFile
from engine.models.llama import LlamaLayer, LlamaModel
from engine.models.moe import MoeLayerMixin, MoeModelMixin


class MixtralLayer(MoeLayerMixin, LlamaLayer):
    pass


class MixtralModel(MoeModelMixin, LlamaModel):
    layer_class = MixtralLayer


def has_experts(g: GGUFFile) -> bool:
    """Whether a `llama` file is a mixture of experts (llama.cpp's test: a non-zero expert_count)."""
    return int(g.arch_value("expert_count", 0) or 0) > 0
