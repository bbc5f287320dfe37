"""An image's bytes as the pixels a vision encoder reads, as llama.cpp's mtmd does it.

Decoding: llama.cpp reads images with stb_image (`stbi_load_from_memory(..., 3)`): any layout becomes
8-bit RGB (grey replicated, alpha dropped without compositing, 16-bit samples by their high byte), the
first frame of an animation, and EXIF orientation is ignored. Pillow decodes here (more formats than
stb: WebP, TIFF...) and is made to give the same: `convert("RGB")` drops alpha the same way, and nothing
transposes by EXIF. JPEG decoders may differ by a unit here and there (libjpeg-turbo's IDCT against
stb's); tests/test_media_projector.py measures what that does to the embeddings.

Resizing: mtmd-image.cpp's own `resize_pillow` (Pillow's separable resampling with 22-bit fixed-point
weights), reimplemented in numpy bit for bit; the fixed-size rule (`mtmd_image_preprocessor_fixed_size`
with llama.cpp's default PAD_CEIL) scales the image to fit the square, keeping its aspect ratio, and
centres it on black. Normalisation: x / 255, then (x - mean) / std per channel, in float32.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import numpy as np

PRECISION_BITS = 32 - 8 - 2  # mtmd-image.cpp's (and Pillow's) fixed-point weights: 22 fractional bits
MAX_TARGET = 65536  # resize_pillow's bound on a target side
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}


class MediaError(ValueError):
    """Media the server cannot read (bad bytes, an unknown format): the request's fault, a 400."""


def decode_image(data: bytes) -> np.ndarray:
    """uint8 [H, W, 3] RGB of an encoded image (any format Pillow reads); MediaError when it is none."""
    from PIL import Image  # Pillow loads only once media arrives

    if not data:
        raise MediaError("the image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.seek(0)  # the first frame of an animation, as stb_image reads it
            if image.mode.startswith("I;16"):
                # 16-bit grey: Pillow's own conversion clips at 255, stb keeps the high byte
                grey = (np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8)
                return np.repeat(grey[:, :, None], 3, axis=2)
            rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except Exception as exc:  # a decoder fails in many ways on bad bytes: each is the request's fault
        raise MediaError(f"cannot decode the image ({len(data)} bytes): {exc}") from None
    if rgb.ndim != 3 or rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise MediaError(f"the image decodes to no pixels ({rgb.shape})")
    return np.ascontiguousarray(rgb)


def _sinc(v: float) -> float:
    if v == 0.0:
        return 1.0
    pi_v = v * math.pi
    return math.sin(pi_v) / pi_v


def _lanczos(x: np.ndarray) -> np.ndarray:
    """Lanczos-3 on [-3, 3) as the C lambda computes it: libm's sin per tap (math.sin is the C library's;
    a vectorised sin may differ in the last bit, and the weights are rounded to 22 bits after)."""
    flat = [_sinc(v) * _sinc(v / 3.0) if -3.0 <= v < 3.0 else 0.0 for v in x.ravel().tolist()]
    return np.asarray(flat, dtype=np.float64).reshape(x.shape)


def _filter(algo: str) -> Callable[[np.ndarray], np.ndarray]:
    """mtmd-image.cpp's resample_filter: the triangle, the cubic with Pillow's a = -0.5, or Lanczos-3."""
    if algo == "bilinear":
        return lambda x: np.where(np.abs(x) < 1.0, 1.0 - np.abs(x), 0.0)
    if algo == "lanczos":
        return _lanczos

    def cubic(x: np.ndarray) -> np.ndarray:
        a, x = -0.5, np.abs(x)
        near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        far = (((x - 5) * x + 8) * x - 4) * a
        return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))

    return cubic


