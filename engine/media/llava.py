"""llava-1.5's vision tower and projector (llama.cpp's tools/mtmd/models/llava.cpp, projector type `mlp`,
without image_grid_pinpoints), on vision.py's SigLIP encoder generalised to CLIP.

Encoder (CLIP ViT, clip_graph_llava): vision.py's patch embedding, then the class embedding appended
AFTER the patches (`ggml_concat(patches, class_embd, 1)`: row n_patches, not HF's row 0), the learned
positions 0..n_patches added row by row, the pre-LayerNorm, then the first `max_feature_layer` blocks:
the deepest clip.vision.feature_layer, else all of the file's blocks but its last (the legacy converter
has already dropped the model's own last block; llama.cpp runs one fewer still), then the
post-LayerNorm where the file has one (the converter drops it for llava). The feed-forward is quick GELU
unless clip.use_gelu. Projector: rows 1..n_patches of the states (clip.cpp's `patches` input is i + 1
when there is a class row: patch (0, 0)'s row is dropped and the class row kept, last), mm.0 plus its
bias, GELU (ggml_gelu, the tanh form), mm.2 plus its bias: [n_patches, n_embd_text].

mtmd puts no text around a llava image and decodes its tokens causally (mtmd_decode_use_non_causal is
false for `mlp`). The pixels are mtmd_image_preprocessor_fixed_size's with llava's settings: bicubic
(clip.cpp's default), the image fitted in the square (PAD_CEIL) on image_pad_color (122, 116, 104).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.preprocess import decode_image, normalize, resize_padded
from engine.media.vision import SiglipEncoder
from engine.models.encoder import FeedForward, host_vector, linear

if TYPE_CHECKING:
    from engine.media.mmproj import ProjectorHParams

GELU_QUICK_COEF = np.float32(-1.702)


def _gelu_quick_table() -> np.ndarray:
    """ggml_table_gelu_quick_f16: x / (1 + exp(-1.702 x)) in float32 for every float16 x, stored as
    float16; ggml's CPU quick GELU looks each activation up by its float16 rounding (GGML_GELU_QUICK_FP16,
    no clamp, unlike its GELU)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x * (np.float32(1.0) / (np.float32(1.0) + np.exp(GELU_QUICK_COEF * x)))
    return y.astype(np.float16)


GELU_QUICK_TABLE = _gelu_quick_table()


def gelu_quick(x: np.ndarray) -> np.ndarray:
    """ggml's CPU quick GELU of a float32 array (a new float32 array)."""
    return GELU_QUICK_TABLE[x.astype(np.float16).view(np.uint16)].astype(np.float32)


class QuickGeluFeedForward:
    """CLIP's feed-forward, down(gelu_quick(up x)). No backend kernel computes quick GELU (the kernels are
    not recompiled for one activation): the up projection's output takes a round trip through the host
    table, one [n_pos, n_ff] array a block."""

    def __init__(self, ffn: FeedForward) -> None:
        self.backend, self.up, self.down = ffn.backend, ffn.up, ffn.down

    def __call__(self, x: Any) -> Any:
        be = self.backend
        (h,) = self.up(x)
        (out,) = self.down(be.upload(gelu_quick(be.download(h))))
        return out


def max_feature_layer(hp: ProjectorHParams) -> int:
    """The blocks clip_graph_llava runs: up to the deepest feature layer, else n_layer - 1."""
    deepest = max(hp.feature_layers, default=-1)
    return deepest if deepest >= 0 else max(hp.n_layer - 1, 0)


class ClipEncoder(SiglipEncoder):
    """Pixels -> the states of the patches and, where the file has one, the class row (last):
    [n_patches (+ 1), n_embd]."""

    def __init__(self, g: GGUFFile, hp: ProjectorHParams, backend: Backend) -> None:
        super().__init__(g, hp, backend, n_run=max_feature_layer(hp))
        self.class_embd = host_vector(g, "v.class_embd") if "v.class_embd" in g.tensors else None
        if hp.ffn_op == "gelu_quick":
            for layer in self.layers:
                layer.ffn = QuickGeluFeedForward(layer.ffn)
        # the blocks past the feature layer are in the file but never run: llama.cpp loads them and does
        # not use them either, so they are no unknown tensors
        skipped = tuple(f"v.blk.{il}." for il in range(len(self.layers), hp.n_layer))
        g.tensors.read.update(name for name in g.tensors if name.startswith(skipped))

    def embed(self, pixels: np.ndarray) -> Any:
        """The patch embeddings, the class row after them, then positions 0..n_patches added: llava.cpp's
        order, which gives the class row the last position (HF gives it the first)."""
        be, x = self.backend, self.patch_embeddings(pixels)
        if self.class_embd is not None:  # appended on the host: one [n_patches, n_embd] round trip
            x = be.upload(np.concatenate([be.download(x), self.class_embd[None, :]]))
        be.add_inplace(x, self.positions)
        return x


class LlavaProjector:
    """A loaded `mlp` projector: `encode_image(bytes)` -> float32 [n_image_tokens, n_embd_text], the rows
    the text model reads at the image's positions, causally, with no text around them."""

    image_begin = ""
    image_end = ""
    modalities = frozenset({"image"})
    non_causal = False

    def __init__(self, g: GGUFFile, hp: ProjectorHParams, backend: Backend) -> None:
        self.hparams, self.backend = hp, backend
        self.encoder = ClipEncoder(g, hp, backend)
        self.mm_0, self.mm_2 = linear(backend, g, "mm.0"), linear(backend, g, "mm.2")
        self.n_embd_text = int(g.tensors["mm.2.weight"].shape[0])
        self.n_image_tokens = hp.n_patches_side**2
        offset = 1 if self.encoder.class_embd is not None else 0  # clip.cpp's patch_offset
        self.rows = np.arange(offset, offset + self.n_image_tokens, dtype=np.int32)

    def preprocess(self, data: bytes) -> np.ndarray:
        """The image's pixels as the encoder reads them: float32 [3, image_size, image_size]."""
        hp = self.hparams
        square = resize_padded(decode_image(data), hp.image_size, hp.resize_algo, hp.pad_color)
        return normalize(square, hp.image_mean, hp.image_std)

    def encode_image(self, data: bytes) -> np.ndarray:
        """An encoded image (any format Pillow reads; MediaError if none) as the text model's embeddings."""
        return self.encode_pixels(self.preprocess(data))

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Preprocessed pixels [3, image_size, image_size] -> float32 [n_image_tokens, n_embd_text]."""
        be = self.backend
        (h,) = self.mm_0(be.take_rows(self.encoder(pixels), self.rows))
        assert be.gelu is not None  # mmproj.check_supported refuses a backend without it
        be.gelu(h, h)
        (out,) = self.mm_2(h)
        return be.download(out)
