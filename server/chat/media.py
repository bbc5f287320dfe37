"""A chat's media parts as llama-server reads them (server-common.cpp, oaicompat_content_load_media).

Each `image_url`, `input_audio` or `input_video` (`video_url`) part's bytes are loaded and the part is
replaced by a `media_marker` text part holding the server's media marker; the template renders the
marker where the medium was, and the prompt builder splits the rendered prompt there (mtmd's rule).
A medium the model cannot read is a 400 in llama-server's words; a URL that cannot be read is a 400
naming what is wrong with it.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import httpx2

from server.config.settings import Settings
from server.http import errors
from server.mcp.egress import HostPolicy
from server.mcp.guard import EgressRecord, guarded_client
from server.model.prompts import ChatInput

# llama-server's media marker: LLAMA_MEDIA_MARKER, else a random one per process (clients read it from
# /props to place media in /completion prompts).
MEDIA_MARKER = os.environ.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_hex(16)}__>"
# A part's type -> (its medium, the key holding its URL object)
MEDIA_PARTS = {
    "image_url": ("image", "image_url"),
    "input_audio": ("audio", "input_audio"),
    "input_video": ("video", "input_video"),
    "video_url": ("video", "video_url"),
}
MAX_MEDIA_BYTES = 20 * 2**20  # one medium's bytes, decoded (llama-server caps a download at 10 MB)
MAX_DOWNLOAD_BYTES = 10 * 2**20
DOWNLOAD_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MediaFile:
    kind: str  # image | audio | video
    data: bytes


@dataclass(frozen=True)
class MediaSources:
    """Where a medium's bytes may come from besides the request: files under --media-path, and the
    hosts --mcp-allow-hosts allows (the remote MCP servers' egress guard, server/mcp/egress.py)."""

    media_path: str | None = None
    hosts: HostPolicy = HostPolicy()


def media_sources(settings: Settings) -> MediaSources:
    return MediaSources(settings.media_path, HostPolicy.parse(settings.mcp_allow_hosts))


async def take_media(
    chat: ChatInput, modalities: frozenset[str], sources: MediaSources
) -> tuple[ChatInput, list[MediaFile]]:
    """The chat with each media part replaced by the marker, and the media's bytes in prompt order."""
    files: list[MediaFile] = []
    messages = [await _message_media(m, modalities, sources, files) for m in chat.messages]
    return (replace(chat, messages=messages) if files else chat), files


async def content_media(
    parts: list[dict[str, Any]], modalities: frozenset[str], sources: MediaSources
) -> tuple[str, list[MediaFile]]:
    """An embedding input's content parts as llama-server's tokenize_oai_content_array reads them: the
    texts joined with the marker where each medium was, and the media's bytes in order."""
    files: list[MediaFile] = []
    message = await _message_media({"content": parts}, modalities, sources, files)
    return "".join(part.get("text", "") for part in message["content"]), files


async def _message_media(
    message: dict[str, Any], modalities: frozenset[str], sources: MediaSources, files: list[MediaFile]
) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        kind_key = MEDIA_PARTS.get(part.get("type")) if isinstance(part, dict) else None
        if kind_key is None:
            parts.append(part)
            continue
        kind, key = kind_key
        if kind not in modalities:
            hint = "hint: if this is unexpected, you may need to provide the mmproj"
            raise errors.invalid_request(f"{kind} input is not supported - {hint}")
        url = _url_of(part.get(key))
        remote = url.startswith(("http://", "https://"))
        data = await fetch_media(url, sources.hosts) if remote else load_media(url, sources.media_path)
        files.append(MediaFile(kind, data))
        parts.append({"type": "media_marker", "text": MEDIA_MARKER})
    return {**message, "content": parts}


async def fetch_media(url: str, hosts: HostPolicy) -> bytes:
    """An http(s) medium, fetched only from a host --mcp-allow-hosts allows, each request (redirects
    too) through the egress guard; llama-server's limits: 10 MB, 10 s."""
    if not hosts.enabled:
        raise errors.invalid_request(
            "remote media URLs are fetched only from hosts --mcp-allow-hosts allows: send a data: URL"
        )
    record = EgressRecord()
    client = guarded_client(hosts, record, {}, DOWNLOAD_TIMEOUT_S)
    try:
        async with client, client.stream("GET", url, follow_redirects=True) as reply:
            if not 200 <= reply.status_code < 300:
                raise errors.invalid_request(f"Failed to download image: HTTP {reply.status_code}")
            data = bytearray()
            async for piece in reply.aiter_bytes():
                data += piece
                if len(data) > MAX_DOWNLOAD_BYTES:
                    raise errors.invalid_request("Failed to download image: larger than 10 MB")
    except httpx2.HTTPError as exc:
        why = record.refused or str(exc) or type(exc).__name__
        raise errors.invalid_request(f"Failed to download image: {why}") from None
    return bytes(data)


def _url_of(value: Any) -> str:
    """A part's URL: {"url": ...} (image_url), {"data": ...} (input_audio), or the string itself."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        url = value.get("data", value.get("url"))
        if isinstance(url, str):
            return url
    raise errors.invalid_request("a media part needs its data: a 'url' (or input_audio's 'data') string")


def load_media(url: str, media_path: str | None) -> bytes:
    """A medium's bytes from a data: URL, a file:// URL under --media-path, or raw base64 (llama-server's
    forms; http(s) URLs: fetch_media)."""
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep:
            raise errors.invalid_request("Invalid uri-encoded base64 value")
        if not head.startswith(("data:image/", "data:audio/", "data:video/")):
            raise errors.invalid_request(f"Invalid uri format: {head}")
        if not head.endswith("base64"):
            raise errors.invalid_request("uri must be base64 encoded")
        return _base64(payload)
    if url.startswith("file://"):
        return _local_file(url[len("file://") :], media_path)
    return _base64(url)


def _base64(text: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError):
        data = b""
    if not data:
        raise errors.invalid_request("Invalid base64 value")
    if len(data) > MAX_MEDIA_BYTES:
        raise errors.invalid_request(f"a medium is larger than {MAX_MEDIA_BYTES // 2**20} MiB")
    return data


def _local_file(name: str, media_path: str | None) -> bytes:
    if not media_path:
        raise errors.invalid_request("file:// URLs are not allowed unless --media-path is specified")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or not name:
        raise errors.invalid_request(f"file path is not allowed: {name}")
    path = Path(media_path) / relative
    try:
        if path.stat().st_size > MAX_MEDIA_BYTES:
            raise errors.invalid_request(f"a medium is larger than {MAX_MEDIA_BYTES // 2**20} MiB")
        return path.read_bytes()
    except OSError:
        raise errors.invalid_request(f"file does not exist or cannot be opened: {name}") from None
