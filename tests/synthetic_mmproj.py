"""Synthetic Gemma 3 vision projectors (mmproj GGUFs) with seeded random weights.

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

    .venv/bin/python -m tests.synthetic_mmproj OUT.gguf [preset] [seed]
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


if __name__ == "__main__":
    out, *rest = sys.argv[1:]
    write_gemma3_mmproj(out, rest[0] if rest else "tiny", int(rest[1]) if len(rest) > 1 else 0)
