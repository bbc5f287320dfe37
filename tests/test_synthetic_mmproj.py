"""The synthetic Gemma 3 projector of tests/synthetic_mmproj.py: seeded bytes, the ones llama.cpp's mtmd ran
for tests/golden/mmproj_gemma3.{json,npz} (scripts/make_mmproj_goldens.py), and the keys and tensors
clip.cpp reads for projector type gemma3."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from tests.conftest import golden_file, load_golden
from tests.synthetic_mmproj import PRESETS, write_gemma3_mmproj

LEVEL_INDEPENDENT = "writes and reads a GGUF and the golden files (numpy, gguf): no kernel runs"
GOLDEN = load_golden("mmproj_gemma3")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_writer_is_deterministic_and_wrote_the_golden_file(tmp_path: Path) -> None:
    a = write_gemma3_mmproj(tmp_path / "a.gguf", "tiny", 0)
    b = write_gemma3_mmproj(tmp_path / "b.gguf", "tiny", 0)
    assert sha256(a) == sha256(b) == GOLDEN["mmproj"]["sha256"]
    assert sha256(write_gemma3_mmproj(tmp_path / "c.gguf", "tiny", 1)) != sha256(a)


def test_the_file_has_what_clip_cpp_reads_for_gemma3(tmp_path: Path) -> None:
    hp = PRESETS["tiny"]
    reader = gguf.GGUFReader(write_gemma3_mmproj(tmp_path / "tiny.gguf"))
    keys = {name: field.contents() for name, field in reader.fields.items()}
    assert keys["general.architecture"] == "clip" and keys["general.type"] == "mmproj"
    assert keys["clip.projector_type"] == "gemma3" and keys["clip.has_vision_encoder"] is True
    assert keys["clip.use_gelu"] is True  # else clip.cpp runs gelu_quick
    assert "clip.vision.projector.scale_factor" not in keys  # n_merge: clip.cpp's default 4
    vision = {
        "image_size": hp.image_size, "patch_size": hp.patch_size, "embedding_length": hp.n_embd,
        "feed_forward_length": hp.n_ff, "block_count": hp.n_layer, "attention.head_count": hp.n_head,
        "projection_dim": 640, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
    }  # fmt: skip
    assert {k: keys[f"clip.vision.{k}"] for k in vision} == vision
    assert np.isclose(keys["clip.vision.attention.layer_norm_epsilon"], 1e-6)

    e, f, p, n_pos = hp.n_embd, hp.n_ff, hp.patch_size, (hp.image_size // hp.patch_size) ** 2
    want = {  # name: (ggml ne, type) as the converter writes them
        "v.patch_embd.weight": ([p, p, 3, e], T.F32),
        "v.patch_embd.bias": ([e], T.F32),
        "v.position_embd.weight": ([e, n_pos], T.F32),
        "v.post_ln.weight": ([e], T.F32),
        "v.post_ln.bias": ([e], T.F32),
        "mm.soft_emb_norm.weight": ([e], T.F32),
        "mm.input_projection.weight": ([640, e], T.F16),  # ne[0] is clip_n_mmproj_embd
    }
    for il in range(hp.n_layer):
        for name in ("ln1", "ln2"):
            want |= {f"v.blk.{il}.{name}.{kind}": ([e], T.F32) for kind in ("weight", "bias")}
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            want |= {f"v.blk.{il}.{name}.weight": ([e, e], T.F16), f"v.blk.{il}.{name}.bias": ([e], T.F32)}
        # up: ne [n_embd, n_ff]; down's ne[0] is n_ff, else clip.cpp would swap them back
        want |= {f"v.blk.{il}.ffn_up.weight": ([e, f], T.F16), f"v.blk.{il}.ffn_up.bias": ([f], T.F32)}
        want |= {f"v.blk.{il}.ffn_down.weight": ([f, e], T.F16), f"v.blk.{il}.ffn_down.bias": ([e], T.F32)}
    got = {t.name: ([int(n) for n in t.shape], t.tensor_type) for t in reader.tensors}
    assert got == want
    for t in reader.tensors:
        assert np.isfinite(t.data).all() and float(np.abs(t.data).max()) < 8, t.name


def test_the_presets() -> None:
    tiny, big = PRESETS["tiny"], PRESETS["gemma3-4b"]
    assert tiny.n_image_tokens == 16 and big.n_image_tokens == 256
    assert (big.image_size, big.patch_size, big.n_embd, big.n_ff, big.n_layer, big.n_head, big.eps) == (
        896, 14, 1152, 4304, 27, 16, 1e-6,
    )  # fmt: skip
    assert tiny.n_embd_text == big.n_embd_text == 640  # Gemma 3 270M's n_embd


def test_the_goldens_describe_their_inputs() -> None:
    arrays = np.load(golden_file("mmproj_gemma3.npz"))
    assert sha256(golden_file("mmproj_gradient.png")) == GOLDEN["images"]["gradient"]["image_sha256"]
    width, height = GOLDEN["images"]["test1"]["width_height"]
    assert arrays["test1_pixels"].shape == (height, width, 3)  # stb_image's decode of test-1.jpeg
    for name, record in GOLDEN["images"].items():
        kinds = [c["type"] for c in record["chunks"]]
        assert kinds == ["text", "image", "text"]
        image = record["chunks"][1]
        assert image["n_tokens"] == image["n_pos"] == PRESETS["tiny"].n_image_tokens
        assert record["chunks"][0]["tokens"][-1] == 255999 and record["chunks"][2]["tokens"][0] == 256000
        assert arrays[f"{name}_embd"].shape == arrays[f"{name}_embd_fa"].shape == (16, 640)
        logits = arrays[f"{name}_logits"]
        assert logits.shape == (262144,) and np.isfinite(logits).all()
        assert [int(i) for i in np.argsort(-logits, kind="stable")[:10]] == record["top10"]
