"""SmolVLM's projector (engine/media/idefics3.py, projector type `idefics3`): the tiles, the SigLIP
encoder, the pixel shuffle and the projection against a float64 reference of siglip.cpp's graph and
against llama.cpp's mtmd on the same files (tests/golden/mmproj_idefics3.npz/.json,
`scripts/make_mmproj_goldens.py --projector idefics3`: the seeded synthetic "tiny" projector of
tests/synthetic_mmproj.py, write_idefics3_mmproj, in front of the SYNTHETIC SmolVLM text model of
tests/synthetic_smolvlm.py, the real SmolLM2-135M-Instruct with SmolVLM's added tokens; llama.cpp
0c1e570's libmtmd, CPU); the prompt mtmd makes of an image (its chunks, their text, the token counts);
the next token after an image; files the loader refuses; an image question through a real server.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.llm import LLM
from engine.media.chunks import MediaChunk, SlicedImage, TokenText, part_media
from engine.media.idefics3 import Idefics3Projector, pixel_shuffle, refined_sizes, slice_image
from engine.media.mmproj import UnsupportedProjector, load_projector
from engine.media.preprocess import MediaError, normalize, resize_pillow
from engine.text.tokenizer import Tokenizer
from server.model.media import vocab_lookups
from tests.conftest import golden_file, load_golden
from tests.server_process import ServerProcess
from tests.synthetic_mmproj import IDEFICS3_PRESETS, write_idefics3_mmproj
from tests.synthetic_smolvlm import write_smolvlm_text
from tests.test_media_llava import header_only, log_softmax
from tests.test_media_llava import image_path as llava_image_path
from tests.test_media_projector import attention, gelu, layer_norm, row_errors

GOLDEN = load_golden("mmproj_idefics3")
IMAGES = ("test1", "gradient", "wide")
# Against the float64 reference: float32 sums and the GELU's float16 table. Measured over every tile and
# overview of the three images 1 - cos <= 1.2e-7, rel <= 5.3e-5 (avx2); the bars are llava's.
REFERENCE_COS, REFERENCE_REL = 1 - 5e-7, 2e-4
# Against llama.cpp (per row; it rounds every F16 matmul's input to float16, Llamba keeps float32).
# Measured on the PNGs 1 - cos 2.4e-7, rel 1.02e-4 (gradient) / 9.0e-5 (wide), flash attention off and on
# alike; test-1.jpeg (stb_image against Pillow's libjpeg-turbo, then three Lanczos resizes) 1 - cos
# 3.4e-5, rel 1.16e-3; from stb's own pixels (the golden's test1_pixels) 1 - cos 3.6e-7, rel 9.8e-5, as
# close as the PNGs. The bars allow ~2.5x what was measured.
GOLDEN_BARS = {
    "gradient": (1 - 1e-6, 2.5e-4),
    "wide": (1 - 1e-6, 2.5e-4),
    "test1": (1 - 1e-4, 3e-3),
    "test1_stb": (1 - 1e-6, 2.5e-4),
}
# The next token (|delta log-probability| at llama.cpp's top token, and over its top 20), set against
# llama.cpp's own spread between its text model's attention paths (the golden's *_logits_fa: 0.048 / 0.036
# at the top token, 0.30 / 0.18 in the top 20, test-1.jpeg / the wide PNG). Llamba measured 0.085 / 0.042
# and 0.26 / 0.18 (avx2). The top token's margin over the second is 1.6 / 0.9 in llama.cpp's logits (the
# gradient's, 0.17, is too close to test).
BOUNDS = {"top1": 0.2, "top20": 0.6}
TOP = 20


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_idefics3_mmproj(tmp_path_factory.mktemp("mmproj") / "idefics3-tiny.gguf", "tiny", 0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["mmproj"]["sha256"]  # the goldens' file
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SYNTHETIC SmolVLM text model (SmolLM2-135M + SmolVLM's added tokens), as the goldens used it."""
    path = write_smolvlm_text(tmp_path_factory.mktemp("smolvlm") / "smolvlm-text.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["text_model"]["sha256"]
    return path


@pytest.fixture(scope="module")
def projector(tiny_file: Path) -> Idefics3Projector:
    loaded = load_projector(tiny_file, cpu_backend())
    assert isinstance(loaded, Idefics3Projector)
    return loaded


def image_path(name: str) -> Path:
    return golden_file("mmproj_wide.png") if name == "wide" else llava_image_path(name)


def image_bytes(name: str) -> bytes:
    data = image_path(name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == GOLDEN["images"][name]["image_sha256"]
    return data


def golden_image_chunks(name: str) -> list[dict]:
    return [c for c in GOLDEN["images"][name]["chunks"] if c["type"] == "image"]


# -- the file, as conversion/smolvlm.py writes it -----------------------------------------------------------


def test_the_file_has_what_clip_cpp_reads_for_idefics3(tiny_file: Path) -> None:
    hp = IDEFICS3_PRESETS["tiny"]
    reader = gguf.GGUFReader(tiny_file)
    keys = {name: field.contents() for name, field in reader.fields.items()}
    assert keys["clip.projector_type"] == "idefics3" and keys["clip.use_gelu"] is True
    assert keys["clip.vision.projector.scale_factor"] == hp.scale_factor == 2
    assert keys["clip.vision.preproc_image_size"] == hp.longest_edge == 192
    assert keys["clip.vision.image_size"] == 64 and keys["clip.vision.patch_size"] == 8
    types = {x.name: (tuple(int(n) for n in x.shape), x.tensor_type) for x in reader.tensors}
    T = gguf.GGMLQuantizationType
    assert types["v.patch_embd.weight"] == ((8, 8, 3, 128), T.F32)  # `.embeddings.`: float32
    assert types["v.position_embd.weight"] == ((128, 64), T.F32)
    assert types["mm.model.fc.weight"] == ((128 * 4, 576), T.F16)  # ne: n_embd * s^2 in, 576 out
    assert "mm.model.fc.bias" not in types and "v.post_ln.weight" in types


def test_the_projectors_facts(projector: Idefics3Projector) -> None:
    hp = projector.hparams
    assert (hp.resize_algo, hp.n_merge, hp.longest_edge, hp.ffn_op) == ("lanczos", 2, 192, "gelu")
    assert (projector.n_tile_tokens, projector.n_embd_text, projector.non_causal) == (16, 576, False)
    assert projector.lookup_texts == ("\n", "\n\n", "<fake_token_around_image>", "<global-img>")


# -- (a) the preprocessing: mtmd_image_preprocessor_idefics3 ------------------------------------------------


@pytest.mark.parametrize(
    ("size", "resized", "grid"),
    [
        ((640, 488), (192, 146), (3, 3)),  # test-1.jpeg: 192 / 1.311 = 146.4 -> 146
        ((64, 48), (192, 144), (3, 3)),
        ((100, 33), (192, 64), (3, 1)),  # 63.36 -> 63, odd -> 64: one row of tiles
        ((33, 100), (64, 192), (1, 3)),
        ((64, 64), (192, 192), (3, 3)),  # a square: width >= height takes the first branch
        ((300, 40), (192, 26), (3, 1)),  # 25.6 -> 25 -> 26
    ],
)
def test_the_refined_size_and_grid_are_mtmds(
    size: tuple[int, int], resized: tuple[int, int], grid: tuple[int, int]
) -> None:
    assert refined_sizes(*size, 64, 192) == (resized, grid)


def test_the_grids_match_mtmds_chunks() -> None:
    """The goldens' chunk counts: test-1.jpeg and the gradient 3 x 3 tiles + the overview, the wide PNG
    3 x 1 + the overview; each 16 tokens."""
    counts = {name: len(golden_image_chunks(name)) for name in IMAGES}
    assert counts == {"test1": 10, "gradient": 10, "wide": 4}
    assert all(c["n_tokens"] == 16 for name in IMAGES for c in golden_image_chunks(name))


def test_a_too_thin_image_is_a_media_error() -> None:
    with pytest.raises(MediaError):
        refined_sizes(1000, 1, 64, 192)  # 192 / 1000 truncates to 0 rows


def test_slicing_cuts_the_refined_image_and_shrinks_it_for_the_overview() -> None:
    img = np.random.default_rng(3).integers(0, 256, (33, 100, 3), dtype=np.uint8)
    tiles, overview, grid_x = slice_image(img, 64, 192, "lanczos")
    refined = resize_pillow(resize_pillow(img, 192, 64, "lanczos"), 192, 64, "lanczos")
    assert grid_x == 3 and len(tiles) == 3
    for x, tile in enumerate(tiles):
        assert np.array_equal(tile, refined[:, x * 64 : (x + 1) * 64])
    assert np.array_equal(overview, resize_pillow(refined, 64, 64, "lanczos"))


# -- (b) the pixel shuffle and the encoder against float64 numpy --------------------------------------------


def ggml_pixel_shuffle(x: np.ndarray, side: int, s: int) -> np.ndarray:
    """HF's Idefics3Connector.pixel_shuffle, its views and permutes written out (no padding)."""
    e = x.shape[1]
    y = x.reshape(side, side, e).reshape(side, side // s, e * s).transpose(1, 0, 2)
    y = y.reshape(side // s, side // s, e * s * s).transpose(1, 0, 2)
    return y.reshape(-1, e * s * s)


def test_pixel_shuffle_is_hfs_and_pads_as_ggml() -> None:
    x = np.arange(8 * 8 * 3, dtype=np.float32).reshape(64, 3)
    assert np.array_equal(pixel_shuffle(x, 8, 2), ggml_pixel_shuffle(x, 8, 2))
    assert np.array_equal(pixel_shuffle(x, 8, 4), ggml_pixel_shuffle(x, 8, 4))
    # row 0 holds patches (0,0), (0,1), (1,0), (1,1) in that order
    assert np.array_equal(pixel_shuffle(x, 8, 2)[0], np.concatenate([x[0], x[1], x[8], x[9]]))
    odd = np.arange(3 * 3 * 2, dtype=np.float32).reshape(9, 2)  # 3x3 padded to 4x4 with zeros
    out = pixel_shuffle(odd, 3, 2)
    assert out.shape == (4, 8) and np.array_equal(out[3], np.r_[odd[8], 0, 0, 0, 0, 0, 0])


def reference_forward(path: Path, pixels: np.ndarray) -> np.ndarray:
    """siglip.cpp's idefics3 graph in float64 from the file's tensors: one tile."""
    reader = gguf.GGUFReader(str(path))
    t: Callable[[str], np.ndarray] = {
        x.name: np.asarray(x.data, dtype=np.float64) for x in reader.tensors
    }.__getitem__
    field = reader.fields["clip.vision.attention.layer_norm_epsilon"]
    eps = float(field.parts[field.data[0]][0])
    hp = IDEFICS3_PRESETS["tiny"]
    e, ps, side = hp.n_embd, hp.patch_size, hp.image_size // hp.patch_size
    patches = pixels.reshape(3, side, ps, side, ps).transpose(1, 3, 0, 2, 4).reshape(side * side, -1)
    x = patches @ t("v.patch_embd.weight").reshape(e, -1).T + t("v.patch_embd.bias")
    x = x + t("v.position_embd.weight")
    for il in range(hp.n_layer):
        p = f"v.blk.{il}"
        x = x + attention(layer_norm(x, t(f"{p}.ln1.weight"), t(f"{p}.ln1.bias"), eps), t, p, hp.n_head)
        h = layer_norm(x, t(f"{p}.ln2.weight"), t(f"{p}.ln2.bias"), eps)
        h = gelu(h @ t(f"{p}.ffn_up.weight").T + t(f"{p}.ffn_up.bias"))
        x = x + h @ t(f"{p}.ffn_down.weight").T + t(f"{p}.ffn_down.bias")
    x = layer_norm(x, t("v.post_ln.weight"), t("v.post_ln.bias"), eps)
    return ggml_pixel_shuffle(x, side, hp.scale_factor) @ t("mm.model.fc.weight").T


def test_a_tile_matches_a_float64_reference(projector: Idefics3Projector, tiny_file: Path) -> None:
    tiles, overview, _ = projector.preprocess(image_bytes("test1"))
    for pixels in (tiles[4], overview):
        got = projector.encode_pixels(pixels)
        assert got.dtype == np.float32 and got.shape == (16, 576)
        cos, rel = row_errors(got, reference_forward(tiny_file, pixels.astype(np.float64)))
        assert cos >= REFERENCE_COS and rel <= REFERENCE_REL, (cos, rel)


# -- (c) against llama.cpp's mtmd on the same file ----------------------------------------------------------


@pytest.mark.parametrize("name", IMAGES)
def test_encode_image_matches_llama_cpp(projector: Idefics3Projector, name: str) -> None:
    goldens = np.load(golden_file("mmproj_idefics3.npz"))
    got = np.concatenate(projector.encode_image(image_bytes(name)).embeddings)
    min_cos, max_rel = GOLDEN_BARS[name]
    for key in (f"{name}_embd", f"{name}_embd_fa"):  # llama.cpp's flash attention off, then on
        assert got.shape == goldens[key].shape
        cos, rel = row_errors(got, goldens[key])
        assert cos >= min_cos and rel <= max_rel, (key, cos, rel)


def test_from_stb_images_pixels_the_jpeg_is_as_close_as_the_png(projector: Idefics3Projector) -> None:
    goldens = np.load(golden_file("mmproj_idefics3.npz"))
    hp = projector.hparams
    tiles, overview, _ = slice_image(goldens["test1_pixels"], hp.image_size, hp.longest_edge, hp.resize_algo)
    rows = [projector.encode_pixels(normalize(t, hp.image_mean, hp.image_std)) for t in [*tiles, overview]]
    min_cos, max_rel = GOLDEN_BARS["test1_stb"]
    for key in ("test1_embd", "test1_embd_fa"):
        cos, rel = row_errors(np.concatenate(rows), goldens[key])
        assert cos >= min_cos and rel <= max_rel, (key, cos, rel)


# -- (d) the prompt: mtmd's chunks and their text -----------------------------------------------------------


@pytest.fixture(scope="module")
def text_llm(text_file: Path) -> LLM:
    return LLM.load(str(text_file))


def prompt_tokens(tokenizer: Tokenizer, image: SlicedImage) -> tuple[list[int], dict[int, MediaChunk]]:
    """The golden's prompt with the image as server/model/media.py tokenizes it (texts tokenized with
    special tokens parsed, TokenTexts looked up, each chunk's marker once per row; markers -1, -2, ...)."""
    before, after = GOLDEN["prompt"].split("<__media__>")
    lookups = vocab_lookups(tokenizer, Idefics3Projector.lookup_texts)
    tokens, media = tokenizer.encode(before, False, True), {}
    for piece in image.pieces:
        if isinstance(piece, TokenText):
            tokens.append(lookups[piece.text])
        elif isinstance(piece, str):
            tokens += tokenizer.encode(piece, False, True)
        else:
            chunk = MediaChunk(-1 - len(media), piece)
            media[chunk.marker] = chunk
            tokens += [chunk.marker] * chunk.n_tokens
    return tokens + tokenizer.encode(after, False, True), media


@pytest.mark.parametrize("name", IMAGES)
def test_the_image_text_and_token_counts_are_mtmds(
    projector: Idefics3Projector, text_llm: LLM, name: str
) -> None:
    """Token for token mtmd's chunks: the text chunks' ids, each image chunk's length, in order."""
    want: list[int] = []
    for c in GOLDEN["images"][name]["chunks"]:  # image chunk k's rows hold marker -1 - k
        n_images = len({t for t in want if t < 0})
        want += c["tokens"] if c["type"] == "text" else [-1 - n_images] * c["n_tokens"]
    tokens, media = prompt_tokens(text_llm.tokenizer, projector.encode_image(image_bytes(name)))
    assert tokens == want and len(media) == len(golden_image_chunks(name))


def test_a_text_model_without_the_tokens_is_refused(smollm2_llm: LLM) -> None:
    """SmolLM2's own vocabulary has "\n" and "\n\n" but not SmolVLM's added tokens: mtmd would feed
    LLAMA_TOKEN_NULL; the load fails in one line instead."""
    with pytest.raises(ValueError, match="no token '<fake_token_around_image>'"):
        vocab_lookups(smollm2_llm.tokenizer, Idefics3Projector.lookup_texts)


# -- (e) the next token after an image, on the SYNTHETIC SmolVLM text model ---------------------------------


@pytest.mark.parametrize("name", ["test1", "wide"])  # the gradient's top two are 0.17 apart: too close
def test_the_next_token_after_an_image_is_llama_cpps(
    text_llm: LLM, projector: Idefics3Projector, name: str
) -> None:
    tokens, media = prompt_tokens(text_llm.tokenizer, projector.encode_image(image_bytes(name)))
    part = BatchPart(0, 0, tokens, media=part_media(tokens, 0, media))
    ours = log_softmax(text_llm.model.forward(Batch.of([part]), text_llm.new_cache(1, 512))[0])
    theirs = log_softmax(np.load(golden_file("mmproj_idefics3.npz"))[f"{name}_logits"])
    top = np.argsort(-theirs)[:TOP]
    assert ours.argmax() == top[0]
    assert abs(ours[top[0]] - theirs[top[0]]) <= BOUNDS["top1"]
    assert np.abs(ours[top] - theirs[top]).max() <= BOUNDS["top20"]


# -- (f) refusals -------------------------------------------------------------------------------------------


IDEFICS3 = {"clip.has_vision_encoder": True, "clip.projector_type": "idefics3"}


def rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: int | None) -> Path:
    """The tiny file with `key` dropped (None) or set to another uint32."""
    add_key_value = gguf.GGUFWriter.add_key_value

    def changed(self: gguf.GGUFWriter, name: str, val: object, *args: object, **kw: object) -> None:
        if name != key:
            add_key_value(self, name, val, *args, **kw)  # type: ignore[arg-type]
        elif value is not None:
            add_key_value(self, name, value, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", changed)
    return write_idefics3_mmproj(tmp_path / "rewritten.gguf")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("clip.vision.preproc_image_size", None, "older idefics3 files' slicing is not built"),
        ("clip.vision.projector.scale_factor", None, "needs clip.vision.projector.scale_factor > 1"),
        ("clip.vision.projector.scale_factor", 1, "needs clip.vision.projector.scale_factor > 1"),
        ("clip.vision.projector.scale_factor", 4, "mm.model.fc reads 512, not 4^2 x the encoder's 128"),
        ("clip.use_gelu", None, "feed-forward's gelu_quick is not built"),
    ],
)
def test_what_is_not_built_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: int | None, message: str
) -> None:
    path = rewritten(tmp_path, monkeypatch, key, value)
    with pytest.raises(UnsupportedProjector) as caught:
        load_projector(path, cpu_backend())
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_without_the_encoder_keys_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedProjector, match="lacks clip.vision.embedding_length"):
        load_projector(header_only(tmp_path / "keys.gguf", IDEFICS3), cpu_backend())


