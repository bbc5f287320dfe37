"""The loaded model's media encoder: its projector (engine/media/, --mmproj) run on the engine thread,
where parallel kernels are entered from, and the last media's chunks kept by content hash, so a
follow-up turn about the same image is not encoded again (its cells are reused as well: the prompt
cache matches the image's marker ids)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engine.engine import Engine
from engine.media.chunks import MediaChunk, marker_of
from engine.media.preprocess import MediaError
from engine.text.tokenizer import Tokenizer
from server.http import errors

KEPT_MEDIA = 16  # chunks kept by hash (a Gemma 3 image: 256 x 2560 floats, 2.5 MiB)


class MediaEncoder:
    def __init__(self, projector: Any, engine: Engine, n_ubatch: int) -> None:
        self.projector = projector
        self.modalities: frozenset[str] = projector.modalities
        self.begin: str = projector.image_begin
        self.end: str = projector.image_end
        self._engine = engine
        self._n_ubatch = n_ubatch
        self._kept: OrderedDict[int, MediaChunk] = OrderedDict()

    async def chunk(self, data: bytes) -> MediaChunk:
        """The image's chunk: its embeddings, and how its tokens attend; a 400 for bytes that are no
        image, or an image whose tokens do not fit one batch (its tokens are decoded in one)."""
        marker = marker_of(data)
        if marker in self._kept:
            self._kept.move_to_end(marker)
            return self._kept[marker]
        try:
            future = self._engine.call(lambda: self.projector.encode_image(data))
            embeddings = await asyncio.wrap_future(future)
        except MediaError as exc:
            raise errors.invalid_request(f"Failed to load image or audio file: {exc}") from None
        chunk = MediaChunk(marker, embeddings, non_causal=self.projector.non_causal)
        if chunk.n_tokens > self._n_ubatch:
            raise errors.invalid_request(
                f"an image takes {chunk.n_tokens} tokens, more than the physical batch size"
                f" ({self._n_ubatch}): raise -ub"
            )
        self._kept[marker] = chunk
        while len(self._kept) > KEPT_MEDIA:
            self._kept.popitem(last=False)
        return chunk


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt's media (server/chat/media.py, /completion's multimodal_data): the marker its text holds
    where each medium goes, the media's chunks in order, and the text the projector puts around each
    (mtmd's img_beg / img_end)."""

    marker: str
    chunks: list[MediaChunk]
    begin: str = ""
    end: str = ""


Tokenize = Callable[[str, bool, bool], Awaitable[list[int]]]


async def media_tokens(tokenize: Tokenize, tokenizer: Tokenizer, text: str, media: MediaPrompt) -> list[int]:
    """mtmd's tokens of a prompt with media: the text split at the marker, each piece tokenized alone
    (special tokens parsed), each medium as its begin text, its marker id once per token and its end
    text; BOS first where the model adds one."""
    pieces = text.split(media.marker)
    if len(pieces) - 1 != len(media.chunks):
        raise errors.invalid_request(
            f"number of media markers in text ({len(pieces) - 1}) does not match number of media"
            f" ({len(media.chunks)})"
        )
    tokens = [tokenizer.bos_id] if tokenizer.add_bos else []
    for piece, chunk in zip(pieces, [*media.chunks, None], strict=True):
        tokens += await tokenize(piece, False, True)
        if chunk is not None:
            tokens += await tokenize(media.begin, False, True) if media.begin else []
            tokens += [chunk.marker] * chunk.n_tokens
            tokens += await tokenize(media.end, False, True) if media.end else []
    return tokens
