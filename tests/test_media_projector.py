"""Gemma 3's vision projector (engine/media/): SigLIP + the pooling projector, against a float64 reference
of the formulas and against llama.cpp's mtmd on the same file (tests/golden/mmproj_gemma3.npz/.json,
scripts/make_mmproj_goldens.py: the seeded synthetic projector of tests/synthetic_mmproj.py, llama.cpp
0c1e570's libmtmd, CPU); the preprocessing against a line-by-line numpy translation of llama.cpp's
resize (tools/mtmd/mtmd-image.cpp resize_pillow); bad bytes and unsupported files refused in one line.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from PIL import Image

from engine.backend import cpu_backend
from engine.media.mmproj import UnsupportedProjector, load_projector
from engine.media.preprocess import MediaError, decode_image, normalize, resize_padded, resize_pillow
from engine.media.vision import Projector
from engine.reference_data import reference_file
from tests.conftest import golden_file, load_golden
from tests.synthetic_mmproj import write_gemma3_mmproj

GOLDEN = load_golden("mmproj_gemma3")
# Against the float64 reference on the tiny file: the backend's GELU is ggml's float16 table (each
# activation rounded to f16 on the way in and out) and its sums are float32. Measured 1 - cos <= 8.1e-8
# and max |error| / row norm <= 2.3e-5 (avx512-vnni and avx2 alike); llama.cpp's own goldens are further
# from it (gradient: 1 - cos 1.0e-7, rel 6.2e-5), since it also rounds each matmul's input to f16.
REFERENCE_COS, REFERENCE_REL = 1 - 5e-7, 5e-5
# Against llama.cpp (per row: cosine, and max |error| / the golden row's norm). llama.cpp rounds every
# matmul's input to f16 (F16 weights: ggml's vec_dot_type), ours stays float32; measured on the gradient
# PNG 1 - cos 2.4e-7, rel 7.2e-5. test-1.jpeg decodes differently: stb_image (llama.cpp) and Pillow's
# libjpeg-turbo differ by up to 3 in 5.0% of its 640x488x3 samples (IDCT, YCbCr rounding; measured with
# stb_image.h from llama.cpp's vendor/ compiled beside it), which the bilinear resize leaves as +-1 in
# 4.9% of the 224x224x3 pixels. With stb's pixels Llamba's embeddings are as close as the PNG's (1 - cos
# 2.4e-7, rel 8e-5); with Pillow's 1 - cos 4.1e-6, rel 3.8e-4. The bars allow ~2.5x what was measured.
GOLDEN_BARS = {"gradient": (1 - 1e-6, 2e-4), "test1": (1 - 1e-5, 1e-3)}


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_gemma3_mmproj(tmp_path_factory.mktemp("mmproj") / "tiny.gguf", "tiny", 0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["mmproj"]["sha256"]  # the goldens' file
    return path


@pytest.fixture(scope="module")
def projector(tiny_file: Path) -> Projector:
    return load_projector(tiny_file, cpu_backend())


def image_bytes(name: str) -> bytes:
    image = GOLDEN["images"][name]
    path = reference_file("tools/mtmd/test-1.jpeg") if name == "test1" else golden_file("mmproj_gradient.png")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == image["image_sha256"]
    return data


def row_errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(the worst row's cosine, the worst row's max |error| / that row's norm in `want`)."""
    norms = np.linalg.norm(want, axis=1)
    cos = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * norms)
    return float(cos.min()), float((np.abs(got - want).max(axis=1) / norms).max())


# -- (a) the whole forward against float64 numpy, straight from the formulas ------------------------------


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + eps) * w + b