# -- (g) through a real server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_file: Path, text_file: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", str(text_file), "--mmproj", str(tiny_file), "-np", "1", "-c", "2048")
    proc.wait_healthy()
    yield proc
    proc.stop()


def test_an_image_question_through_the_server(server: ServerProcess) -> None:
    """/completion with mtmd's prompt: the tokens it evaluates are mtmd's count (tiles, overview and their
    text), its top next token llama.cpp's; the same image twice in a chat is twice the tokens more; a
    follow-up turn reuses the first turn's cells, every tile's included."""
    png = base64.b64encode(image_bytes("wide")).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    question = {"type": "text", "text": "What is this?"}
    greedy = {"temperature": 0, "max_tokens": 1}
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        marker = http.get("/props").json()["media_marker"]
        prompt = {"prompt_string": GOLDEN["prompt"].replace("<__media__>", marker), "multimodal_data": [png]}
        reply = http.post(
            "/completion", json={"prompt": prompt, "n_predict": 1, "n_probs": 3, "temperature": 0}
        )
        turn = [user([image, question])]
        one = http.post("/v1/chat/completions", json={"messages": turn, **greedy})
        answer = {"role": "assistant", "content": one.json()["choices"][0]["message"]["content"]}
        follow = [*turn, answer, user([{"type": "text", "text": "And?"}])]
        again = http.post("/v1/chat/completions", json={"messages": follow, **greedy})
        two = http.post("/v1/chat/completions", json={"messages": [user([image, image, question])], **greedy})
    assert reply.status_code == one.status_code == again.status_code == two.status_code == 200, reply.text
    record = GOLDEN["images"]["wide"]
    n_prompt = sum(c.get("n_tokens", len(c.get("tokens", []))) for c in record["chunks"])
    assert reply.json()["tokens_evaluated"] == n_prompt == 89  # 4 chunks of 16 and 25 text tokens
    assert reply.json()["completion_probabilities"][0]["top_logprobs"][0]["id"] == record["top10"][0]
    # the image's 64 rows and its 10 tokens of text (3 tile labels of 2, "\n\n", 3 around the overview)
    assert two.json()["usage"]["prompt_tokens"] == one.json()["usage"]["prompt_tokens"] + 74
    assert again.json()["timings"]["cache_n"] >= one.json()["usage"]["prompt_tokens"] - 1


def user(content: list[dict]) -> dict:
    return {"role": "user", "content": content}
