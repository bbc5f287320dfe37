"""Synthetic vision projectors (mmproj GGUFs: Gemma 3, llava-1.5 style) with seeded random weights.

No real projector file is available here, so, as llama.cpp's own tests do (tinygemma3), this writes one
with the layout llama.cpp 0c1e570 reads for projector type `gemma3`, from these files of its tree:

- conversion/gemma.py (`Gemma3VisionModel`) and conversion/base.py (`MmprojModel`): the keys the
  converter writes and the tensor types it forces (`.embeddings.` float32, `input_projection` float16,
  other matrices float16 as in `mmproj-*-f16.gguf`, norms and biases float32); the soft-embedding norm
  is stored with the converter's +1 already applied;
- gguf-py/gguf/constants.py: the key names (`clip.vision.*`) and tensor names (`v.*`, `mm.*`);
- tools/mtmd/clip.cpp (`load_hparams`, `load_tensors`, `PROJECTOR_TYPE_GEMMA3`) and clip-impl.h: what
  it requires (image_mean/image_std, `clip.use_gelu`; n_merge 4 unless `clip.vision.projector.scale_factor`
  is set, which the converter writes only when it is not 4);
- tools/mtmd/models/siglip.cpp: the graph (SigLIP ViT, 2D average pool of n_merge x n_merge patches,
  RMS norm times `mm.soft_emb_norm`, product with `mm.input_projection` [n_embd, n_embd_text]).

The weights are random (numpy's default_rng(seed)), scaled so activations stay near unit size; the
bytes depend only on (preset, seed).

`write_llava_mmproj` writes a llava-1.5 style projector (type `mlp`, CLIP ViT + two-layer MLP) as
llama.cpp's tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py writes one (the only converter of
llava-1.5's CLIP; conversion/llava.py takes Pixtral and Mistral only): its keys in its order, no
general.type, `clip.use_gelu` false (CLIP's quick_gelu), no post-LayerNorm (skipped for llava), the
last encoder block already dropped (`block_count` is the blocks kept), CLIP's `fc1` stored as
`ffn_down` and `fc2` as `ffn_up` (clip.cpp's is_ffn_swapped puts them back), 4-D and 2-D `.weight`
tensors float16 (the position embedding too), the rest float32, the projector's tensors first.

    .venv/bin/python -m tests.synthetic_mmproj [--llava] OUT.gguf [preset] [seed]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Gemma3Vision:
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_embd_text: int
    eps: float = 1e-6
    n_merge: int = 4  # clip.cpp's default for gemma3; the key is written only when it differs

    @property
    def n_image_tokens(self) -> int:
        return (self.image_size // self.patch_size // self.n_merge) ** 2


PRESETS = {
    # 224/14 = 16x16 patches, pooled 4x4 -> 16 image tokens; projects to Gemma 3 270M's n_embd.
    "tiny": Gemma3Vision(224, 14, 128, 512, 2, 4, 640),
    # Gemma 3 4B's SigLIP (64x64 patches -> 256 tokens); the real 4B projects to 2560, this to 640 so the
    # file runs in front of Gemma 3 270M.
    "gemma3-4b": Gemma3Vision(896, 14, 1152, 4304, 27, 16, 640),
}
IMAGE_MEAN = IMAGE_STD = (0.5, 0.5, 0.5)


def write_gemma3_mmproj(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the `preset` projector to `path` (same bytes for the same arguments); returns the path."""
    hp = PRESETS[preset]
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_name(f"synthetic-gemma3-{preset}")
    w.add_description(f"synthetic Gemma 3 projector, random weights (seed {seed}), not a trained model")
    w.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)
    w.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, "gemma3")
    w.add_uint32(gguf.Keys.ClipVision.PROJECTION_DIM, hp.n_embd_text)
    w.add_uint32(gguf.Keys.ClipVision.IMAGE_SIZE, hp.image_size)
    w.add_uint32(gguf.Keys.ClipVision.PATCH_SIZE, hp.patch_size)
    w.add_uint32(gguf.Keys.ClipVision.EMBEDDING_LENGTH, hp.n_embd)
    w.add_uint32(gguf.Keys.ClipVision.FEED_FORWARD_LENGTH, hp.n_ff)
    w.add_uint32(gguf.Keys.ClipVision.BLOCK_COUNT, hp.n_layer)
    w.add_uint32(gguf.Keys.ClipVision.Attention.HEAD_COUNT, hp.n_head)
    w.add_array(gguf.Keys.ClipVision.IMAGE_MEAN, list(IMAGE_MEAN))
    w.add_array(gguf.Keys.ClipVision.IMAGE_STD, list(IMAGE_STD))
    w.add_float32(gguf.Keys.ClipVision.Attention.LAYERNORM_EPS, hp.eps)
    w.add_bool(gguf.Keys.ClipVision.USE_GELU, True)
    if hp.n_merge != 4:
        w.add_uint32(gguf.Keys.ClipVision.Projector.SCALE_FACTOR, hp.n_merge)

    def normal(shape: tuple[int, ...], scale: float, dtype: type = np.float16) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)

    def matrix(name: str, rows: int, cols: int) -> None:  # numpy [rows, cols] = ggml ne [cols, rows]
        w.add_tensor(name, normal((rows, cols), cols**-0.5))

    def vector(name: str, n: int, center: float, scale: float) -> None:
        w.add_tensor(name, normal((n,), scale, np.float32) + np.float32(center))

    e, p = hp.n_embd, hp.patch_size
    n_pos = (hp.image_size // p) ** 2
    w.add_tensor("v.patch_embd.weight", normal((e, 3, p, p), (3 * p * p) ** -0.5, np.float32))
    vector("v.patch_embd.bias", e, 0.0, 0.02)
    w.add_tensor("v.position_embd.weight", normal((n_pos, e), 0.3, np.float32))
    for il in range(hp.n_layer):
        blk = f"v.blk.{il}"
        for ln in ("ln1", "ln2"):
            vector(f"{blk}.{ln}.weight", e, 1.0, 0.1)
            vector(f"{blk}.{ln}.bias", e, 0.0, 0.02)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            matrix(f"{blk}.{proj}.weight", e, e)
            vector(f"{blk}.{proj}.bias", e, 0.0, 0.02)
        matrix(f"{blk}.ffn_up.weight", hp.n_ff, e)
        vector(f"{blk}.ffn_up.bias", hp.n_ff, 0.0, 0.02)
        matrix(f"{blk}.ffn_down.weight", e, hp.n_ff)
        vector(f"{blk}.ffn_down.bias", e, 0.0, 0.02)
    vector("v.post_ln.weight", e, 1.0, 0.1)
    vector("v.post_ln.bias", e, 0.0, 0.02)
    vector("mm.soft_emb_norm.weight", e, 1.0, 0.1)  # the converter's "+ 1" already in
    # An nn.Parameter [n_embd, n_embd_text], not a Linear: siglip.cpp multiplies by its transpose.
    w.add_tensor("mm.input_projection.weight", normal((e, hp.n_embd_text), e**-0.5))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass(frozen=True)
class LlavaVision:
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int  # blocks in the file: the converter has dropped the model's last
    n_head: int
    n_embd_text: int
    eps: float = 1e-5  # CLIP's layer_norm_eps

    @property
    def n_image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2  # every patch, no pooling


LLAVA_PRESETS = {
    # 224/14 = 16x16 patches -> 256 image tokens (257 positions with the class embedding); 3 blocks in
    # the file, of which clip.cpp runs 2; projects to SmolLM2-135M's n_embd.
    "tiny": LlavaVision(224, 14, 128, 512, 3, 4, 576),
    # llava-1.5's CLIP ViT-L/14-336 (24x24 patches -> 576 tokens, 23 of its 24 blocks kept); the real
    # projector maps to 4096, this one to 576 so the file runs in front of SmolLM2.
    "llava-1.5": LlavaVision(336, 14, 1024, 4096, 23, 16, 576),
}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # the converter's defaults: CLIP's processor's
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The projector's last matrix is scaled so an image row's norm is near SmolLM2's token embeddings' (~3):
# random rows much larger than the text's would swamp the prompt.
LLAVA_OUT_SCALE = 0.06


def write_llava_mmproj(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the llava `preset` projector to `path` (same bytes for the same arguments); returns it."""
    hp = LLAVA_PRESETS[preset]
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    _llava_keys(w, hp, preset, seed)

    def normal(shape: tuple[int, ...], scale: float, dtype: type = np.float16) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)

    def linear(name: str, rows: int, cols: int, scale: float = 1.0) -> None:  # torch's [out, in]
        w.add_tensor(f"{name}.weight", normal((rows, cols), scale * cols**-0.5))
        w.add_tensor(f"{name}.bias", normal((rows,), 0.02, np.float32))

    def norm(name: str) -> None:
        w.add_tensor(f"{name}.weight", normal((hp.n_embd,), 0.1, np.float32) + np.float32(1.0))
        w.add_tensor(f"{name}.bias", normal((hp.n_embd,), 0.02, np.float32))

    e, p, t = hp.n_embd, hp.patch_size, hp.n_embd_text
    linear("mm.0", t, e)  # multi_modal_projector.linear_1 (the converter writes the projector first)
    linear("mm.2", t, t, LLAVA_OUT_SCALE)
    w.add_tensor("v.class_embd", normal((e,), 0.3, np.float32))
    w.add_tensor("v.patch_embd.weight", normal((e, 3, p, p), (3 * p * p) ** -0.5))  # no bias in CLIP
    w.add_tensor("v.position_embd.weight", normal(((hp.image_size // p) ** 2 + 1, e), 0.3))
    norm("v.pre_ln")
    for il in range(hp.n_layer):  # CLIPEncoderLayer's state_dict order
        blk = f"v.blk.{il}"
        for proj in ("attn_k", "attn_v", "attn_q", "attn_out"):
            linear(f"{blk}.{proj}", e, e)
        norm(f"{blk}.ln1")
        linear(f"{blk}.ffn_down", hp.n_ff, e)  # mlp.fc1, named down by the converter
        linear(f"{blk}.ffn_up", e, hp.n_ff)  # mlp.fc2
        norm(f"{blk}.ln2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _llava_keys(w: gguf.GGUFWriter, hp: LlavaVision, preset: str, seed: int) -> None:
    """The legacy converter's keys for `--llava-projector --projector-type mlp`, in its order."""
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", True)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_name(f"synthetic-llava-{preset}")
    w.add_description(f"synthetic llava projector, random weights (seed {seed}), not a trained model")
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", hp.image_size)
    w.add_uint32("clip.vision.patch_size", hp.patch_size)
    w.add_uint32("clip.vision.embedding_length", hp.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", hp.n_ff)
    w.add_uint32("clip.vision.projection_dim", 768)  # CLIP's own projection, which llava does not use
    w.add_uint32("clip.vision.attention.head_count", hp.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", hp.eps)
    w.add_uint32("clip.vision.block_count", hp.n_layer)
    w.add_array("clip.vision.image_mean", list(CLIP_MEAN))
    w.add_array("clip.vision.image_std", list(CLIP_STD))
    w.add_bool("clip.use_gelu", False)  # CLIP's hidden_act is quick_gelu


@dataclass(frozen=True)
class Idefics3Vision:
    image_size: int  # one tile's side
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_embd_text: int
    scale_factor: int  # the pixel shuffle's s
    longest_edge: int  # clip.vision.preproc_image_size
    eps: float = 1e-6  # SigLIP's layer_norm_eps

    @property
    def n_tile_tokens(self) -> int:
        return (self.image_size // self.patch_size // self.scale_factor) ** 2


IDEFICS3_PRESETS = {
    # 64/8 = 8x8 patches a tile, shuffled 2x2 -> 16 tokens a tile; up to 3x3 tiles (longest edge 192) and
    # the overview; projects to SmolLM2-135M's n_embd (SmolVLM-256M's text model is its size).
    "tiny": Idefics3Vision(64, 8, 128, 512, 2, 4, 576, 2, 192),
    # SmolVLM-256M's SigLIP (512/16 = 32x32 patches, shuffled 4x4 -> 64 tokens a tile, up to 4x4 tiles).
    "smolvlm-256m": Idefics3Vision(512, 16, 768, 3072, 12, 12, 576, 4, 2048),
}
SIGLIP_MEAN = SIGLIP_STD = (0.5, 0.5, 0.5)  # SmolVLM's preprocessor_config.json


def write_idefics3_mmproj(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """SmolVLM's projector (type `idefics3`) as conversion/smolvlm.py writes one: the MmprojModel keys, then
    projector type, layer-norm epsilon, scale factor, use_gelu and preproc_image_size (the longest edge);
    `.embeddings.` tensors float32 (the patch conv, its bias, the positions), other 2-D matrices float16
    (mm.model.fc too: the connector's bias-free Linear [n_embd_text, n_embd * s^2]), norms and biases
    float32. Same bytes for the same arguments; returns the path."""
    hp = IDEFICS3_PRESETS[preset]
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    _idefics3_keys(w, hp, preset, seed)

    def normal(shape: tuple[int, ...], scale: float, dtype: type = np.float16) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)

    def linear(name: str, rows: int, cols: int, bias: bool = True, scale: float = 1.0) -> None:
        w.add_tensor(f"{name}.weight", normal((rows, cols), scale * cols**-0.5))
        if bias:
            w.add_tensor(f"{name}.bias", normal((rows,), 0.02, np.float32))

    def norm(name: str) -> None:
        w.add_tensor(f"{name}.weight", normal((hp.n_embd,), 0.1, np.float32) + np.float32(1.0))
        w.add_tensor(f"{name}.bias", normal((hp.n_embd,), 0.02, np.float32))

    e, p = hp.n_embd, hp.patch_size
    w.add_tensor("v.patch_embd.weight", normal((e, 3, p, p), (3 * p * p) ** -0.5, np.float32))
    w.add_tensor("v.patch_embd.bias", normal((e,), 0.02, np.float32))
    w.add_tensor("v.position_embd.weight", normal(((hp.image_size // p) ** 2, e), 0.3, np.float32))
    for il in range(hp.n_layer):
        blk = f"v.blk.{il}"
        for proj in ("attn_k", "attn_v", "attn_q", "attn_out"):
            linear(f"{blk}.{proj}", e, e)
        norm(f"{blk}.ln1")
        linear(f"{blk}.ffn_up", hp.n_ff, e)  # SigLIP's fc1
        linear(f"{blk}.ffn_down", e, hp.n_ff)  # fc2
        norm(f"{blk}.ln2")
    norm("v.post_ln")
    # scaled so an image row's norm is near SmolLM2's token embeddings', as LLAVA_OUT_SCALE
    linear("mm.model.fc", hp.n_embd_text, e * hp.scale_factor**2, bias=False, scale=IDEFICS3_OUT_SCALE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


IDEFICS3_OUT_SCALE = 0.1


def _idefics3_keys(w: gguf.GGUFWriter, hp: Idefics3Vision, preset: str, seed: int) -> None:
    """conversion/smolvlm.py's keys (after MmprojModel's), in its order."""
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"synthetic-idefics3-{preset}")
    w.add_description(f"synthetic SmolVLM projector, random weights (seed {seed}), not a trained model")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)
    w.add_uint32(gguf.Keys.ClipVision.PROJECTION_DIM, hp.n_embd_text)
    w.add_uint32(gguf.Keys.ClipVision.IMAGE_SIZE, hp.image_size)
    w.add_uint32(gguf.Keys.ClipVision.PATCH_SIZE, hp.patch_size)
    w.add_uint32(gguf.Keys.ClipVision.EMBEDDING_LENGTH, hp.n_embd)
    w.add_uint32(gguf.Keys.ClipVision.FEED_FORWARD_LENGTH, hp.n_ff)
    w.add_uint32(gguf.Keys.ClipVision.BLOCK_COUNT, hp.n_layer)
    w.add_uint32(gguf.Keys.ClipVision.Attention.HEAD_COUNT, hp.n_head)
    w.add_array(gguf.Keys.ClipVision.IMAGE_MEAN, list(SIGLIP_MEAN))
    w.add_array(gguf.Keys.ClipVision.IMAGE_STD, list(SIGLIP_STD))
    w.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, "idefics3")
    w.add_float32(gguf.Keys.ClipVision.Attention.LAYERNORM_EPS, hp.eps)
    w.add_uint32(gguf.Keys.ClipVision.Projector.SCALE_FACTOR, hp.scale_factor)
    w.add_bool(gguf.Keys.ClipVision.USE_GELU, True)
    w.add_uint32(gguf.Keys.ClipVision.PREPROC_IMAGE_SIZE, hp.longest_edge)


if __name__ == "__main__":
    args = sys.argv[1:]
    writer = write_gemma3_mmproj
    if args[0] == "--llava":
        writer, args = write_llava_mmproj, args[1:]
    elif args[0] == "--idefics3":
        writer, args = write_idefics3_mmproj, args[1:]
    out, *rest = args
    writer(out, rest[0] if rest else "tiny", int(rest[1]) if len(rest) > 1 else 0)
