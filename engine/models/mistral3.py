"""Ministral 3 / Mistral 3 (`mistral3`): the llama decoder with YaRN RoPE and an attention temperature.

Older Mistral models (7B, Nemo, Small 3.0) convert to the `llama` architecture and run as llama (Nemo's
head_dim of 128 under a 5120-wide embedding comes from `attention.key_length`; llama.cpp applies no
sliding window to them). `mistral3` files differ in metadata only: YaRN scaling (`rope.scaling.type`
yarn, its factor, betas and log multiplier, read in `engine/models/rope.py`) and Llama 4's attention
temperature `attention.temperature_scale` (beta): a query at position p is scaled by
1 + beta * ln(1 + floor(p / n_ctx_orig)), n_ctx_orig being `rope.scaling.original_context_length`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile
from engine.models.llama import LlamaModel


class Mistral3Model(LlamaModel):
    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        super().__init__(g, backend, on_layer)
        self.temperature_beta = float(g.arch_value("attention.temperature_scale", 0.0))

    def scale_queries(self, q: np.ndarray, batch: Batch) -> None:
        """Scale each run of queries that share a temperature (tokens below n_ctx_orig keep 1 and cost
        nothing; the positions come to the host only when a model has a temperature)."""
        if self.temperature_beta == 0.0:
            return
        positions = np.asarray(self.backend.download(batch.positions))
        floors = positions // self.rope.n_ctx_orig
        starts = np.flatnonzero(np.diff(floors, prepend=-1))
        for start, end in zip(starts, [*starts[1:], len(floors)], strict=True):
            if floors[start] == 0:
                continue
            scale = 1.0 + self.temperature_beta * math.log(1.0 + float(floors[start]))
            rows = q[start:end]
            self.backend.scale_inplace(rows.reshape(end - start, q.shape[1] * q.shape[2]), scale)
