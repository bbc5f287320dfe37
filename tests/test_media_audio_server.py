"""Audio through a real server: the real SmolLM2-135M with a SYNTHETIC Ultravox projector
(tests/synthetic_audio_mmproj.py, "tiny", seed 2: a whisper encoder in clip.cpp's layout, random
weights, 150 tokens per 30 s window), talked to with the openai SDK and httpx: an `input_audio` part,
/completion's multimodal_data (sniffed as audio), an audio clip longer than one batch (causal: fed in
pieces), /props, and an image to this audio-only model refused."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server_process import ServerProcess
from tests.synthetic_audio_mmproj import wav_bytes, write_ultravox_mmproj

PER_WINDOW = 150  # the tiny projector's tokens per 30 s window
GREEDY = {"temperature": 0, "max_tokens": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    mmproj = write_ultravox_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-ultravox.gguf", "tiny", 2)
    # -ub 128: a 30 s window's 150 tokens do not fit one batch (a causal chunk is fed in pieces)
    proc = ServerProcess("-m", "smollm2", "--mmproj", str(mmproj), "-c", "4096", "-ub", "128").wait_healthy()
    yield proc
    proc.stop()


def audio_question(data: bytes, fmt: str = "wav") -> list[dict]:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
    return [{"role": "user", "content": [part, {"type": "text", "text": "What is said?"}]}]


def test_props_say_the_model_reads_audio(server: ServerProcess) -> None:
    props = httpx.get(server.base_url + "/props", timeout=30).json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": True}


def test_an_audio_question(server: ServerProcess) -> None:
    api = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    with_audio = api.chat.completions.create(
        model="any", messages=audio_question(wav_bytes("tone")), **GREEDY
    )  # type: ignore[arg-type]
    plain = api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "What is said?"}],
        **GREEDY,  # type: ignore[arg-type]
    )
    assert with_audio.usage is not None and plain.usage is not None
    assert with_audio.usage.prompt_tokens == plain.usage.prompt_tokens + PER_WINDOW  # no text around it
    long = api.chat.completions.create(model="any", messages=audio_question(wav_bytes("long")), **GREEDY)  # type: ignore[arg-type]
    assert long.usage is not None and long.usage.prompt_tokens == plain.usage.prompt_tokens + 2 * PER_WINDOW


def test_completion_multimodal_data_is_sniffed_as_audio(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        marker = http.get("/props").json()["media_marker"]
        data = base64.b64encode(wav_bytes("tone")).decode()
        reply = http.post(
            "/completion",
            json={
                "prompt": {"prompt_string": f"Listen: {marker}", "multimodal_data": [data]},
                "n_predict": 2,
            },
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens_evaluated"] > PER_WINDOW


def test_an_image_to_an_audio_model_is_refused(server: ServerProcess) -> None:
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]
    body = {"messages": [{"role": "user", "content": image}], **GREEDY}
    reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and "image input is not supported" in reply.json()["error"]["message"]
    body = {"messages": audio_question(b"not audio"), **GREEDY}
    bad = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert bad.status_code == 400 and "Failed to load image or audio file" in bad.json()["error"]["message"]
