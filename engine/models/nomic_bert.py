"""nomic-bert (nomic-embed-text): BERT's post-LayerNorm layer with rotary positions and SwiGLU.

No position table: queries and keys are rotated (NeoX pairs, the file's `rope.freq_base`); Q, K and V
come from one fused `attn_qkv` matrix; the feed-forward is silu(gate x) * up x, then down.
"""

from __future__ import annotations

from typing import Any

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.models.bert import BertModel
from engine.models.encoder import FeedForward, Pass, linear
from engine.models.llama import Projection
from engine.models.rope import Rope


def gate_and_up(backend: Backend, g: GGUFFile, p: str) -> tuple[Projection, Projection | None]:
    """(up, gate): one fused gate|up matmul when neither has a bias (it then gives both), else apart."""
    t = g.tensors
    if p + "ffn_up.bias" in t or p + "ffn_gate.bias" in t:
        return linear(backend, g, p + "ffn_up"), linear(backend, g, p + "ffn_gate")
    return Projection(backend, [t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]]), None


class NomicBertModel(BertModel):
    positions_learned = False

    def read_inputs(self, g: GGUFFile) -> None:
        super().read_inputs(g)
        hp = self.hp
        self.rope = Rope.plain(self.backend, hp.rope_base, neox=True, n_rot=hp.n_rot)

    def read_ffn(self, g: GGUFFile, p: str) -> FeedForward:
        up, gate = gate_and_up(self.backend, g, p)
        return FeedForward(self.backend, up, linear(self.backend, g, p + "ffn_down"), "par", "silu", gate)

    def rotate(self, q: Any, k: Any, step: Pass) -> None:
        self.rope.apply(self.backend, q, step.positions, 0)
        self.rope.apply(self.backend, k, step.positions, 0)
