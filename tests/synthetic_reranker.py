"""A small synthetic reranker GGUF: Qwen3's architecture with a `cls.output` classifier, seeded weights.

No real reranker model is among Llamba's known models, so the rerank route is checked on this file
against llama.cpp (tests/golden/embeddings.json holds llama.cpp's scores for it, made by
scripts/make_embedding_goldens.py). Qwen3 is the causal architecture whose llama.cpp loader takes a
`cls.output` head (its Qwen3-Reranker GGUFs): pooling rank reads the last token's final hidden state,
projects it to the two labels ("yes", "no") and takes the softmax; the score is the first. The
vocabulary is SmolLM2's (copied from its GGUF), so real text tokenizes. The bytes depend only on the
seed and SmolLM2's file: `SHA256` pins them, so the test and the golden describe the same model.

    .venv/bin/python -m tests.synthetic_reranker OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

from engine.gguf import GGUFFile

SEED = 1234
N_EMBD, N_FF, N_LAYER, N_HEAD, N_KV_HEAD, HEAD_DIM = 64, 128, 2, 4, 2, 16
LABELS = ["yes", "no"]


def _tokenizer(writer: gguf.GGUFWriter, source: Path) -> None:
    meta = GGUFFile(source).metadata
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    writer.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    writer.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    writer.add_bos_token_id(int(meta["tokenizer.ggml.bos_token_id"]))
    writer.add_eos_token_id(int(meta["tokenizer.ggml.eos_token_id"]))
    writer.add_add_bos_token(True)  # a BOS first, as llama-server's rerank prompt puts one
    writer.add_add_eos_token(True)  # and EOS after the query and the document


def _hparams(writer: gguf.GGUFWriter, n_vocab: int) -> None:
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_KV_HEAD)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(n_vocab)
    writer.add_array("qwen3.classifier.output_labels", LABELS)


def _tensors(writer: gguf.GGUFWriter, n_vocab: int) -> None:
    rng = np.random.default_rng(SEED)

    def normal(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    writer.add_tensor("token_embd.weight", normal(n_vocab, N_EMBD, 1.0).astype(np.float16))
    writer.add_tensor("output_norm.weight", norm(N_EMBD))
    writer.add_tensor("cls.output.weight", normal(len(LABELS), N_EMBD, 0.5))
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_KV_HEAD * HEAD_DIM
    for il in range(N_LAYER):
        p = f"blk.{il}."
        writer.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        writer.add_tensor(p + "attn_q.weight", normal(q_dim, N_EMBD, N_EMBD**-0.5))
        writer.add_tensor(p + "attn_k.weight", normal(kv_dim, N_EMBD, N_EMBD**-0.5))
        writer.add_tensor(p + "attn_v.weight", normal(kv_dim, N_EMBD, N_EMBD**-0.5))
        writer.add_tensor(p + "attn_output.weight", normal(N_EMBD, q_dim, q_dim**-0.5))
        writer.add_tensor(p + "attn_q_norm.weight", norm(HEAD_DIM))
        writer.add_tensor(p + "attn_k_norm.weight", norm(HEAD_DIM))
        writer.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, N_EMBD, N_EMBD**-0.5))
        writer.add_tensor(p + "ffn_up.weight", normal(N_FF, N_EMBD, N_EMBD**-0.5))
        writer.add_tensor(p + "ffn_down.weight", normal(N_EMBD, N_FF, N_FF**-0.5))


def write_reranker(path: Path, tokenizer_source: Path) -> Path:
    """Write the synthetic reranker to `path` (its vocabulary from `tokenizer_source`, SmolLM2's GGUF)."""
    n_vocab = len(GGUFFile(tokenizer_source).metadata["tokenizer.ggml.tokens"])
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("llamba-synthetic-reranker")
    _hparams(writer, n_vocab)
    _tokenizer(writer, tokenizer_source)
    _tensors(writer, n_vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    from engine.model_files import resolve

    out = write_reranker(Path(sys.argv[1]), resolve("smollm2"))
    print(out)
