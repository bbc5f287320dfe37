"""Images through a real server: the real Gemma 3 270M with a SYNTHETIC Gemma 3 projector
(tests/synthetic_mmproj.py, "tiny": 16 image tokens, random weights in clip.cpp's layout), talked to
with the openai and anthropic SDKs and httpx. An image question whole and streamed, two images in one
message, a follow-up that reuses the cached image prefix, Anthropic image blocks and Responses
input_image parts, file:// under --media-path, and bad media: a 400 and the server keeps serving."""

from __future__ import annotations

import base64
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from engine.reference_data import ReferenceDataError, reference_file
from tests.conftest import require
from tests.server_process import ServerProcess
from tests.synthetic_mmproj import write_gemma3_mmproj

N_IMAGE = 16  # the tiny projector's tokens per image
GREEDY = {"temperature": 0, "max_tokens": 8}


def data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    try:
        jpeg = reference_file("tools/mtmd/test-1.jpeg")
    except ReferenceDataError as exc:
        require(f"llama.cpp's reference files could not be fetched: {exc}")
    png = tmp_path_factory.mktemp("images") / "gradient.png"
    y, x = np.mgrid[0:48, 0:64]
    Image.fromarray(np.stack([x * 4, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)).save(png)
    return {"jpeg": jpeg, "png": png}


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory, images: dict[str, Path]) -> Path:
    folder = tmp_path_factory.mktemp("media")
    (folder / "gradient.png").write_bytes(images["png"].read_bytes())
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, media_dir: Path) -> Iterator[ServerProcess]:
    mmproj = write_gemma3_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny.gguf", "tiny")
    args = ("-m", "gemma3", "--mmproj", str(mmproj), "-np", "2", "-c", "4096", "--media-path", str(media_dir))
    args += ("--mcp-allow-hosts", "127.0.0.1")  # http(s) media: only from the loopback the tests serve
    proc = ServerProcess(*args).wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def image_question(url: str, question: str = "What is in this image?") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}],
        }
    ]


def test_props_and_models_say_the_model_reads_images(server: ServerProcess) -> None:
    assert httpx.get(server.base_url + "/props").json()["modalities"] == {
        "vision": True,
        "video": False,
        "audio": False,
    }
    models = httpx.get(server.base_url + "/v1/models").json()
    assert models["models"][0]["capabilities"] == ["completion", "multimodal"]


def test_an_image_question_whole_and_streamed(api: openai.OpenAI, images: dict[str, Path]) -> None:
    messages = image_question(data_url(images["jpeg"], "image/jpeg"))
    whole = api.chat.completions.create(model="any", messages=messages, **GREEDY)  # type: ignore[arg-type]
    plain = [{"role": "user", "content": "What is in this image?"}]
    text = api.chat.completions.create(model="any", messages=plain, **GREEDY)  # type: ignore[arg-type]
    assert whole.usage is not None and text.usage is not None
    # the image's 16 tokens and its <start_of_image> <end_of_image> around them
    assert whole.usage.prompt_tokens == text.usage.prompt_tokens + N_IMAGE + 2
    pieces = api.chat.completions.create(model="any", messages=messages, stream=True, **GREEDY)  # type: ignore[arg-type]
    streamed = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert whole.choices[0].message.content == streamed and streamed


def test_two_images_in_one_message(api: openai.OpenAI, images: dict[str, Path]) -> None:
    content = [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": data_url(images["jpeg"], "image/jpeg")}},
        {"type": "text", "text": "with"},
        {"type": "image_url", "image_url": {"url": data_url(images["png"], "image/png")}},
    ]
    reply = api.chat.completions.create(
        model="any", messages=[{"role": "user", "content": content}], **GREEDY
    )  # type: ignore[arg-type,list-item]
    alone = api.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Compare\nwith"}], **GREEDY
    )
    assert reply.usage is not None and alone.usage is not None
    assert reply.usage.prompt_tokens >= alone.usage.prompt_tokens + 2 * (N_IMAGE + 2) - 2


