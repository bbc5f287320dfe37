"""Small synthetic encoder GGUFs, one per family without a real file here, with seeded random weights.

Each is written as llama.cpp's converter writes that family (its keys, tensor names and shapes), with a
real vocabulary, so real text tokenizes and llama.cpp (llama-cpp-python 0.3.36) runs the same file:
scripts/make_encoder_goldens.py records its vectors and scores in tests/golden/encoders.json, pinned to
these files' sha256. The bytes depend only on the seeds and the vocabulary files:

- `bge-reranker` (`bert`): BERT with a classifier head (`cls` dense + tanh, `cls.output` one label),
  pooling rank, llama.cpp's models/ggml-vocab-bert-bge.gguf vocabulary (WordPiece); Q8_0 matrices;
- `jina-bert-v2`: ALiBi, Q/K LayerNorms, layer 0's feed-forward GEGLU over a fused up matrix and layer
  1's with a separate gate and a second attention norm, a one-row `cls` head; bge's vocabulary;
- `modern-bert`: fused QKV, four layers (1 and 2 see a symmetric window of 4 with their own RoPE base),
  no norm on layer 0's input, GEGLU, a mean-pooled classifier (`cls`, GELU, `cls.norm`, `cls.output`);
- `gemma-embedding`: EmbeddingGemma's layer (six layers, the sixth global, window 8), grouped heads,
  the `dense_2`/`dense_3` projections; Gemma 3's vocabulary (SentencePiece), Q8_0 matrices.

    .venv/bin/python -m tests.synthetic_encoders OUT_DIR    # writes all four there
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.gguf import GGUFFile

N_EMBD, N_HEAD, N_FF = 64, 4, 128
# Every encoder architecture, each checked against llama.cpp by tests/test_encoders.py (bert and nomic-bert
# on the real files, bert also on bge-reranker, the others on their synthetic file).
ENCODER_ARCHS = frozenset({"bert", "nomic-bert", "jina-bert-v2", "modern-bert", "gemma-embedding"})
WPM_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


class Weights:
    """Seeded tensors for one file: normal matrices (optionally Q8_0), norms near 1, small biases."""

    def __init__(self, writer: gguf.GGUFWriter, seed: int, q8: bool) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)
        self.q8 = q8

    def matrix(
        self, name: str, rows: int, cols: int, scale: float | None = None, table: bool = False
    ) -> None:
        """A weight matrix; `table` (the position embeddings, which llama.cpp reads rows of rather than
        multiplying) stays float16 as the converter keeps it."""
        data = (self.rng.standard_normal((rows, cols)) * (scale or cols**-0.5)).astype(np.float32)
        if self.q8 and cols % 32 == 0 and not table:
            raw = gguf_quants.quantize(data, GGMLQuantizationType.Q8_0)
            self.writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            self.writer.add_tensor(name, data.astype(np.float16) if self.q8 else data)

    def norm(self, name: str, n: int, bias: bool = True) -> None:
        self.writer.add_tensor(f"{name}.weight", (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32))
        if bias:
            self.bias(f"{name}.bias", n)

    def bias(self, name: str, n: int) -> None:
        self.writer.add_tensor(name, (0.05 * self.rng.standard_normal(n)).astype(np.float32))

    def linear(self, name: str, rows: int, cols: int, bias: bool = True) -> None:
        self.matrix(f"{name}.weight", rows, cols)
        if bias:
            self.bias(f"{name}.bias", rows)


def wordpiece_vocab(writer: gguf.GGUFWriter, source: Path) -> int:
    """bge's WordPiece vocabulary, with the special-token keys and flags the converter writes for a BERT
    tokenizer.json ([CLS] $A [SEP] / [CLS] $A [SEP] $B [SEP]: BOS and EOS added, no separate SEP)."""
    meta = GGUFFile(source).metadata
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    writer.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    writer.add_token_type_count(2)
    for add, value in (
        (writer.add_bos_token_id, 101),
        (writer.add_eos_token_id, 102),
        (writer.add_sep_token_id, 102),
    ):
        add(value)
    writer.add_unk_token_id(100)
    writer.add_pad_token_id(0)
    writer.add_mask_token_id(103)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)
    return len(meta["tokenizer.ggml.tokens"])


def gemma_vocab(writer: gguf.GGUFWriter, source: Path) -> int:
    """Gemma 3's SentencePiece vocabulary, adding BOS and EOS as EmbeddingGemma's files do."""
    meta = GGUFFile(source).metadata
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    writer.add_token_scores([float(s) for s in meta["tokenizer.ggml.scores"]])
    writer.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    for key in ("bos", "eos", "unknown", "padding"):
        getattr(writer, f"add_{'unk' if key == 'unknown' else 'pad' if key == 'padding' else key}_token_id")(
            int(meta[f"tokenizer.ggml.{key}_token_id"])
        )
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    return len(meta["tokenizer.ggml.tokens"])


def common(writer: gguf.GGUFWriter, n_layer: int, pooling: gguf.PoolingType, eps: float = 1e-12) -> None:
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(n_layer)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)


def bge_reranker(writer: gguf.GGUFWriter, vocab: Path) -> None:
    n_vocab = wordpiece_vocab(writer, vocab)
    common(writer, 2, gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["LABEL_0"])
    w = Weights(writer, 501, q8=True)
    w.matrix("token_embd.weight", n_vocab, N_EMBD, 1.0)
    w.matrix("position_embd.weight", 512, N_EMBD, 0.5, table=True)
    writer.add_tensor("token_types.weight", (0.5 * w.rng.standard_normal((2, N_EMBD))).astype(np.float32))
    w.norm("token_embd_norm", N_EMBD)
    for il in range(2):
        p = f"blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.linear(p + name, N_EMBD, N_EMBD)
        w.norm(p + "attn_output_norm", N_EMBD)
        w.linear(p + "ffn_up", N_FF, N_EMBD)
        w.linear(p + "ffn_down", N_EMBD, N_FF)
        w.norm(p + "layer_output_norm", N_EMBD)
    w.linear("cls", N_EMBD, N_EMBD)
    w.linear("cls.output", 1, N_EMBD)


def jina_bert_v2(writer: gguf.GGUFWriter, vocab: Path) -> None:
    n_vocab = wordpiece_vocab(writer, vocab)
    common(writer, 2, gguf.PoolingType.MEAN)
    w = Weights(writer, 502, q8=False)
    w.matrix("token_embd.weight", n_vocab, N_EMBD, 1.0)
    w.matrix("token_types.weight", 2, N_EMBD, 0.5)
    w.norm("token_embd_norm", N_EMBD)
    for il in range(2):
        p = f"blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.linear(p + name, N_EMBD, N_EMBD)
        w.norm(p + "attn_q_norm", N_EMBD)
        w.norm(p + "attn_k_norm", N_EMBD)
        w.norm(p + "attn_output_norm", N_EMBD)
        if il == 0:  # GEGLU: gate and up in one matrix
            w.linear(p + "ffn_up", 2 * N_FF, N_EMBD)
        else:
            w.norm(p + "attn_norm_2", N_EMBD)
            w.matrix(p + "ffn_gate.weight", N_FF, N_EMBD)
            w.linear(p + "ffn_up", N_FF, N_EMBD)
        w.linear(p + "ffn_down", N_EMBD, N_FF)
        w.norm(p + "layer_output_norm", N_EMBD)
    w.linear("cls", 1, N_EMBD)


def modern_bert(writer: gguf.GGUFWriter, vocab: Path) -> None:
    n_vocab = wordpiece_vocab(writer, vocab)
    common(writer, 4, gguf.PoolingType.MEAN, eps=1e-5)
    writer.add_rope_freq_base(160000.0)
    writer.add_rope_freq_base_swa(10000.0)
    writer.add_sliding_window(4)
    writer.add_classifier_output_labels(["relevant", "not"])
    w = Weights(writer, 503, q8=False)
    w.matrix("token_embd.weight", n_vocab, N_EMBD, 1.0)
    w.norm("token_embd_norm", N_EMBD, bias=False)
    for il in range(4):
        p = f"blk.{il}."
        if il:
            w.norm(p + "attn_norm", N_EMBD, bias=False)
        w.matrix(p + "attn_qkv.weight", 3 * N_EMBD, N_EMBD)
        w.matrix(p + "attn_output.weight", N_EMBD, N_EMBD)
        w.norm(p + "ffn_norm", N_EMBD, bias=False)
        w.matrix(p + "ffn_up.weight", 2 * N_FF, N_EMBD)
        w.matrix(p + "ffn_down.weight", N_EMBD, N_FF)
    w.norm("output_norm", N_EMBD, bias=False)
    w.matrix("cls.weight", N_EMBD, N_EMBD)
    w.norm("cls.norm", N_EMBD, bias=False)
    w.linear("cls.output", 2, N_EMBD)


def gemma_embedding(writer: gguf.GGUFWriter, vocab: Path) -> None:
    n_vocab = gemma_vocab(writer, vocab)
    head_dim, n_layer, dense = 32, 6, 128
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(n_layer)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_rope_freq_base_swa(10000.0)
    writer.add_sliding_window(8)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_causal_attention(False)
    writer.add_uint32("gemma-embedding.dense_2_feat_in", N_EMBD)
    writer.add_uint32("gemma-embedding.dense_2_feat_out", dense)
    writer.add_uint32("gemma-embedding.dense_3_feat_in", dense)
    writer.add_uint32("gemma-embedding.dense_3_feat_out", N_EMBD)
    w = Weights(writer, 504, q8=True)
    w.matrix("token_embd.weight", n_vocab, N_EMBD, 1.0)
    w.norm("output_norm", N_EMBD, bias=False)
    w.matrix("dense_2.weight", dense, N_EMBD)
    w.matrix("dense_3.weight", N_EMBD, dense)
    for il in range(n_layer):
        p = f"blk.{il}."
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w.norm(p + name, N_EMBD, bias=False)
        w.norm(p + "attn_q_norm", head_dim, bias=False)
        w.norm(p + "attn_k_norm", head_dim, bias=False)
        w.matrix(p + "attn_q.weight", 2 * head_dim, N_EMBD)
        w.matrix(p + "attn_k.weight", head_dim, N_EMBD)
        w.matrix(p + "attn_v.weight", head_dim, N_EMBD)
        w.matrix(p + "attn_output.weight", N_EMBD, 2 * head_dim)
        w.matrix(p + "ffn_gate.weight", N_FF, N_EMBD)
        w.matrix(p + "ffn_up.weight", N_FF, N_EMBD)
        w.matrix(p + "ffn_down.weight", N_EMBD, N_FF)


# name -> (architecture, writer of its keys and tensors, which vocabulary it reads)
FAMILIES: dict[str, tuple[str, Callable[[gguf.GGUFWriter, Path], None], str]] = {
    "bge-reranker": ("bert", bge_reranker, "wordpiece"),
    "jina-bert-v2": ("jina-bert-v2", jina_bert_v2, "wordpiece"),
    "modern-bert": ("modern-bert", modern_bert, "wordpiece"),
    "gemma-embedding": ("gemma-embedding", gemma_embedding, "gemma"),
}


def write_encoder(name: str, path: Path, vocabularies: dict[str, Path]) -> Path:
    """Write family `name` to `path`; `vocabularies`: "wordpiece" -> ggml-vocab-bert-bge.gguf, "gemma" ->
    Gemma 3's GGUF."""
    arch, body, vocab = FAMILIES[name]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"llamba-synthetic-{name}")
    body(writer, vocabularies[vocab])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def vocabularies() -> dict[str, Path]:
    from engine.model_files import resolve
    from engine.reference_data import reference_file

    return {"wordpiece": reference_file("models/ggml-vocab-bert-bge.gguf"), "gemma": resolve("gemma3")}


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        print(write_encoder(family, out_dir / f"{family}.gguf", vocabularies()))
