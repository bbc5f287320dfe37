"""SmolVLM / Idefics3's projector (llama.cpp's projector type `idefics3`: tools/mtmd/models/siglip.cpp's
idefics3 branch, mtmd-image.cpp's mtmd_image_preprocessor_idefics3, mtmd.cpp's MTMD_SLICE_TMPL_IDEFICS3),
on vision.py's SigLIP encoder.

Preprocessing (files with clip.vision.preproc_image_size, the longest edge, as the converter writes it):
the image resized, keeping its aspect ratio, so that its longer side is the longest edge (the other side
truncated, then made even); resized again, ignoring the ratio, up to whole tiles of image_size on each
side; that cut into grid_y x grid_x tiles, row after row; the overview is the refined image resized to
one tile. Every resize is mtmd-image.cpp's Lanczos-3 (preprocess.resize_pillow). Each tile and the
overview normalised with the file's mean and std.

Encoder and projector, per tile: the SigLIP blocks and post-LayerNorm (vision.py), then the pixel
shuffle by s = clip.vision.projector.scale_factor (clip_graph::build_patch_merge_permute: each s x s
window of patches becomes one row, its patches concatenated row by row, windows row-major), then
mm.model.fc (no bias): [(side / s)^2, n_embd_text] per tile.

The prompt (mtmd.cpp, after HF's processing_idefics3.py): for each tile `<fake_token_around_image>
<row_R_col_C>` (tokenized) then its rows; "\\n" after each row of tiles but the last; then "\\n\\n",
`<fake_token_around_image>`, `<global-img>` (each the token whose text it is: mtmd's lookup_token), the
overview's rows, `<fake_token_around_image>`. All causal (mtmd_decode_use_non_causal is false).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.chunks import SlicedImage, TokenText
from engine.media.preprocess import MediaError, decode_image, normalize, resize_pillow
from engine.media.vision import SiglipEncoder
from engine.models.encoder import linear

if TYPE_CHECKING:
    from engine.media.mmproj import ProjectorHParams

FAKE = "<fake_token_around_image>"
GLOBAL = "<global-img>"
ROW_END = TokenText("\n")
OVERVIEW_BEGIN = (TokenText("\n\n"), TokenText(FAKE), TokenText(GLOBAL))
OVERVIEW_END = (TokenText(FAKE),)


def refined_sizes(
    width: int, height: int, tile: int, longest_edge: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((width, height) after the ratio-keeping resize, (grid_x, grid_y) of tiles), as
    mtmd_image_preprocessor_idefics3 computes them (a double ratio; C's truncating int cast)."""
    aspect = width / height
    if width >= height:
        w, h = longest_edge, int(longest_edge / aspect)
        h += h % 2
    else:
        w, h = int(longest_edge * aspect), longest_edge
        w += w % 2
    if w <= 0 or h <= 0:  # llama.cpp asserts here; an image this thin is the request's fault
        raise MediaError(f"a {width}x{height} image resizes to {w}x{h} for a {longest_edge} longest edge")
    return (w, h), ((w + tile - 1) // tile, (h + tile - 1) // tile)


def slice_image(
    img: np.ndarray, tile: int, longest_edge: int, algo: str
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """uint8 [H, W, 3] -> (the tiles row-major, the overview, grid_x): each [tile, tile, 3]."""
    (w, h), (grid_x, grid_y) = refined_sizes(img.shape[1], img.shape[0], tile, longest_edge)
    # resize_pillow keeps a side that does not change, as img_tool::resize and its passes do
    refined = resize_pillow(resize_pillow(img, w, h, algo), grid_x * tile, grid_y * tile, algo)
    overview = resize_pillow(refined, tile, tile, algo)
    tiles = [
        refined[y * tile : (y + 1) * tile, x * tile : (x + 1) * tile]
        for y in range(grid_y)
        for x in range(grid_x)
    ]
    return tiles, overview, grid_x


def pixel_shuffle(x: np.ndarray, side: int, scale: int) -> np.ndarray:
    """[side * side, n_embd] patch rows -> [(side / scale)^2, scale^2 * n_embd]: ggml's reshapes and
    permutes in build_patch_merge_permute, the grid first padded with zeros to a multiple of scale
    (ggml_pad). Data movement only: exact."""
    n_embd = x.shape[1]
    grid = x.reshape(side, side, n_embd)
    padded = -(-side // scale) * scale
    if padded != side:
        grid = np.pad(grid, ((0, padded - side), (0, padded - side), (0, 0)))
    n = padded // scale
    windows = grid.reshape(n, scale, n, scale, n_embd).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(windows.reshape(n * n, scale * scale * n_embd))


def prompt_layout(tiles: list[np.ndarray], overview: np.ndarray, grid_x: int) -> SlicedImage:
    """mtmd's chunks of one image with their text, in prompt order (tiles' and overview's rows given)."""
    grid_y = len(tiles) // grid_x
    pieces: list[str | TokenText | np.ndarray] = []
    for y in range(grid_y):
        for x in range(grid_x):
            pieces += [f"{FAKE}<row_{y + 1}_col_{x + 1}>", tiles[y * grid_x + x]]
        if y != grid_y - 1:  # no trailing row end: the overview's "\n\n" follows
            pieces.append(ROW_END)
    pieces += [*OVERVIEW_BEGIN, overview, *OVERVIEW_END]
    return SlicedImage(tuple(pieces))


class Idefics3Projector:
    """A loaded idefics3 projector: `encode_image(bytes)` -> a SlicedImage, each tile's and the overview's
    [n_tile_tokens, n_embd_text] rows with the text mtmd puts around them; decoded causally."""

    image_begin = ""
    image_end = ""
    modalities = frozenset({"image"})
    non_causal = False
    lookup_texts = ("\n", "\n\n", FAKE, GLOBAL)  # what the text model's vocabulary must hold

    def __init__(self, g: GGUFFile, hp: ProjectorHParams, backend: Backend) -> None:
        self.hparams, self.backend = hp, backend
        self.encoder = SiglipEncoder(g, hp, backend)
        self.fc = linear(backend, g, "mm.model.fc", bias=False)
        self.n_embd_text = int(g.tensors["mm.model.fc.weight"].shape[0])
        self.n_tile_tokens = (-(-hp.n_patches_side // hp.n_merge)) ** 2

    def preprocess(self, data: bytes) -> tuple[list[np.ndarray], np.ndarray, int]:
        """(each tile's pixels, the overview's: float32 [3, image_size, image_size], grid_x)."""
        hp = self.hparams
        tiles, overview, grid_x = slice_image(
            decode_image(data), hp.image_size, hp.longest_edge, hp.resize_algo
        )
        mean, std = hp.image_mean, hp.image_std
        return [normalize(t, mean, std) for t in tiles], normalize(overview, mean, std), grid_x

    def encode_image(self, data: bytes) -> SlicedImage:
        """An encoded image (any format Pillow reads; MediaError if none) as its chunks and their text."""
        tiles, overview, grid_x = self.preprocess(data)
        rows = [self.encode_pixels(t) for t in tiles]
        return prompt_layout(rows, self.encode_pixels(overview), grid_x)

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """One tile's pixels [3, image_size, image_size] -> float32 [n_tile_tokens, n_embd_text]."""
        be, hp = self.backend, self.hparams
        # the shuffle on the host: a reshape and transpose of one [n_patches, n_embd] array per tile
        merged = pixel_shuffle(be.download(self.encoder(pixels)), hp.n_patches_side, hp.n_merge)
        (out,) = self.fc(be.upload(merged))
        return be.download(out)