def test_a_follow_up_reuses_the_cached_image(server: ServerProcess, images: dict[str, Path]) -> None:
    first_turn = image_question(data_url(images["png"], "image/png"), "Describe it.")
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        first = http.post(
            "/v1/chat/completions", json={"messages": first_turn, "id_slot": 1, **GREEDY}
        ).json()
        answer = first["choices"][0]["message"]["content"]
        follow = first_turn + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And?"}]
        second = http.post("/v1/chat/completions", json={"messages": follow, "id_slot": 1, **GREEDY}).json()
    n_first = first["usage"]["prompt_tokens"]
    # everything up to the first turn's answer comes from the slot's cells: the image is not run again
    assert second["timings"]["cache_n"] >= n_first - 1
    assert second["timings"]["prompt_n"] < second["usage"]["prompt_tokens"] - n_first + 8


def test_anthropic_image_blocks(server: ServerProcess, images: dict[str, Path]) -> None:
    api = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0)
    source = {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(images["png"].read_bytes()).decode(),
    }
    reply = api.messages.create(
        model="any",
        max_tokens=8,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}],
            }
        ],  # type: ignore[typeddict-item,list-item]
    )
    read = reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)  # Anthropic's split
    assert read > N_IMAGE and reply.content


def test_responses_input_image(api: openai.OpenAI, images: dict[str, Path]) -> None:
    part = {"type": "input_image", "image_url": data_url(images["png"], "image/png")}
    reply = api.responses.create(
        model="any",
        input=[{"role": "user", "content": [part, {"type": "input_text", "text": "What is this?"}]}],  # type: ignore[list-item]
        max_output_tokens=4,
    )
    assert reply.usage is not None and reply.usage.input_tokens > N_IMAGE


def test_file_urls_under_media_path(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        ok = http.post(
            "/v1/chat/completions", json={"messages": image_question("file://gradient.png"), **GREEDY}
        )
        outside = http.post(
            "/v1/chat/completions", json={"messages": image_question("file://../x.png"), **GREEDY}
        )
    assert ok.status_code == 200, ok.text
    assert outside.status_code == 400 and "not allowed" in outside.json()["error"]["message"]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png;base64,AAAA", "Failed to load image"),
        ("data:image/png;base64,", "Invalid base64"),
        ("data:text/plain;base64,aGk=", "Invalid uri format"),
        ("http://127.0.0.1:9/x.png", "Failed to download image"),  # allowed, nothing listens
        ("http://10.255.255.1/x.png", "not among the hosts allowed"),  # a private address not listed
        ("file:///etc/passwd", "not allowed"),
    ],
)
def test_bad_media_is_400_and_the_server_keeps_serving(server: ServerProcess, url: str, words: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        bad = http.post("/v1/chat/completions", json={"messages": image_question(url), **GREEDY})
        fine = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], **GREEDY}
        )
    assert bad.status_code == 400, bad.text
    assert words in bad.json()["error"]["message"]
    assert fine.status_code == 200