def resample_weights(in_size: int, out_size: int, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """(first input index [out], int32 fixed-point weights [out, ksize], zero past each pixel's taps):
    precompute_weights in float64 as the C code runs it (its sum taken tap after tap)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)  # upsampling keeps the filter sharp, downsampling widens it
    support = _SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    # C's int cast truncates toward zero, then the bounds are clamped
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    xcnt = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)[None, :]
    w = _filter(algo)((taps + xmin[:, None] - center[:, None] + 0.5) * (1.0 / filterscale))
    w = np.where(taps < xcnt[:, None], w, 0.0)
    total = np.zeros(out_size)
    for x in range(ksize):  # in order: the float64 sum rounds as the C loop's does
        total += w[:, x]
    w = np.divide(w, total[:, None], out=w.copy(), where=total[:, None] != 0.0)
    fixed = np.trunc(w * float(1 << PRECISION_BITS) + np.where(w < 0, -0.5, 0.5))
    return xmin, fixed.astype(np.int32)


def _resample_axis(img: np.ndarray, out_size: int, axis: int, algo: str) -> np.ndarray:
    """One separable pass over `axis` (1: horizontal, 0: vertical) in int32 fixed point, rounded by the
    added half and clipped to 0..255 as the C loops do."""
    in_size = img.shape[axis]
    xmin, weights = resample_weights(in_size, out_size, algo)
    shape = list(img.shape)
    shape[axis] = out_size
    acc = np.full(shape, 1 << (PRECISION_BITS - 1), dtype=np.int32)
    for x in range(weights.shape[1]):
        k = weights[:, x]
        rows = np.minimum(xmin + x, in_size - 1)  # a tap past the end has weight 0
        taps = np.take(img, rows, axis=axis).astype(np.int32)
        acc += taps * (k[None, :, None] if axis == 1 else k[:, None, None])
    return np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)


def resize_pillow(img: np.ndarray, width: int, height: int, algo: str = "bilinear") -> np.ndarray:
    """mtmd-image.cpp's resize_pillow: uint8 [H, W, 3] to [height, width, 3], horizontal pass first."""
    if algo not in _SUPPORT:
        raise ValueError(f"unsupported resize algorithm {algo!r} (supported: {', '.join(_SUPPORT)})")
    if not (0 < width <= MAX_TARGET and 0 < height <= MAX_TARGET):
        raise MediaError(f"resize target {width}x{height} is out of range (max {MAX_TARGET})")
    out = img
    if width != img.shape[1]:
        out = _resample_axis(out, width, 1, algo)
    if height != img.shape[0]:
        out = _resample_axis(out, height, 0, algo)
    return out


def resize_padded(
    img: np.ndarray, size: int, algo: str = "bilinear", color: tuple[int, int, int] = (0, 0, 0)
) -> np.ndarray:
    """img_tool::resize to a size x size square with PAD_CEIL: scaled (float32 arithmetic, ceil) to fit,
    centred on `color` (black; llava's image_pad_color). An image already that size is kept as it is."""
    h, w = img.shape[:2]
    if (h, w) == (size, size):
        return img
    scale = min(np.float32(size) / np.float32(w), np.float32(size) / np.float32(h))
    new_w = min(int(math.ceil(np.float32(w) * scale)), size)
    new_h = min(int(math.ceil(np.float32(h) * scale)), size)
    out = np.empty((size, size, 3), dtype=np.uint8)
    out[:, :] = np.asarray(color, dtype=np.uint8)
    x0, y0 = (size - new_w) // 2, (size - new_h) // 2
    out[y0 : y0 + new_h, x0 : x0 + new_w] = resize_pillow(img, new_w, new_h, algo)
    return out


def normalize(img: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """float32 [3, H, W] (the planar layout the patch embedding reads): (x / 255 - mean) / std, each step
    rounded to float32 as clip_image_f32's from_u8 and normalize round it."""
    x = img.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean[:3], np.float32)) / np.asarray(std[:3], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess_fixed_size(
    data: bytes, size: int, mean: tuple[float, ...], std: tuple[float, ...], algo: str = "bilinear"
) -> np.ndarray:
    """mtmd_image_preprocessor_fixed_size on encoded bytes: float32 [3, size, size]."""
    return normalize(resize_padded(decode_image(data), size, algo), mean, std)
