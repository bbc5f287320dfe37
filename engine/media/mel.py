"""Whisper's log-mel spectrogram as llama.cpp's mtmd computes it (tools/mtmd/mtmd-audio.cpp,
`mtmd_audio_preprocessor_whisper`), in numpy, step for step in the same arithmetic.

16 kHz mono samples -> float32 [n_mel, 3000] windows of 30 s:

- the tables (`mtmd_audio_cache`): sin/cos of 2 pi i / n_fft through the C library's sinf/cosf of the
  float-rounded angle (as the C++ calls them), a periodic Hann window 0.5 (1 - cosf(2 pi i / N)) in
  double, and the Slaney-scale mel filter bank (librosa's default: linear below 1 kHz, logarithmic
  above, area-normalised) built in double, stored in float;
- padding: a signal shorter than n_fft / 2 + 1 samples is zero-padded to that first; then n_fft / 2
  samples reflected at the start (x[n_fft/2] .. x[1]), and 30 s plus n_fft / 2 zeros at the end;
- frames of n_fft samples every hop, times the window, through mtmd's own radix-2 FFT (a float32
  Cooley-Tukey recursion down to an odd length, then a float32 DFT; for n_fft 400: 400 -> 25), the power
  |X|^2 in float;
- mel energies: each mel's dot product with the power spectrum summed in double, four float products
  at a time added in float first (the loop llama.cpp unrolls), floored at 2^-24, log10 in double, stored
  as float;
- whisper's normalisation over the whole padded signal: clamp at (max - 8), then (x + 4) / 4;
- windows: whole 3000-frame windows from the start; the last, incomplete one (always silence: 30 s of
  zeros were appended) is dropped.

Each window becomes its own audio chunk in mtmd (`split_windows`). mtmd's DFT and FFT loops are plain
float32 (no FMA contraction in its build), so numpy's float32 element-wise operations, one rounding per
operation, give the same bits; `tests/test_media_audio.py` compares with the mel llama.cpp printed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

SAMPLE_RATE = 16000  # clip.cpp's audio_sample_rate for the whisper projectors
N_FFT = 400
WINDOW_LENGTH = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
FRAMES_PER_WINDOW = 3000  # mtmd_audio_preprocessor_whisper's frames_per_chunk: clip's graph takes these
MEL_FLOOR = 5.960464477539063e-08  # filter_params.mel_floor (2^-24)

F32 = np.float32


def c_float_fn(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's float function `name` (sinf, cosf) of each float32 of x: the tables mtmd builds
    with them. glibc's sinf/cosf are not correctly rounded (10 of the 400 sines and cosines of n_fft 400
    differ by an ulp from the rounded double value), and that ulp moves the log-mel by up to 5 float32
    ulps, so the platform's own functions are called, as the C++ calls them; where ctypes finds no C
    math library, the double result rounded to float."""
    fn = _libm_function(name)
    if fn is None:
        return getattr(np, name[:-1])(x.astype(np.float64)).astype(F32)
    return np.array([fn(float(v)) for v in x], dtype=F32)


@functools.cache
def _libm_function(name: str) -> Any:
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or ctypes.util.find_library("c"))
        fn = getattr(lib, name)
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return fn