def gelu(x: np.ndarray) -> np.ndarray:  # ggml_gelu: the tanh approximation
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def attention(h: np.ndarray, t: Callable[[str], np.ndarray], p: str, n_head: int) -> np.ndarray:
    n, e = h.shape
    q, k, v = ((h @ t(f"{p}.attn_{x}.weight").T + t(f"{p}.attn_{x}.bias")) for x in "qkv")
    heads = [x.reshape(n, n_head, e // n_head).transpose(1, 0, 2) for x in (q, k, v)]
    scores = heads[0] @ heads[1].transpose(0, 2, 1) / math.sqrt(e // n_head)  # every patch sees every patch
    probs = np.exp(scores - scores.max(axis=2, keepdims=True))
    probs /= probs.sum(axis=2, keepdims=True)
    o = (probs @ heads[2]).transpose(1, 0, 2).reshape(n, e)
    return o @ t(f"{p}.attn_out.weight").T + t(f"{p}.attn_out.bias")


def reference_forward(path: Path, pixels: np.ndarray) -> np.ndarray:
    """SigLIP + Gemma 3's projector in float64 from the file's tensors (read with gguf-py's reader)."""
    reader = gguf.GGUFReader(str(path))
    tensors = {x.name: np.asarray(x.data, dtype=np.float64) for x in reader.tensors}
    field = reader.fields["clip.vision.attention.layer_norm_epsilon"]
    eps = float(field.parts[field.data[0]][0])
    n_head = int(reader.fields["clip.vision.attention.head_count"].parts[-1][0])
    t = tensors.__getitem__
    e, _, ps, _ = t("v.patch_embd.weight").shape
    side = pixels.shape[1] // ps
    patches = pixels.reshape(3, side, ps, side, ps).transpose(1, 3, 0, 2, 4).reshape(side * side, -1)
    x = (
        patches @ t("v.patch_embd.weight").reshape(e, -1).T
        + t("v.patch_embd.bias")
        + t("v.position_embd.weight")
    )
    n_layer = sum(1 for name in tensors if name.endswith(".ln1.weight"))
    for il in range(n_layer):
        p = f"v.blk.{il}"
        x = x + attention(layer_norm(x, t(f"{p}.ln1.weight"), t(f"{p}.ln1.bias"), eps), t, p, n_head)
        h = layer_norm(x, t(f"{p}.ln2.weight"), t(f"{p}.ln2.bias"), eps)
        up = gelu(h @ t(f"{p}.ffn_up.weight").T + t(f"{p}.ffn_up.bias"))
        x = x + up @ t(f"{p}.ffn_down.weight").T + t(f"{p}.ffn_down.bias")
    x = layer_norm(x, t("v.post_ln.weight"), t("v.post_ln.bias"), eps)
    k = 4  # Gemma 3's pooling (the tiny preset writes no scale factor)
    pooled = x.reshape(side // k, k, side // k, k, e).mean(axis=(1, 3)).reshape(-1, e)
    normed = pooled / np.sqrt((pooled**2).mean(axis=1, keepdims=True) + eps) * t("mm.soft_emb_norm.weight")
    return normed @ t("mm.input_projection.weight")  # [n_embd, n_embd_text]: times its transpose's transpose


@pytest.mark.parametrize("name", ["test1", "gradient"])
def test_encode_image_matches_a_float64_reference_of_the_formulas(
    projector: Projector, tiny_file: Path, name: str
) -> None:
    data = image_bytes(name)
    got = projector.encode_image(data)
    want = reference_forward(tiny_file, projector.preprocess(data).astype(np.float64))
    assert got.dtype == np.float32 and got.shape == (projector.n_image_tokens, projector.n_embd_text)
    cos, rel = row_errors(got, want)
    assert cos >= REFERENCE_COS and rel <= REFERENCE_REL, (cos, rel)


def test_the_projectors_facts(projector: Projector) -> None:
    assert (projector.n_image_tokens, projector.n_embd_text) == (16, 640)
    assert (projector.image_begin, projector.image_end) == ("<start_of_image>", "<end_of_image>")
    assert projector.modalities == frozenset({"image"}) and projector.non_causal
    hp = projector.hparams
    assert (hp.image_size, hp.patch_size, hp.n_merge, hp.ffn_op, hp.resize_algo) == (
        224,
        14,
        4,
        "gelu",
        "bilinear",
    )


# -- (b) against llama.cpp's mtmd on the same file ---------------------------------------------------------


@pytest.mark.parametrize("name", ["test1", "gradient"])
def test_encode_image_matches_llama_cpp(projector: Projector, name: str) -> None:
    goldens = np.load(golden_file("mmproj_gemma3.npz"))
    got = projector.encode_image(image_bytes(name))
    min_cos, max_rel = GOLDEN_BARS[name]
    for key in (f"{name}_embd", f"{name}_embd_fa"):  # llama.cpp's flash attention off, then on
        cos, rel = row_errors(got, goldens[key])
        assert cos >= min_cos and rel <= max_rel, (key, cos, rel)


def test_encoding_is_the_same_whatever_was_encoded_before(projector: Projector) -> None:
    first = projector.encode_image(image_bytes("gradient"))
    projector.encode_image(image_bytes("test1"))
    assert np.array_equal(projector.encode_image(image_bytes("gradient")), first)


# -- (c) the preprocessing against llama.cpp's resize, translated line by line ----------------------------


def llama_cpp_resize(img: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """mtmd-image.cpp's resize_pillow as its loops run: float64 weights, 22-bit fixed point, horizontal
    pass then vertical, each output sample rounded by the added half and clipped."""
    out = img.astype(np.int64)
    if width != img.shape[1]:
        out = np.stack([resample_rows(out[y], width, algo) for y in range(out.shape[0])])
    if height != img.shape[0]:
        out = np.stack([resample_rows(out[:, x], height, algo) for x in range(out.shape[1])], axis=1)
    return out.astype(np.uint8)


def resample_rows(line: np.ndarray, out_size: int, algo: str) -> np.ndarray:
    """One line [n, 3] resampled to [out_size, 3] (precompute_weights and one pass)."""
    support_1, bits = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}[algo], 22
    in_size = line.shape[0]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support_1 * filterscale
    result = np.zeros((out_size, 3), np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), in_size) - xmin
        w = [resample_filter((x + xmin - center + 0.5) * (1.0 / filterscale), algo) for x in range(count)]
        total = 0.0
        for v in w:
            total += v
        w = [v / total if total != 0.0 else v for v in w]
        fixed = [int(v * (1 << bits) + (-0.5 if v < 0 else 0.5)) for v in w]
        for c in range(3):
            acc = 1 << (bits - 1)
            for x in range(count):
                acc += int(line[xmin + x, c]) * fixed[x]
            result[xx, c] = min(max(acc >> bits, 0), 255)
    return result


def sinc(v: float) -> float:
    return 1.0 if v == 0.0 else math.sin(v * math.pi) / (v * math.pi)


def resample_filter(x: float, algo: str) -> float:
    if algo == "lanczos":  # sinc(x) sinc(x / 3) on [-3, 3), as the C lambda (no abs: the bound is one-sided)
        return sinc(x) * sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0
    x = abs(x)
    if algo == "bilinear":
        return 1.0 - x if x < 1.0 else 0.0
    a = -0.5  # Pillow's cubic
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    return (((x - 5) * x + 8) * x - 4) * a if x < 2.0 else 0.0


SIZES = [((5, 7), (3, 11)), ((9, 4), (13, 2)), ((6, 6), (6, 10)), ((16, 3), (5, 16)), ((1, 8), (4, 1))]


@pytest.mark.parametrize("algo", ["bilinear", "bicubic", "lanczos"])
@pytest.mark.parametrize(("src", "dst"), SIZES)
def test_resize_is_llama_cpps_bit_for_bit(algo: str, src: tuple[int, int], dst: tuple[int, int]) -> None:
    """Up and down in each direction at once: Pillow's own resize would part from llama.cpp's where it
    shrinks the rows and widens the columns (measured: +-1 in 20% of the samples), hence numpy."""
    img = np.random.default_rng(sum(src) * 31 + sum(dst)).integers(0, 256, (*src, 3), dtype=np.uint8)
    got = resize_pillow(img, dst[1], dst[0], algo)
    assert got.dtype == np.uint8 and np.array_equal(got, llama_cpp_resize(img, dst[1], dst[0], algo))


def png(img: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(img).save(out, "PNG")
    return out.getvalue()


def test_preprocessing_pads_to_the_square_and_normalises_as_llama_cpp(projector: Projector) -> None:
    """A 30x9 image (a wide one: scaled to fit 224 wide, 68 tall, centred on black) through the whole
    path: decode, PAD_CEIL fit, resize, (x / 255 - mean) / std per channel in float32, planar."""
    img = np.random.default_rng(3).integers(0, 256, (9, 30, 3), dtype=np.uint8)
    hp = projector.hparams
    scale = min(np.float32(224) / np.float32(30), np.float32(224) / np.float32(9))
    new_h = math.ceil(np.float32(9) * scale)
    square = np.zeros((224, 224, 3), np.uint8)
    top = (224 - new_h) // 2
    square[top : top + new_h] = llama_cpp_resize(img, 224, new_h, "bilinear")
    mean, std = np.float32(hp.image_mean[0]), np.float32(hp.image_std[0])
    want = ((square.astype(np.float32) / np.float32(255) - mean) / std).transpose(2, 0, 1)
    got = projector.preprocess(png(img))
    assert (new_h, top) == (68, 78) and got.dtype == np.float32 and got.shape == (3, 224, 224)
    assert np.array_equal(got, want)
    assert np.array_equal(resize_padded(square, 224), square)  # already square: kept as it is
    assert np.array_equal(normalize(square, hp.image_mean, hp.image_std), want)


def test_decoding_gives_rgb_as_stb_image_does() -> None:
    """Grey is replicated, alpha dropped (not composited), 16-bit grey by its high byte, and no EXIF
    rotation: what stbi_load_from_memory(..., 3) gives llama.cpp."""
    rgba = np.random.default_rng(4).integers(0, 256, (5, 6, 4), dtype=np.uint8)
    assert np.array_equal(decode_image(png(rgba)), rgba[:, :, :3])
    grey = rgba[:, :, 0]
    assert np.array_equal(decode_image(png(grey)), np.repeat(grey[:, :, None], 3, axis=2))
    deep = (np.arange(30, dtype=np.uint16).reshape(5, 6) * 2000).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(deep).save(out, "PNG")
    assert np.array_equal(decode_image(out.getvalue())[:, :, 1], (deep >> 8).astype(np.uint8))
    rotated = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees": llama.cpp ignores it, so does Llamba
    Image.fromarray(rgba[:, :, :3]).save(rotated, "PNG", exif=exif)
    assert decode_image(rotated.getvalue()).shape == (5, 6, 3)


# -- (d) refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, b"\xff\xd8\xff\xe0" + b"\x00" * 64],
)
def test_bad_bytes_raise_a_media_error(projector: Projector, data: bytes) -> None:
    with pytest.raises(MediaError) as caught:
        projector.encode_image(data)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
    assert "image" in str(caught.value)


def test_a_truncated_image_raises_a_media_error() -> None:
    data = image_bytes("gradient")
    with pytest.raises(MediaError, match="cannot decode the image"):
        decode_image(data[: len(data) // 2])


def clip_file(path: Path, keys: dict[str, object]) -> Path:
    """A projector file's header only (no tensors): what the loader reads before anything else."""
    writer = gguf.GGUFWriter(str(path), "clip")
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        else:
            writer.add_string(key, str(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"clip.has_vision_encoder": True, "clip.projector_type": "minicpmv"},
            "unsupported projector type 'minicpmv'",
        ),
        ({"clip.has_vision_encoder": True, "clip.vision.projector_type": "qwen2vl"}, "'qwen2vl'"),
        ({"clip.projector_type": "ultravox"}, "has no vision encoder"),
        ({"clip.has_audio_encoder": True, "clip.projector_type": "qwen2a"}, "'qwen2a'"),  # audio.py's refusal
        ({"clip.has_audio_encoder": True, "clip.has_vision_encoder": True}, "a vision and an audio encoder"),
    ],
)
def test_an_unsupported_projector_is_refused_in_one_line(tmp_path: Path, keys: dict, message: str) -> None:
    path = clip_file(tmp_path / "other.gguf", keys)
    with pytest.raises(UnsupportedProjector) as caught:
        load_projector(path, cpu_backend())
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_text_model_is_not_a_projector(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "text.gguf"), "gemma3")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedProjector, match="not a projector file"):
        load_projector(tmp_path / "text.gguf", cpu_backend())


def rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rename: Callable[[str], str], extra: bool
) -> Path:
    """The tiny file written with its tensors renamed (and `extra`: one more tensor, which no projector
    reads)."""
    add = gguf.GGUFWriter.add_tensor

    def add_tensor(self: gguf.GGUFWriter, name: str, tensor: np.ndarray, *args: object, **kw: object) -> None:
        add(self, rename(name), tensor, *args, **kw)
        if extra and name == "mm.input_projection.weight":
            add(self, "v.class_embd", np.zeros(128, np.float32))

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", add_tensor)
    return write_gemma3_mmproj(tmp_path / "rewritten.gguf", "tiny", 0)


def test_old_conversions_with_swapped_up_and_down_give_the_same_embeddings(
    projector: Projector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap = {"ffn_up": "ffn_down", "ffn_down": "ffn_up"}
    path = rewritten(
        tmp_path, monkeypatch, lambda n: next((n.replace(a, b) for a, b in swap.items() if a in n), n), False
    )
    data = image_bytes("gradient")
    assert np.array_equal(
        load_projector(path, cpu_backend()).encode_image(data), projector.encode_image(data)
    )


def test_a_file_with_tensors_the_projector_does_not_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rewritten(tmp_path, monkeypatch, lambda n: n, True)
    with pytest.raises(UnsupportedProjector, match="does not use: v.class_embd"):
        load_projector(path, cpu_backend())
