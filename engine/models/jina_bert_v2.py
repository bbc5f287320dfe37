"""jina-bert-v2 (jina-embeddings-v2, jina-reranker-v1): BERT's post-LayerNorm layer with ALiBi.

No positions are added or rotated: each attention score gets slope[h] * -|p_i - p_j| (ALiBi, llama.cpp's
max bias 8). Optional per-layer LayerNorms of Q and K (over all heads at once) and a second attention
norm; the output projection has a bias. The feed-forward is GEGLU when the up matrix holds gate and up
(twice n_ff rows), gelu(gate x) * up x with a separate gate, else BERT's GELU. A reranker's head is a
one-row `cls` (dense, tanh) without `cls.output`.
"""

from __future__ import annotations

from engine.gguf import GGUFFile
from engine.models.bert import BertLayer, BertModel
from engine.models.encoder import FeedForward, alibi_slopes, linear

MAX_ALIBI_BIAS = 8.0  # llama.cpp sets it for this architecture whatever the file says


class JinaBertV2Model(BertModel):
    output_bias = True
    positions_learned = False
    needs_token_types = False  # its token_types table is required instead

    def has_token_types(self, g: GGUFFile) -> bool:
        return True

    def read_ffn(self, g: GGUFFile, p: str) -> FeedForward:
        be, t = self.backend, g.tensors
        up, down = linear(be, g, p + "ffn_up"), linear(be, g, p + "ffn_down", bias=True)
        if p + "ffn_gate.weight" in t:
            return FeedForward(be, up, down, "par", "gelu", linear(be, g, p + "ffn_gate", bias=False))
        fused = t[p + "ffn_up.weight"].shape[0] != self.hp.n_ff
        return FeedForward(be, up, down, "geglu" if fused else "seq")

    def read_layer(self, g: GGUFFile, il: int) -> BertLayer:
        layer = super().read_layer(g, il)
        layer.attn.slopes = alibi_slopes(self.hp.n_head, MAX_ALIBI_BIAS)
        return layer
