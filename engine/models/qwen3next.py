"""Qwen3-Next (`qwen3next`: Qwen3-Next-80B-A3B): the trunk of Qwen3.5-MoE (engine/models/qwen35moe.py) as
llama.cpp's llama_model_qwen3next differs from it:

- plain NeoX RoPE over `rope.dimension_count` dimensions (no M-RoPE sections);
- the beta and alpha logits in one `ssm_ba` matrix, per key head (its value heads' b, then their a),
  regrouped at load (engine/models/qwen35_layers.py `GroupedDeltaNetLayer`);
- value heads grouped by key head (value head h reads key head h // (n_v / n_k), llama.cpp's
  interleaved repeat), where Qwen3.5's converter tiles them;
- the legacy fused `ssm_in` (Q|K|V|Z per key head) of early conversions is refused, naming it.
"""

from __future__ import annotations

from engine.models.llama import LlamaLayer
from engine.models.moe import MoeLayerMixin
from engine.models.qwen35_layers import GroupedDeltaNetLayer
from engine.models.qwen35moe import Qwen35MoeModel, SharedExpertMixin


class Qwen3NextDeltaNetLayer(SharedExpertMixin, MoeLayerMixin, GroupedDeltaNetLayer):
    pass


class Qwen3NextModel(Qwen35MoeModel):
    recurrent_layer: type[LlamaLayer] = Qwen3NextDeltaNetLayer
