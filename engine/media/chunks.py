"""A prompt's media chunks: what enters the model at an image's positions (mtmd's input chunks).

A prompt stays a list of token ids. The n positions of an image hold its marker: a negative id made
from the image's content hash, so a follow-up question about the same image matches the cached prefix
as llama-server's media chunks match by their hash. The request carries each marker's embeddings
(`MediaChunk`); a step's batch takes the rows its prompt chunk covers (`part_media`). A non-causal
chunk's run is never split across steps (`cut_before_media`): it must be whole, as mtmd decodes it in
one batch; a causal one may be fed in pieces, as mtmd splits it into batches. An image mtmd cuts into
several chunks (idefics3's tiles) is a `SlicedImage`: each chunk its own marker, text between them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MediaChunk:
    """One medium's embeddings and how its tokens attend (Gemma 3's images: to each other, both ways)."""

    marker: int  # the negative id its positions hold in the prompt
    embeddings: np.ndarray  # float32 [n_tokens, n_embd]: the model's input rows at its positions
    non_causal: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])


@dataclass(frozen=True)
class TokenText:
    """Text mtmd puts between a medium's chunks as one token: the first of the vocabulary whose text it is
    (mtmd's lookup_token), not the text tokenized."""

    text: str


@dataclass(frozen=True)
class SlicedImage:
    """An image mtmd encodes as several chunks with text between them (idefics3's tiles and overview),
    in prompt order: text to tokenize (special tokens parsed), a `TokenText`, or a chunk's float32
    [n_tokens, n_embd] rows."""

    pieces: tuple[str | TokenText | np.ndarray, ...]

    @property
    def embeddings(self) -> list[np.ndarray]:
        return [p for p in self.pieces if not isinstance(p, str | TokenText)]


def marker_of(content: bytes, index: int = 0) -> int:
    """A negative int32 id from the content's hash (the same image, the same id, in any request); chunk
    `index` > 0 of one medium (a tile) hashes the index too, so each chunk's run has its own id."""
    digest = hashlib.sha256(
        content if index == 0 else content + b"\0chunk" + index.to_bytes(4, "little")
    ).digest()
    return -1 - (int.from_bytes(digest[:4], "little") & 0x7FFFFFFF)


def is_marker(token: int) -> bool:
    return token < 0


def cut_before_media(tokens: Sequence[int], n: int, media: Mapping[int, MediaChunk] | None = None) -> int:
    """`n`, or less so that the first `n` tokens do not end inside a marker run; with `media`, only
    inside a non-causal chunk's run (a causal chunk may be fed in pieces, as mtmd splits one into
    batches)."""
    if n <= 0 or n >= len(tokens):
        return max(0, min(n, len(tokens)))
    marker = tokens[n]
    if media is not None and is_marker(marker) and not media[marker].non_causal:
        return n
    while n > 0 and is_marker(marker) and tokens[n - 1] == marker:
        n -= 1
    return n


def _run_before(before: Sequence[int], marker: int) -> int:
    """How many of the tokens just before a part hold `marker` (a chunk fed in pieces continues)."""
    n = 0
    while n < len(before) and before[len(before) - 1 - n] == marker:
        n += 1
    return n


@dataclass(frozen=True)
class PartMedia:
    """The media rows of one batch part: which rows, their embeddings, and each row's last visible
    position (its own, or its non-causal chunk's last)."""

    rows: np.ndarray  # int32 [m]: rows of the part
    embeddings: np.ndarray  # float32 [m, n_embd]
    limits: np.ndarray  # int32 [n]: for every row of the part


def part_media(
    tokens: Sequence[int], start: int, media: Mapping[int, MediaChunk], before: Sequence[int] = ()
) -> PartMedia | None:
    """The media rows of a part whose tokens sit at positions start.. after `before` (None: it has
    none). A run of one marker holds its chunk's rows in order (again from the first row where the same
    medium repeats); a run that opens the part continues the one `before` ends with."""
    if not media:
        return None
    ids = np.asarray(tokens, dtype=np.int64)
    rows = np.flatnonzero(ids < 0)
    if len(rows) == 0:
        return None
    limits = np.arange(start, start + len(ids), dtype=np.int32)
    pieces = []
    i = 0
    while i < len(rows):
        chunk = media[int(ids[rows[i]])]
        j = i
        while j < len(rows) and rows[j] == rows[i] + (j - i) and ids[rows[j]] == chunk.marker:
            j += 1
        run = rows[i:j]
        first = _run_before(before, chunk.marker) if run[0] == 0 else 0
        pieces.append(chunk.embeddings[(first + np.arange(len(run))) % chunk.n_tokens])
        if chunk.non_causal:
            limits[run] = start + run[-1]
        i = j
    return PartMedia(rows.astype(np.int32), np.concatenate(pieces).astype(np.float32), limits)
