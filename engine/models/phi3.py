"""Phi-3 / Phi-3.5 / Phi-4-mini (`phi3`): the llama decoder with fused weights and LongRoPE.

- Q, K and V are one `attn_qkv` matrix, gate and up one `ffn_up` matrix of 2 * n_ff rows (gate first),
  both split after a single matmul (`Projection(split=...)`).
- RoPE is NeoX-style over `rope.dimension_count` dimensions (Phi-4-mini turns 96 of its 128); the 128k
  files carry LongRoPE's `rope_factors_short` / `rope_factors_long` and `rope.scaling.attn_factor`
  (`engine/models/rope.py`). The long factors apply when a slot's context exceeds the original one;
  llama.cpp decides by its per-sequence context, which is the whole context when llama-server's KV
  cache is unified (its default when -np is not given), so there the two can pick differently.
- The file's `attention.sliding_window` is ignored, as llama.cpp ignores it (its Phi SWA is disabled),
  so every layer attends to the whole context.
"""

from __future__ import annotations

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.hparams import HParams
from engine.models.llama import LlamaLayer, LlamaModel, Projection


class Phi3Layer(LlamaLayer):
    def gate_up_projection(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> Projection:
        return Projection(backend, [g.tensors[p + "ffn_up.weight"]], split=[hp.n_ff, hp.n_ff])


class Phi3Model(LlamaModel):
    layer_class = Phi3Layer