def test_a_text_only_model_refuses_images(gemma_server: ServerProcess, images: dict[str, Path]) -> None:
    body = {"messages": image_question(data_url(images["png"], "image/png")), **GREEDY}
    reply = httpx.post(gemma_server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert "image input is not supported" in reply.json()["error"]["message"]
    props = httpx.get(gemma_server.base_url + "/props", timeout=30).json()
    assert props["modalities"]["vision"] is False


def test_completion_with_multimodal_data(server: ServerProcess, images: dict[str, Path]) -> None:
    """/completion's prompt object: the media marker (from /props) where the image goes, its bytes in
    multimodal_data; the same prompt on /v1/chat/completions' path gives the same tokens."""
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        marker = http.get("/props").json()["media_marker"]
        image = base64.b64encode(images["png"].read_bytes()).decode()
        prompt = {"prompt_string": f"<start_of_turn>user\n{marker}What is this?", "multimodal_data": [image]}
        reply = http.post("/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0})
        text_only = http.post(
            "/completion", json={"prompt": "<start_of_turn>user\nWhat is this?", "n_predict": 1}
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens_evaluated"] == text_only.json()["tokens_evaluated"] + N_IMAGE + 2


@pytest.fixture(scope="module")
def file_server(media_dir: Path) -> Iterator[str]:
    """A real HTTP server on the loopback serving media_dir."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(media_dir))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_an_image_url_from_an_allowed_host(server: ServerProcess, file_server: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http_client:
        fetched = http_client.post(
            "/v1/chat/completions", json={"messages": image_question(f"{file_server}/gradient.png"), **GREEDY}
        )
        local = http_client.post(
            "/v1/chat/completions", json={"messages": image_question("file://gradient.png"), **GREEDY}
        )
        missing = http_client.post(
            "/v1/chat/completions", json={"messages": image_question(f"{file_server}/nope.png"), **GREEDY}
        )
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["choices"][0]["message"] == local.json()["choices"][0]["message"]  # the same image
    assert missing.status_code == 400 and "HTTP 404" in missing.json()["error"]["message"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    mmproj = write_gemma3_mmproj(tmp_path_factory.mktemp("mmproj-embd") / "mmproj-tiny.gguf", "tiny")
    args = ("-m", "gemma3", "--mmproj", str(mmproj), "--embedding", "--pooling", "mean", "-c", "2048")
    proc = ServerProcess(*args).wait_healthy()
    yield proc
    proc.stop()


def test_embeddings_of_content_with_an_image(embedder: ServerProcess, images: dict[str, Path]) -> None:
    """An embedding input's content parts with an image (llama-server's tokenize_oai_content_array): the
    image moves the vector, the same image gives the same vector, and the text alone is a third."""

    def vector(parts: list[dict]) -> list[float]:
        reply = httpx.post(
            embedder.base_url + "/v1/embeddings", json={"input": [{"content": parts}]}, timeout=120
        )
        assert reply.status_code == 200, reply.text
        return reply.json()["data"][0]["embedding"]

    text = {"type": "text", "text": "a picture"}
    jpeg = {"type": "image_url", "image_url": {"url": data_url(images["jpeg"], "image/jpeg")}}
    png = {"type": "image_url", "image_url": {"url": data_url(images["png"], "image/png")}}
    with_jpeg, again, with_png, alone = (
        vector([jpeg, text]),
        vector([jpeg, text]),
        vector([png, text]),
        vector([text]),
    )
    assert with_jpeg == again
    assert len({tuple(with_jpeg), tuple(with_png), tuple(alone)}) == 3


def test_ollama_chat_and_generate_with_images(
    server: ServerProcess, api: openai.OpenAI, images: dict[str, Path]
) -> None:
    """Ollama's `images` (base64, no data: prefix) on /api/chat and /api/generate: the same greedy answer as
    the OpenAI route's image_url with the same image; /api/show says the model reads images."""
    import ollama

    client = ollama.Client(host=server.base_url)
    assert "vision" in client.show("gemma3").capabilities
    question = "What is in this image?"
    want = api.chat.completions.create(
        model="gemma3", messages=image_question(data_url(images["png"], "image/png"), question), **GREEDY
    )
    options = {"temperature": 0, "num_predict": GREEDY["max_tokens"]}
    message = {"role": "user", "content": question, "images": [images["png"].read_bytes()]}
    chat = client.chat(model="gemma3", messages=[message], options=options)
    assert chat.message.content == want.choices[0].message.content
    assert chat.prompt_eval_count == want.usage.prompt_tokens  # the image's 16 positions counted alike
    generated = client.generate(model="gemma3", prompt=question, images=[images["png"]], options=options)
    assert generated.response == chat.message.content  # /api/generate templates the prompt as one user turn
