"""The SigLIP vision encoder and Gemma 3's projector (llama.cpp's tools/mtmd/models/siglip.cpp over
clip.cpp's build_vit, projector type `gemma3`), on the backend's encoder kernels.

Encoder: the patch embedding (a conv of stride patch_size, run as one matmul over the flattened patches
in im2col's order: channel, row, column) plus its bias and the learned position embeddings; then
pre-LayerNorm blocks: LayerNorm, non-causal multi-head attention (Q/K/V/out with biases) added back, then
LayerNorm, the GELU feed-forward added back; the post-LayerNorm. Every LayerNorm's epsilon is
clip.vision.attention.layer_norm_epsilon. Projector: the patch grid average-pooled n_merge x n_merge
(ggml_pool_2d, a float32 sum in row order then the division), RMS-normed (same epsilon) times
mm.soft_emb_norm, then multiplied by mm.input_projection transposed: [n_image_tokens, n_embd_text].

The layers are the encoders' (engine/models/encoder.py): `LayerNorm`, `qkv_projection`, `EncoderAttention`
with every token over the one image's patches, `FeedForward`. One image per call; nothing is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.preprocess import preprocess_fixed_size
from engine.models.encoder import (
    EncoderAttention,
    EncoderHParams,
    FeedForward,
    LayerNorm,
    Pass,
    host_matrix,
    host_vector,
    linear,
    qkv_projection,
)
from engine.models.llama import norm_weight

if TYPE_CHECKING:
    from engine.media.mmproj import ProjectorHParams

FLOAT_TYPES = {0: np.float32, 1: np.uint16, 30: np.int16}  # F32, F16, BF16 as quant.pack_weight views them


def pack_float(backend: Backend, g: GGUFFile, name: str, transpose: bool = False) -> Any:
    """A float matrix packed in its own type, viewed as 2-D (rows = its first dimension); `transpose`
    packs its transpose (exact: the elements are moved, not converted)."""
    t = g.tensors[name]
    rows, cols = t.shape[0], int(np.prod(t.shape[1:]))
    data = np.asarray(t.data).view(FLOAT_TYPES[t.ggml_type]).reshape(rows, cols)
    if transpose:
        data, rows, cols = np.ascontiguousarray(data.T), cols, rows
    return backend.pack_weight(data, t.ggml_type, (rows, cols))


def tower_sizes(key: Callable[..., Any]) -> dict[str, Any]:
    """An encoder tower's sizes as clip.cpp reads them under clip.vision.* or clip.audio.* (`key(name,
    default)` reads one and refuses a missing one): KV heads and head width default as there."""
    n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
    return {
        "n_embd": n_embd,
        "n_ff": int(key("feed_forward_length")),
        "n_head": n_head,
        "n_head_kv": int(key("attention.head_count_kv", n_head)),
        "head_dim": int(key("attention.head_dim", n_embd // n_head)),
        "n_layer": int(key("block_count")),
        "eps": float(key("attention.layer_norm_epsilon")),
    }


def encoder_hparams(hp: Any, n_ctx: int) -> EncoderHParams:
    """The encoders' hyper-parameters for a tower with `tower_sizes`' fields over `n_ctx` rows (an image's
    patches, an audio window's frames): non-causal, no RoPE (positions are added)."""
    return EncoderHParams(
        arch="clip",
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_ff=hp.n_ff,
        n_head=hp.n_head,
        n_kv_head=hp.n_head_kv,
        head_dim=hp.head_dim,
        n_vocab=0,
        n_ctx_train=n_ctx,
        norm_eps=hp.eps,
        causal=False,
        rope_base=0.0,
        n_rot=0,
    )


def optional_norm(backend: Backend, g: GGUFFile, name: str, eps: float) -> LayerNorm | None:
    """A LayerNorm build_vit applies where the file has it (v.pre_ln, v.post_ln)."""
    return LayerNorm(backend, g, name, eps, bias="optional") if f"{name}.weight" in g.tensors else None


class VisionLayer:
    """One pre-norm block's weights. Up and down are swapped back where an old conversion swapped them
    (clip.cpp's is_ffn_swapped: a `down` whose input is n_embd wide)."""

    def __init__(self, backend: Backend, g: GGUFFile, hp: EncoderHParams, il: int) -> None:
        p = f"v.blk.{il}."
        self.ln1 = LayerNorm(backend, g, p + "ln1", hp.norm_eps, bias="optional")
        qkv = qkv_projection(backend, g, hp, p)
        self.attn = EncoderAttention(hp, backend, qkv, linear(backend, g, p + "attn_out"))
        self.ln2 = LayerNorm(backend, g, p + "ln2", hp.norm_eps, bias="optional")
        up, down = p + "ffn_up", p + "ffn_down"
        if g.tensors[down + ".weight"].shape[-1] == hp.n_embd:
            up, down = down, up
        self.ffn = FeedForward(backend, linear(backend, g, up), linear(backend, g, down), "seq")
        self.backend = backend

    def __call__(self, x: Any, step: Pass) -> Any:
        cur = self.attn(self.ln1(x), step)
        self.backend.add_inplace(cur, x)  # the residual
        out = self.ffn(self.ln2(cur))
        self.backend.add_inplace(out, cur)
        return out


def run_blocks(backend: Backend, x: Any, pre_ln: Any, layers: list[Any], post_ln: Any) -> Any:
    """An encoder's blocks over one input (an image's patches, an audio window's frames): the optional
    pre-LayerNorm, every block with every row over all of them (no mask, no window), the optional
    post-LayerNorm."""
    n = x.shape[0]
    if pre_ln is not None:
        x = pre_ln(x, x)
    step = Pass(backend.upload(np.arange(n, dtype=np.int32)), np.tile(np.array([[0, n]], np.int64), (n, 1)))
    for layer in layers:
        x = layer(x, step)
    return x if post_ln is None else post_ln(x, x)


class SiglipEncoder:
    """Pixels [3, H, W] -> the post-LayerNormed states of the patches, [n_patches, n_embd], row-major over
    the patch grid (patch (y, x) at row y * side + x, as the conv's output is laid out). `n_run`: the
    blocks built and run, the first n_run of the file's (all by default; llava's CLIP stops earlier);
    a subclass may add rows in `embed` (CLIP's class embedding)."""

    def __init__(self, g: GGUFFile, hp: ProjectorHParams, backend: Backend, n_run: int | None = None) -> None:
        self.hp, self.backend = hp, backend
        enc = encoder_hparams(hp, hp.n_patches_side**2)
        self.patch_embd = pack_float(backend, g, "v.patch_embd.weight")
        bias = "v.patch_embd.bias"
        self.patch_bias = backend.upload(host_vector(g, bias)) if bias in g.tensors else None
        self.positions = backend.upload(host_matrix(g, "v.position_embd.weight"))
        self.pre_ln = optional_norm(backend, g, "v.pre_ln", hp.eps)
        self.layers = []
        for il in range(hp.n_layer if n_run is None else n_run):
            self.layers.append(VisionLayer(backend, g, enc, il))
            g.release_pages()  # each layer's file pages once packed (engine/gguf.py)
        self.post_ln = optional_norm(backend, g, "v.post_ln", hp.eps)

    def patches(self, pixels: np.ndarray) -> np.ndarray:
        """[n_patches, 3 * ps * ps]: each patch flattened as im2col lays it out (channel, row, column);
        pixels past the last whole patch are dropped, as the stride-ps conv drops them."""
        ps, side = self.hp.patch_size, self.hp.n_patches_side
        grid = pixels[:, : side * ps, : side * ps].reshape(3, side, ps, side, ps)
        return np.ascontiguousarray(grid.transpose(1, 3, 0, 2, 4).reshape(side * side, 3 * ps * ps))

    def patch_embeddings(self, pixels: np.ndarray) -> Any:
        """The conv over the patches plus its bias: [n_patches, n_embd]."""
        be = self.backend
        x = be.empty((self.hp.n_patches_side**2, self.hp.n_embd))
        be.matmul(be.upload(self.patches(pixels)), self.patch_embd, x)
        if self.patch_bias is not None:
            be.add_bias_inplace(x, self.patch_bias)
        return x

    def embed(self, pixels: np.ndarray) -> Any:
        """The encoder's input rows: the patch embeddings plus the learned positions."""
        x = self.patch_embeddings(pixels)
        self.backend.add_inplace(x, self.positions)
        return x

    def __call__(self, pixels: np.ndarray) -> Any:
        return run_blocks(self.backend, self.embed(pixels), self.pre_ln, self.layers, self.post_ln)


class Projector:
    """A loaded gemma3 projector: `encode_image(bytes)` -> float32 [n_image_tokens, n_embd_text], the
    embeddings the text model reads between `image_begin` and `image_end` (mtmd decodes them with
    non-causal attention: `non_causal`)."""

    image_begin = "<start_of_image>"
    image_end = "<end_of_image>"
    modalities = frozenset({"image"})
    non_causal = True

    def __init__(self, g: GGUFFile, hp: ProjectorHParams, backend: Backend) -> None:
        self.hparams, self.backend = hp, backend
        self.encoder = SiglipEncoder(g, hp, backend)
        self.soft_emb_norm = norm_weight(backend, g, "mm.soft_emb_norm.weight")
        # mm.input_projection is [n_embd, n_embd_text] as rows: llama.cpp multiplies by its transpose
        self.input_projection = pack_float(backend, g, "mm.input_projection.weight", transpose=True)
        self.n_embd_text = int(g.tensors["mm.input_projection.weight"].shape[1])
        self.n_image_tokens = hp.n_image_tokens

    def preprocess(self, data: bytes) -> np.ndarray:
        """The image's pixels as the encoder reads them: float32 [3, image_size, image_size]."""
        hp = self.hparams
        return preprocess_fixed_size(data, hp.image_size, hp.image_mean, hp.image_std, hp.resize_algo)

    def encode_image(self, data: bytes) -> np.ndarray:
        """An encoded image (any format Pillow reads; MediaError if none) as the text model's embeddings."""
        return self.encode_pixels(self.preprocess(data))

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Preprocessed pixels [3, image_size, image_size] -> float32 [n_image_tokens, n_embd_text]."""
        be = self.backend
        x = self.pool(self.encoder(pixels))
        be.rmsnorm(x, self.soft_emb_norm, self.hparams.eps, x)
        out = be.empty((x.shape[0], self.n_embd_text))
        be.matmul(x, self.input_projection, out)
        return be.download(out)

    def pool(self, x: Any) -> Any:
        """ggml_pool_2d's average over n_merge x n_merge windows of the patch grid: each window summed in
        float32, row after row, then divided; the pooled grid row-major again. On the host: no kernel
        pools, and it is 1/n_merge^2 of one layer's reads."""
        k, side = self.hparams.n_merge, self.hparams.n_patches_side
        grid = self.backend.download(x).reshape(side, side, -1)
        out_side = side // k
        acc = np.zeros((out_side, out_side, grid.shape[2]), np.float32)
        for ky in range(k):
            for kx in range(k):
                acc += grid[ky : out_side * k : k, kx : out_side * k : k]
        acc /= np.float32(k * k)
        return self.backend.upload(acc.reshape(out_side * out_side, -1))
