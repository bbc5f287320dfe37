"""The loaded model's media encoder: its projector (engine/media/, --mmproj) run on the engine thread,
where parallel kernels are entered from, and the last media kept by content hash, so a follow-up turn
about the same image is not encoded again (its cells are reused as well: the prompt cache matches the
image's marker ids); a prompt's media as mtmd tokenizes them."""

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


# What a medium's bytes start with when they are audio (WAV, MP3 with or without its ID3 tag, FLAC,
# Ogg): /completion's multimodal_data does not say which it is, so it is sniffed as mtmd sniffs it.
AUDIO_MAGIC = (b"RIFF", b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2", b"fLaC", b"OggS")


def sniff_kind(data: bytes) -> str:
    return "audio" if data.startswith(AUDIO_MAGIC) else "image"


@dataclass(frozen=True)
class Medium:
    """One medium of a prompt: its chunk, and the text the projector puts before and after it (mtmd's
    img_beg / img_end, aud_beg / aud_end; often none)."""

    chunk: MediaChunk
    begin: str = ""
    end: str = ""


class MediaEncoder:
    def __init__(self, projector: Any, engine: Engine, n_ubatch: int) -> None:
        self.projector = projector
        self.modalities: frozenset[str] = projector.modalities
        self._engine = engine
        self._n_ubatch = n_ubatch
        self._kept: OrderedDict[int, Medium] = OrderedDict()

    async def medium(self, kind: str, data: bytes) -> Medium:
        """The medium's chunk (its embeddings, how its tokens attend) and its marks; a 400 for bytes that
        are no such medium, or a medium whose tokens do not fit one batch (they are decoded in one)."""
        marker = marker_of(data)
        if marker in self._kept:
            self._kept.move_to_end(marker)
            return self._kept[marker]
        if kind not in self.modalities:
            hint = "hint: if this is unexpected, you may need to provide the mmproj"
            raise errors.invalid_request(f"{kind} input is not supported - {hint}")
        encode = self.projector.encode_audio if kind == "audio" else self.projector.encode_image
        try:
            embeddings = await asyncio.wrap_future(self._engine.call(lambda: encode(data)))
        except MediaError as exc:
            raise errors.invalid_request(f"Failed to load image or audio file: {exc}") from None
        chunk = MediaChunk(marker, embeddings, non_causal=self.projector.non_causal)
        if chunk.non_causal and chunk.n_tokens > self._n_ubatch:  # a causal one is fed in pieces
            raise errors.invalid_request(
                f"an {kind} takes {chunk.n_tokens} tokens, more than the physical batch size"
                f" ({self._n_ubatch}): raise -ub"
            )
        prefix = "audio" if kind == "audio" else "image"
        begin, end = (
            getattr(self.projector, f"{prefix}_begin", ""),
            getattr(self.projector, f"{prefix}_end", ""),
        )
        self._kept[marker] = medium = Medium(chunk, begin, end)
        while len(self._kept) > KEPT_MEDIA:
            self._kept.popitem(last=False)
        return medium


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt's media (server/chat/media.py, /completion's multimodal_data): the marker its text holds
    where each medium goes, and the media in order."""

    marker: str
    media: list[Medium]

    @property
    def chunks(self) -> list[MediaChunk]:
        return [m.chunk for m in self.media]


Tokenize = Callable[[str, bool, bool], Awaitable[list[int]]]


async def media_tokens(tokenize: Tokenize, tokenizer: Tokenizer, text: str, media: MediaPrompt) -> list[int]:
    """mtmd's tokens of a prompt with media: the text split at the marker, each piece tokenized alone
    (special tokens parsed), each medium as its begin text, its marker id once per token and its end
    text; BOS first where the model adds one."""
    pieces = text.split(media.marker)
    if len(pieces) - 1 != len(media.media):
        raise errors.invalid_request(
            f"number of media markers in text ({len(pieces) - 1}) does not match number of media"
            f" ({len(media.media)})"
        )
    tokens = [tokenizer.bos_id] if tokenizer.add_bos else []
    for piece, medium in zip(pieces, [*media.media, None], strict=True):
        tokens += await tokenize(piece, False, True)
        if medium is not None:
            tokens += await tokenize(medium.begin, False, True) if medium.begin else []
            tokens += [medium.chunk.marker] * medium.chunk.n_tokens
            tokens += await tokenize(medium.end, False, True) if medium.end else []
    return tokens
