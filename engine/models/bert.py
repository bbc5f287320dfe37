"""BERT (`bert`: all-MiniLM, bge and their rerankers): the post-LayerNorm encoder.

Input embeddings are the token's row plus the first token-type row (llama.cpp feeds every token as
"sentence A", also in a rerank pair) plus the learned absolute position's row, then a LayerNorm. Each
layer: self-attention over the whole input (Q/K/V with biases), added to the layer's input and
LayerNormed; a GELU feed-forward, added to that and LayerNormed again. nomic-bert and jina-bert-v2 are
this layer with their own positions and feed-forwards (engine/models/nomic_bert.py, jina_bert_v2.py).
"""

from __future__ import annotations

from typing import Any

from engine.batch import Batch
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.models.encoder import (
    EncoderAttention,
    EncoderModel,
    FeedForward,
    LayerNorm,
    Pass,
    host_matrix,
    linear,
    qkv_projection,
)
from engine.models.llama import Projection


class BertLayer:
    """One post-LayerNorm layer's weights: attention, its norm, the feed-forward, the output norm (and
    jina-bert-v2's optional Q/K norms and second attention norm)."""

    def __init__(self, model: BertModel, g: GGUFFile, il: int) -> None:
        hp, be, p = model.hp, model.backend, f"blk.{il}."
        out = linear(be, g, p + "attn_output", bias=model.output_bias)
        self.attn = EncoderAttention(hp, be, qkv_projection(be, g, hp, p), out)
        self.attn_out_norm = LayerNorm(be, g, p + "attn_output_norm", hp.norm_eps)
        self.q_norm = _optional_norm(model, g, p + "attn_q_norm")
        self.k_norm = _optional_norm(model, g, p + "attn_k_norm")
        self.attn_norm_2 = _optional_norm(model, g, p + "attn_norm_2")
        self.ffn = model.read_ffn(g, p)
        self.out_norm = LayerNorm(be, g, p + "layer_output_norm", hp.norm_eps)

    def projections(self) -> list[Projection]:
        return self.attn.projections() + self.ffn.projections()


def _optional_norm(model: BertModel, g: GGUFFile, name: str) -> LayerNorm | None:
    """A LayerNorm the layer may have (its bias optional too), as bert.cpp applies any it finds."""
    if f"{name}.weight" not in g.tensors:
        return None
    return LayerNorm(model.backend, g, name, model.hp.norm_eps, bias="optional")


class BertModel(EncoderModel):
    output_bias: bool | str = "optional"  # attn_output.bias (jina-bert-v2 requires it)
    positions_learned = True  # a position_embd table (BERT's); nomic-bert rotates, jina-bert-v2 biases
    needs_token_types = True  # llama.cpp refuses bert and nomic-bert files without a token type count

    def read_inputs(self, g: GGUFFile) -> None:
        be, hp = self.backend, self.hp
        if int(g.metadata.get("tokenizer.ggml.token_type_count", 0)) == 0 and self.needs_token_types:
            raise UnsupportedModelError(f"{hp.arch} model needs to define token type count")
        # Every token is of type 0 ("sentence A"): only the first row of the table is ever added.
        types = "token_types.weight"
        self.type_row = be.upload(host_matrix(g, types)[0].copy()) if self.has_token_types(g) else None
        self.pos_table = be.upload(host_matrix(g, "position_embd.weight")) if self.positions_learned else None
        self.embd_norm = LayerNorm(be, g, "token_embd_norm", hp.norm_eps)

    def has_token_types(self, g: GGUFFile) -> bool:
        return "token_types.weight" in g.tensors

    def read_layer(self, g: GGUFFile, il: int) -> BertLayer:
        return BertLayer(self, g, il)

    def read_ffn(self, g: GGUFFile, p: str) -> FeedForward:
        """BERT's: up (+bias), GELU, down (+bias)."""
        be = self.backend
        return FeedForward(be, linear(be, g, p + "ffn_up"), linear(be, g, p + "ffn_down"), "seq")

    def embed(self, batch: Batch) -> Any:
        """token + type 0 + position, then the embedding LayerNorm (llama.cpp's order of additions)."""
        be = self.backend
        x = super().embed(batch)
        if self.type_row is not None:
            be.add_bias_inplace(x, self.type_row)
        if self.pos_table is not None:
            if int(batch.positions.max()) >= self.pos_table.shape[0]:  # llama.cpp would read past the table
                raise ValueError(f"{self.hp.arch} has learned positions up to {self.pos_table.shape[0]} only")
            be.add_inplace(x, be.take_rows(self.pos_table, batch.positions))
        return self.embd_norm(x, x)

    def attention(self, layer: BertLayer, x: Any, step: Pass) -> Any:
        """The attention block's output before the residual: Q and K normed where the layer has norms
        (over all heads at once), then positioned (`rotate`: nomic-bert's RoPE; BERT adds positions to
        the input, jina-bert-v2 biases the scores)."""
        q, k, v = layer.attn.heads(x)
        n = x.shape[0]
        if layer.q_norm is not None:
            q = layer.q_norm(q.reshape(n, -1)).reshape(q.shape)
        if layer.k_norm is not None:
            k = layer.k_norm(k.reshape(n, -1)).reshape(k.shape)
        self.rotate(q, k, step)
        return layer.attn.attend(q, k, v, step)

    def rotate(self, q: Any, k: Any, step: Pass) -> None:
        """RoPE on the queries and keys in place (none for BERT)."""

    def layer_forward(self, il: int, layer: BertLayer, x: Any, step: Pass) -> Any:
        be = self.backend
        cur = self.attention(layer, x, step)
        be.add_inplace(cur, x)  # re-add the layer input
        cur = layer.attn_out_norm(cur, cur)
        if layer.attn_norm_2 is not None:  # jina-bert-v2's: the input once more, a second norm
            be.add_inplace(cur, x)
            cur = layer.attn_norm_2(cur, cur)
        out = layer.ffn(cur)
        be.add_inplace(out, cur)  # the feed-forward's residual
        return layer.out_norm(out, out)
