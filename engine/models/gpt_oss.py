"""gpt-oss (`gpt-oss`: gpt-oss-20b, gpt-oss-120b): OpenAI's mixture of experts, as llama.cpp's openai-moe.

- attention: Q/K/V and output biases, NeoX RoPE with YaRN (`rope.scaling.*`, engine/models/rope.py; the
  same table in every layer), head_dim from `attention.key_length` (64 under 2880 / 64), a learned sink
  logit per head (`attn_sinks.weight`) in each softmax's denominator (`Backend.attention_sinks`), and
  sliding-window attention (`attention.sliding_window`, 128) in every other layer, the first included
  (llama.cpp's pattern of 2: the last layer of each pair is global);
- FFN input norm `post_attention_norm` (llama.cpp's attn_post_norm) in place of ffn_norm;
- routed experts (32 or 128, 4 used) with biases on the router and every expert matrix, routing by the
  top k router logits and a softmax over those k (llama.cpp's SOFTMAX_WEIGHT), and the clamped SwiGLU
  x * sigmoid(1.702 x) * (y + 1), x = min(gate, 7), y = clamp(up, -7, 7) (`Backend.swiglu_oai`);
- experts in MXFP4 (engine/cpu/matmul/mxfp4.py) in the released files, the rest Q8_0 / F16 / F32.

A backend without the sinks or the clamped SwiGLU (CUDA, for now) refuses the model at load.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.memory.kv import KVCache
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, LlamaModel, norm_weight
from engine.models.moe import MoeLayerMixin, MoeModelMixin
from engine.models.rope import Rope, rope_from_gguf


class GptOssLayer(MoeLayerMixin, LlamaLayer):
    gating = "softmax_weight"
    normalize = False
    expert_biases = True
    activation = "swiglu_oai"
    ffn_norm_name = "post_attention_norm.weight"

    def __init__(self, backend: Backend, g: GGUFFile, hp: HParams, il: int) -> None:
        super().__init__(backend, g, hp, il)
        self.sinks = norm_weight(backend, g, f"blk.{il}.attn_sinks.weight")


class GptOssModel(MoeModelMixin, LlamaModel):
    layer_class = GptOssLayer

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        missing = [n for n in ("attention_sinks", "swiglu_oai") if getattr(backend, n) is None]
        if missing:
            raise UnsupportedModelError(f"gpt-oss: the {backend.name} backend has no {' or '.join(missing)}")
        super().__init__(g, backend, on_layer)
        hp = self.hp
        self.rope_swa = self.rope
        if hp.rope_base_swa != hp.rope_base:  # a file's own base for the windowed layers
            self.rope_swa = rope_from_gguf(g, backend, hp.rope_base_swa, hp.rope_neox, hp.n_rot)

    def rope_for(self, il: int) -> Rope:
        return self.rope_swa if self.hp.swa_layers[il] else self.rope

    def attend(
        self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, batch: Batch, kv: KVCache
    ) -> np.ndarray:
        """Llama's attention, then each head's output scaled by its sink's share of the softmax."""
        out = self.attend_heads(il, q, k, v, batch, kv)
        sinks, window = self.layers[il].sinks, self.window(il)
        self.backend.attention_sinks(  # type: ignore[misc]
            q, kv.k[il], batch.seq_ids, batch.positions, window, self.hp.attn_scale, sinks, out
        )
        return out.reshape(q.shape[0], q.shape[1] * q.shape[2])
