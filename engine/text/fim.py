"""Fill-in-the-middle: a model's FIM tokens (GGUF metadata, else found by their text as llama.cpp
finds them) and llama-server's /infill prompt layout (repo-level chunks, prefix, suffix, middle)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The texts llama.cpp recognises for each FIM role when the GGUF does not name the token's id.
_TEXTS: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
            "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
            "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
            "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}  # fmt: skip
# Older GGUFs name the first three under these keys.
_LEGACY_KEYS = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
ROLE_NAMES = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
# llama-server's separator between extra chunks when the model has no file-separator token.
_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    rep: int | None = None  # the repository-name token of repo-level FIM
    sep: int | None = None  # the file separator

    @classmethod
    def from_vocab(cls, meta: Mapping[str, Any], token_to_id: Mapping[str, int]) -> FimTokens:
        ids: dict[str, int | None] = {}
        n_vocab = len(token_to_id)
        for role, texts in _TEXTS.items():
            keys = [f"tokenizer.ggml.fim_{role}_token_id"]
            if role in _LEGACY_KEYS:
                keys.append(f"tokenizer.ggml.{_LEGACY_KEYS[role]}_token_id")
            found = next((int(meta[k]) for k in keys if k in meta and 0 <= int(meta[k]) < n_vocab), None)
            if found is None:
                found = next((token_to_id[t] for t in texts if t in token_to_id), None)
            ids[role] = found
        return cls(**ids)

    def missing(self) -> list[str]:
        """The roles /infill needs that the model lacks: prefix, suffix, middle."""
        return [name for role, name in ROLE_NAMES.items() if getattr(self, role) is None]


@dataclass(frozen=True)
class ExtraChunk:
    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class InfillLimits:
    """What bounds the prompt's parts, as llama-server counts them: its batch size, the server's
    n_predict and one slot's context."""

    n_batch: int
    n_predict: int
    n_ctx: int


def infill_tokens(
    fim: FimTokens,
    encode: Callable[[str], list[int]],
    prefix: list[int],
    suffix: list[int],
    extra: Sequence[ExtraChunk],
    prompt: list[int],
    limits: InfillLimits,
    bos: int | None,
) -> list[int]:
    """llama-server's infill prompt: [rep]myproject, per chunk [sep]filename + text, [sep]filename,
    then BOS (when the model adds one), [pre] prefix + prompt, [suf] suffix, [mid]. The prefix keeps
    its last 3/4 of a batch, the suffix its first quarter less the prompt, and the extra chunks their
    tail up to the context left after a batch and twice n_predict."""
    assert fim.pre is not None and fim.suf is not None and fim.mid is not None
    head: list[int] = []
    if fim.rep is not None:
        head += [fim.rep, *encode("myproject\n")]
    for chunk in extra:
        head += [fim.sep, *encode(chunk.filename + "\n")] if fim.sep is not None else encode(_CHUNK_SEPARATOR)
        head += encode(chunk.text)
    if fim.sep is not None:
        head += [fim.sep, *encode("filename\n")]
    n_prefix = min(len(prefix), 3 * (limits.n_batch // 4))
    n_suffix = min(len(suffix), max(0, limits.n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, limits.n_ctx - limits.n_batch - 2 * limits.n_predict), len(head))
    body = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
    if bos is not None:
        body.insert(0, bos)
    return [*head[len(head) - n_extra :], *body, fim.suf, *suffix[:n_suffix], fim.mid]
