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

import numpy as np

from engine.engine import Engine
from engine.media.chunks import MediaChunk, SlicedImage, TokenText, marker_of
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
    """One medium of a prompt as mtmd tokenizes it, in order: text to tokenize (the projector's img_beg /
    img_end, aud_beg / aud_end, idefics3's tile labels), token ids (mtmd's lookup_token) and chunks
    (one, or idefics3's tiles and overview)."""

    pieces: tuple[str | int | MediaChunk, ...]

    @property
    def chunks(self) -> list[MediaChunk]:
        return [p for p in self.pieces if isinstance(p, MediaChunk)]


def vocab_lookups(tokenizer: Tokenizer, texts: tuple[str, ...]) -> dict[str, int]:
    """mtmd's lookup_token for each text: the first id whose piece (special tokens rendered) is that text;
    a ValueError naming one the vocabulary lacks (mtmd would feed LLAMA_TOKEN_NULL)."""
    wanted = {text.encode(): text for text in texts}
    found: dict[str, int] = {}
    for token in range(tokenizer.n_vocab) if wanted else ():
        text = wanted.get(tokenizer.token_to_piece(token))
        if text is not None and text not in found:
            found[text] = token
    missing = [text for text in texts if text not in found]
    if missing:
        raise ValueError(
            f"--mmproj: the text model's vocabulary has no token {missing[0]!r}, which the projector needs"
        )
    return found


class MediaEncoder:
    def __init__(
        self, projector: Any, engine: Engine, n_ubatch: int, lookups: dict[str, int] | None = None
    ) -> None:
        """`lookups`: vocab_lookups of the projector's lookup_texts (a projector that puts tokens between
        its chunks)."""
        self.projector = projector
        self.modalities: frozenset[str] = projector.modalities
        self._engine = engine
        self._n_ubatch = n_ubatch
        self._lookups = lookups or {}
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
            encoded = await asyncio.wrap_future(self._engine.call(lambda: encode(data)))
        except MediaError as exc:
            raise errors.invalid_request(f"Failed to load image or audio file: {exc}") from None
        if isinstance(encoded, SlicedImage):
            medium = Medium(tuple(self._pieces(kind, data, encoded)))
        else:
            prefix = "audio" if kind == "audio" else "image"
            begin, end = (
                getattr(self.projector, f"{prefix}_begin", ""),
                getattr(self.projector, f"{prefix}_end", ""),
            )
            chunk = self._chunk(kind, marker, encoded)
            medium = Medium((*([begin] if begin else []), chunk, *([end] if end else [])))
        self._kept[marker] = medium
        while len(self._kept) > KEPT_MEDIA:
            self._kept.popitem(last=False)
        return medium

    def _chunk(self, kind: str, marker: int, embeddings: np.ndarray) -> MediaChunk:
        chunk = MediaChunk(marker, embeddings, non_causal=self.projector.non_causal)
        if chunk.non_causal and chunk.n_tokens > self._n_ubatch:  # a causal one is fed in pieces
            raise errors.invalid_request(
                f"an {kind} takes {chunk.n_tokens} tokens, more than the physical batch size"
                f" ({self._n_ubatch}): raise -ub"
            )
        return chunk

    def _pieces(self, kind: str, data: bytes, image: SlicedImage) -> list[str | int | MediaChunk]:
        """A sliced image's pieces: each chunk under its own marker (the image's hash and its place),
        each TokenText as its looked-up id."""
        pieces: list[str | int | MediaChunk] = []
        for piece in image.pieces:
            if isinstance(piece, TokenText):
                pieces.append(self._lookups[piece.text])
            elif isinstance(piece, str):
                pieces.append(piece)
            else:
                pieces.append(self._chunk(kind, marker_of(data, len(pieces)), piece))
        return pieces


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt's media (server/chat/media.py, /completion's multimodal_data): the marker its text holds
    where each medium goes, and the media in order."""

    marker: str
    media: list[Medium]

    @property
    def chunks(self) -> list[MediaChunk]:
        return [c for m in self.media for c in m.chunks]


Tokenize = Callable[[str, bool, bool], Awaitable[list[int]]]


async def media_tokens(tokenize: Tokenize, tokenizer: Tokenizer, text: str, media: MediaPrompt) -> list[int]:
    """mtmd's tokens of a prompt with media: the text split at the marker, each piece tokenized alone
    (special tokens parsed), each medium as its pieces (texts tokenized alike, ids, each chunk's marker
    id once per token); BOS first where the model adds one."""
    pieces = text.split(media.marker)
    if len(pieces) - 1 != len(media.media):
        raise errors.invalid_request(
            f"number of media markers in text ({len(pieces) - 1}) does not match number of media"
            f" ({len(media.media)})"
        )
    tokens = [tokenizer.bos_id] if tokenizer.add_bos else []
    for piece, medium in zip(pieces, [*media.media, None], strict=True):
        tokens += await tokenize(piece, False, True)
        for part in medium.pieces if medium is not None else ():
            if isinstance(part, MediaChunk):
                tokens += [part.marker] * part.n_tokens
            elif isinstance(part, int):
                tokens.append(part)
            else:
                tokens += await tokenize(part, False, True)
    return tokens