@dataclass(frozen=True)
class MelFilter:
    """mtmd_audio_cache for one (n_mel, n_fft, window, rate): its tables, as llama.cpp builds them."""

    n_mel: int
    n_fft: int = N_FFT
    window_length: int = WINDOW_LENGTH
    hop_length: int = HOP_LENGTH
    sample_rate: int = SAMPLE_RATE

    @cached_property
    def sin_cos(self) -> tuple[np.ndarray, np.ndarray]:
        """fill_sin_cos_table: theta = 2 pi i / n in double, then sinf(theta) and cosf(theta), theta
        converted to float by the call."""
        arg = ((2 * math.pi * np.arange(self.n_fft)) / self.n_fft).astype(F32)
        return c_float_fn("sinf", arg), c_float_fn("cosf", arg)

    @cached_property
    def window(self) -> np.ndarray:
        """fill_hann_window(length, periodic): 0.5 * (1 - cosf(2 pi i / length)), the outer arithmetic in
        double; centred in n_fft when shorter (log_mel_spectrogram pads it)."""
        i = np.arange(self.window_length)
        cos = c_float_fn("cosf", ((2.0 * math.pi * i) / self.window_length).astype(F32))
        hann = (0.5 * (1.0 - cos.astype(np.float64))).astype(F32)
        if self.window_length < self.n_fft:
            padded = np.zeros(self.n_fft, F32)
            start = (self.n_fft - self.window_length) // 2
            padded[start : start + self.window_length] = hann
            hann = padded
        return hann

    @cached_property
    def filters(self) -> np.ndarray:
        """fill_mel_filterbank_matrix(n_mel, n_fft, rate) with its defaults (fmin 0, fmax rate / 2, Slaney
        area norm, Slaney scale): float32 [n_mel, n_fft / 2 + 1]. Its few hundred points go through
        Python's math (the C library's log and exp, as the C++ calls them)."""
        min_log_hz, lin_slope = 1000.0, 3 / 200.0
        min_log_mel, log_step = min_log_hz * lin_slope, math.log(6.4) / 27.0

        def hz_to_mel(f: float) -> float:
            return f * lin_slope if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / log_step

        def mel_to_hz(m: float) -> float:
            return m / lin_slope if m < min_log_mel else min_log_hz * math.exp((m - min_log_mel) * log_step)

        fmax = float(F32(0.5) * F32(self.sample_rate))  # 0.5f * sample_rate, a float
        lo, hi = hz_to_mel(0.0), hz_to_mel(fmax)
        hz = [mel_to_hz(lo + (hi - lo) * (i / (self.n_mel + 1))) for i in range(self.n_mel + 2)]
        n_bins = self.n_fft // 2 + 1
        step = float(self.sample_rate) / float(self.n_fft)
        out = np.zeros((self.n_mel, n_bins), F32)
        for m in range(self.n_mel):
            left, center, right = hz[m], hz[m + 1], hz[m + 2]
            denom_l, denom_r = max(1e-30, center - left), max(1e-30, right - center)
            enorm = 2.0 / max(1e-30, right - left)
            for k in range(n_bins):
                f = k * step
                w = 0.0
                if left <= f <= center:
                    w = (f - left) / denom_l
                elif center < f <= right:
                    w = (right - f) / denom_r
                out[m, k] = w * enorm * 1.0
        return out

    # -- the spectrogram -----------------------------------------------------------------------------------

    def padded(self, samples: np.ndarray) -> np.ndarray:
        """log_mel_spectrogram's padding of whisper (reflect n_fft / 2 at the start; 30 s and n_fft / 2 of
        zeros at the end), after the preprocessor's zero-padding of a very short signal."""
        x = np.asarray(samples, dtype=F32).reshape(-1)
        half = self.n_fft // 2
        if len(x) < half + 1:
            x = np.concatenate([x, np.zeros(half + 1 - len(x), F32)])
        tail = np.zeros(self.sample_rate * CHUNK_SECONDS + half, F32)
        return np.concatenate([x[half:0:-1], x, tail])

    def frames(self, padded: np.ndarray) -> np.ndarray:
        """float32 [n_frames, n_fft]: each frame times the window (fft_in[j] = hann[j] * sample)."""
        n_frames = (len(padded) - self.n_fft) // self.hop_length + 1
        starts = np.arange(n_frames)[:, None] * self.hop_length
        return padded[starts + np.arange(self.n_fft)[None, :]] * self.window[None, :]

    def power(self, frames: np.ndarray) -> np.ndarray:
        """|FFT|^2 of each frame, bins 0..n_fft / 2, float32 [n_frames, n_fft / 2 + 1]."""
        re, im = fft(frames, *self.sin_cos)
        n_bins = self.n_fft // 2 + 1
        return re[:, :n_bins] * re[:, :n_bins] + im[:, :n_bins] * im[:, :n_bins]

    def log_mel(self, power: np.ndarray) -> np.ndarray:
        """float32 [n_mel, n_frames]: log10(max(mel energy, floor)), the energy summed as the C loop sums
        it (a float sum of four products, added to a double)."""
        filters, n_bins = self.filters, power.shape[1]
        total = np.zeros((power.shape[0], self.n_mel))
        unrolled = -(-(n_bins - 3) // 4) * 4  # where the C loop `for (k = 0; k < n_bins - 3; k += 4)` ends
        for k in range(0, unrolled, 4):
            four = power[:, k, None] * filters[None, :, k]
            for j in range(1, 4):
                four = four + power[:, k + j, None] * filters[None, :, k + j]
            total += four
        for k in range(unrolled, n_bins):  # its remainder loop
            total += power[:, k, None] * filters[None, :, k]
        return np.log10(np.maximum(total, MEL_FLOOR)).astype(F32).T

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        """The whole normalised log-mel spectrogram, float32 [n_mel, n_frames] (n_frames counts the 30 s
        of padding: `split_windows` takes the windows)."""
        padded = self.padded(samples)
        n_frames = (len(padded) - self.n_fft) // self.hop_length + 1
        block = 2048  # frames a pass: the FFT's work arrays stay a few tens of MB
        parts = []
        for start in range(0, n_frames, block):
            stop = min(start + block, n_frames)
            piece = padded[start * self.hop_length : (stop - 1) * self.hop_length + self.n_fft]
            parts.append(self.log_mel(self.power(self.frames(piece))))
        mel = np.concatenate(parts, axis=1)
        # whisper's normalisation, in double as the C++ does it, over every frame including the padding
        low = float(mel.max()) - 8.0
        out = np.where(mel < low, low, mel.astype(np.float64)).astype(F32).astype(np.float64)
        return ((out + 4.0) / 4.0).astype(F32)


def split_windows(mel: np.ndarray, frames: int = FRAMES_PER_WINDOW) -> list[np.ndarray]:
    """The whole windows of `frames` frames from the start (mtmd's chunks); the rest is padding."""
    return [np.ascontiguousarray(mel[:, i : i + frames]) for i in range(0, mel.shape[1] - frames + 1, frames)]


def fft(frames: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mtmd-audio.cpp's fft_impl<false, true> on real rows: (re, im) float32 [rows, N]. Even and odd
    samples recursively, then the butterflies; an odd length is a DFT. Twiddles are the table's entries
    at k * (table size / N), the sine negated (sign -1)."""
    n = frames.shape[1]
    if n == 1:
        return frames.copy(), np.zeros_like(frames)
    if n % 2 == 1:
        return _dft(frames, sin, cos)
    half = n // 2
    even_re, even_im = fft(np.ascontiguousarray(frames[:, 0::2]), sin, cos)
    odd_re, odd_im = fft(np.ascontiguousarray(frames[:, 1::2]), sin, cos)
    idx = np.arange(half) * (len(sin) // n)
    re, im = cos[idx][None, :], -sin[idx][None, :]
    # out[k] = even + w * odd and out[k + N/2] = even - w * odd, in the C expressions' order
    a, b = re * odd_re, im * odd_im
    c, d = re * odd_im, im * odd_re
    out_re = np.concatenate([(even_re + a) - b, (even_re - a) + b], axis=1)
    out_im = np.concatenate([(even_im + c) + d, (even_im - c) - d], axis=1)
    return out_re, out_im


def _dft(frames: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dft_impl<false, true>: re += x[n] cos, im += (-x[n]) sin, n in order, in float32."""
    rows, n = frames.shape
    step = len(sin) // n
    k = np.arange(n)
    re = np.zeros((rows, n), F32)
    im = np.zeros((rows, n), F32)
    for j in range(n):
        idx = (k * j * step) % len(sin)
        x = frames[:, j, None]
        re = re + x * cos[idx][None, :]
        im = im + (-x) * sin[idx][None, :]
    return re, im
