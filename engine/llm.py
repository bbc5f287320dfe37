"""A loaded model: GGUF file, tokenizer, weights on a backend. What the CLIs and the server engine share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from engine.api import ModelInfo
from engine.backend import Backend, select_backend
from engine.batch import Batch, BatchPart
from engine.ftype import ftype_name
from engine.gguf import GGUFFile
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes, KVCache
from engine.model_files import resolve
from engine.models import Model, load_model
from engine.models.encoder import EncoderModel
from engine.text.tokenizer import Tokenizer

log = structlog.get_logger("engine")


def lock_weights(net: Model) -> None:
    """`-lm mlock`: lock the packed weights; a refusal is a warning (as llama.cpp's), not an error."""
    result = net.backend.lock_weights(net.packed_weights())
    if result is None:
        log.warning("mlock_skipped", reason="the weights are not in host memory", backend=net.backend.name)
    elif result.error is not None:
        log.warning("mlock_failed", error=result.error, locked_mib=result.locked_bytes >> 20)
    else:
        log.info("mlock", locked_mib=result.locked_bytes >> 20)


@dataclass
class LLM:
    path: Path
    gguf: GGUFFile
    backend: Backend
    model: Model
    tokenizer: Tokenizer
    load_seconds: float

    @classmethod
    def load(
        cls,
        model: str | None = None,
        device: str = "cpu",
        n_threads: int | None = None,
        mlock: bool = False,
        progress: Callable[[str, float], None] | None = None,
    ) -> LLM:
        """`model` is a known model name (see engine.model_files), a GGUF path, or None for the default.
        `mlock` locks the packed weights in RAM (host weights only; a GPU's are on the device).
        `progress(stage, fraction)` hears the stages: `read` (the GGUF's metadata and tensor index),
        `repack` (after each layer's weights are packed for the kernels)."""
        report = progress or (lambda stage, value: None)
        start = time.perf_counter()
        path = resolve(model)
        report("read", 0.0)
        g = GGUFFile(path)
        # The tokenizer first: a vocabulary Llamba cannot tokenize (an unknown pre-tokenizer) fails the load
        # before minutes of weight packing, not after.
        tokenizer = Tokenizer.from_gguf(g)
        backend = select_backend(device, n_threads)
        report("repack", 0.0)
        net = load_model(g, backend, lambda done, total: report("repack", done / total))
        if mlock:
            lock_weights(net)
        return cls(path, g, backend, net, tokenizer, time.perf_counter() - start)

    @property
    def description(self) -> str:
        """llama-bench's model column: '<arch> <size> <file type>'."""
        return f"{self.model.hp.arch} {self.gguf.metadata.get('general.size_label', '?')} {self.file_type}"

    @property
    def file_type(self) -> str:
        names = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 15: "Q4_K - Medium"}
        return names.get(int(self.gguf.metadata.get("general.file_type", -1)), "unknown")

    def info(self) -> ModelInfo:
        meta = self.gguf.metadata
        hp = self.model.hp
        return ModelInfo(
            path=self.path,
            name=self.model.name,
            arch=hp.arch,
            # llama.cpp's vocabulary types: 1 SentencePiece, 2 byte-level BPE, 3 WordPiece
            vocab_type={"gpt2": 2, "bert": 3}.get(str(meta.get("tokenizer.ggml.model")), 1),
            n_vocab=hp.n_vocab,
            n_ctx_train=hp.n_ctx_train,
            n_embd=hp.n_embd,
            n_params=self.model.n_params,
            size=self.model.n_bytes,
            backend=self.backend.name,
            chat_template=str(meta.get("tokenizer.chat_template", "")),
            n_cls_out=self.model.rank_head.n_out if self.model.rank_head is not None else 0,
            ftype=ftype_name(meta, ((t.name, t.ggml_type) for t in self.gguf.tensors.values())),
            bos_token=self._token_text(self.tokenizer.bos_id),
            eos_token=self._token_text(self.tokenizer.eos_id),
            generates=not isinstance(self.model, EncoderModel),
        )

    def _token_text(self, token: int) -> str:
        """A special token's text as llama.cpp shows it (rendered); "" for none (-1)."""
        return self.tokenizer.decode([token]) if token >= 0 else ""

    def new_cache(self, n_seq: int, n_ctx: int, types: CacheTypes = DEFAULT_CACHE_TYPES) -> KVCache:
        return self.model.new_cache(n_seq, n_ctx, types)

    def prefill(self, kv: KVCache, seq_id: int, tokens: list[int], n_batch: int = 512) -> np.ndarray:
        """Run `tokens` after what `seq_id` already holds, in chunks of n_batch; the last token's logits."""
        start = int(kv.lengths[seq_id])
        logits = np.empty(0, dtype=np.float32)
        for i in range(0, len(tokens), n_batch):
            chunk = tokens[i : i + n_batch]
            logits = self.model.forward(Batch.of([BatchPart(seq_id, start + i, chunk)]), kv)[0]
        return logits

    def generate_greedy(self, prompts: list[list[int]], n_predict: int, n_ctx: int = 1024) -> list[list[int]]:
        """Greedy continuations of several prompts, decoded together one batch per step."""
        kv = self.new_cache(len(prompts), n_ctx)
        last = [int(np.argmax(self.prefill(kv, s, p))) for s, p in enumerate(prompts)]
        outputs = [[t] for t in last]
        for _ in range(n_predict - 1):
            parts = [BatchPart(s, int(kv.lengths[s]), [outputs[s][-1]]) for s in range(len(prompts))]
            logits = self.model.forward(Batch.of(parts), kv)
            for s, row in enumerate(logits):
                outputs[s].append(int(np.argmax(row)))
        return outputs
