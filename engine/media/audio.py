"""Audio input (llama.cpp's mtmd, `--mmproj` with an audio encoder): a sound file's bytes made into the
embeddings a text model reads, through a whisper encoder and Ultravox's projector (projector type
`ultravox`).

Decoding (`decode_audio`): mtmd-helper.cpp reads WAV, MP3 and FLAC (recognised by their first bytes, as
its is_audio_file does) with miniaudio, mixed to mono float32 and resampled to 16 kHz by miniaudio's
decoder (`ma_decoder_config_init(ma_format_f32, 1, 16000)`), exactly as many samples as
ma_decoder_get_length_in_pcm_frames says. The `miniaudio` package wraps the same miniaudio release
(0.11.25) and decoder; it is built with -ffast-math, so its samples may differ from llama.cpp's in the
last bit (measured in tests/test_media_audio.py).

Features (engine/media/mel.py): whisper's log-mel spectrogram, whole 30 s windows of 3000 frames.

Encoder (tools/mtmd/models/whisper-enc.cpp): conv1d (kernel 3, stride 1) + bias, GELU (erf), conv1d
(kernel 3, stride 2) + bias, GELU: 1500 positions a window. Each conv is one matmul over the im2col frames,
rounded to float16 first as ggml's im2col rounds them (ggml_conv_1d's F16 im2col). Learned positions are
added, then pre-LayerNorm blocks (clip.cpp's build_vit: attention with Q and V biases and none on K, every
position over the whole window; a GELU (erf) feed-forward), then the post-LayerNorm.

Projector (Ultravox): the states stacked `stack_factor` positions to a row (zero-padded at the end), RMS
norm (eps 1e-6) times mm.a.norm_pre, mm.a.mlp.1, SwiGLU with the silu on the second half
(ggml_swiglu_swapped), RMS norm (eps 1e-6) times mm.a.norm_mid, mm.a.mlp.2: [ceil(1500 / stack_factor),
n_embd_text] a window.

mtmd makes each window its own chunk, one after another with no text between (Ultravox has no begin or
end marker), decoded causally like text; `encode_audio` returns the windows' rows concatenated.
llama.cpp 0c1e570 aborts on a stack factor that does not divide 1500 (Ultravox v0.5's 8: its token count
says 187, the graph makes 188); this follows the graph and Ultravox's StackAudioFrames (188).

A file this cannot run is refused in one line as `UnsupportedAudioProjector`; engine/media/mmproj.py's
load_projector, which hands `ultravox` files here, imports this module, so this one must not import it
(tests/test_architecture.py refuses import loops, imports inside functions included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.mel import FRAMES_PER_WINDOW, SAMPLE_RATE, MelFilter, split_windows
from engine.media.preprocess import MediaError
from engine.media.vision import (
    FLOAT_TYPES,
    encoder_hparams,
    optional_norm,
    pack_float,
    run_blocks,
    tower_sizes,
)
from engine.models.encoder import EncoderAttention, EncoderHParams, LayerNorm, Pass, linear
from engine.models.llama import Projection, norm_weight

SUPPORTED_AUDIO_PROJECTORS = ("ultravox",)


class UnsupportedAudioProjector(ValueError):
    """An audio projector file this build cannot run (its type, layout or tensors); the message names it."""


PROJECTOR_EPS = 1e-6  # whisper-enc.cpp's RMS norms in Ultravox's projector (not the file's epsilon)
SQRT_2_INV = np.float32(0.70710678118654752440084436210484)  # ggml's SQRT_2_INV, a float
GGML_BF16 = 30


# -- decoding ---------------------------------------------------------------------------------------------


def audio_format(data: bytes) -> str | None:
    """ "wav", "mp3" or "flac" by the first bytes, as mtmd-helper.cpp's is_audio_file tells them (an MP3
    by its ID3 tag or an MPEG frame sync); None for anything else (mtmd tries it as an image)."""
    if len(data) < 12:
        return None
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return "flac" if data[:4] == b"fLaC" else None


def frames_after_resampling(rate_out: int, rate_in: int, frames_in: int) -> int:
    """miniaudio's ma_calculate_frame_count_after_resampling: the length ma_decoder reports at rate_out."""
    if rate_in == 0 or rate_out == 0 or frames_in == 0:
        return 0
    if rate_in == rate_out:
        return frames_in
    out = frames_in * rate_out // rate_in
    from_frac = out * (rate_in // rate_out) // rate_out
    if out * (rate_in % rate_out) + from_frac <= frames_in:
        out += 1
    return out


def decode_audio(data: bytes, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono samples at `sample_rate` of a WAV, MP3 or FLAC file, as many as mtmd reads (the
    decoder's stated length: the stream cut there, or zero-filled to it); MediaError otherwise."""
    import miniaudio  # loads only once audio arrives

    if not data:
        raise MediaError("the audio is empty (0 bytes)")
    kind = audio_format(data)
    if kind is None:
        raise MediaError(f"not a WAV, MP3 or FLAC file ({len(data)} bytes): the audio formats mtmd reads")
    info_of = {"wav": miniaudio.wav_get_info, "mp3": miniaudio.mp3_get_info, "flac": miniaudio.flac_get_info}
    try:
        info = info_of[kind](data)
        decoded = miniaudio.decode(data, miniaudio.SampleFormat.FLOAT32, 1, sample_rate)
    except Exception as exc:  # a decoder fails in many ways on bad bytes: each is the request's fault
        raise MediaError(f"cannot decode the audio ({kind}, {len(data)} bytes): {exc}") from None
    n = frames_after_resampling(sample_rate, info.sample_rate, info.num_frames)
    samples = np.frombuffer(decoded.samples, dtype=np.float32)[:n]
    if n <= 1:  # mtmd refuses empty audio and asserts on a single sample
        raise MediaError(f"the audio decodes to {n} samples ({kind}, {len(data)} bytes)")
    return np.concatenate([samples, np.zeros(n - len(samples), np.float32)])


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_erf_f32: 0.5 x (1 + erff(x / sqrt 2)) in float32 (erf in double, rounded: glibc's
    erff is within an ulp of that). On the host: the backends have no erf kernel."""
    t = (x * SQRT_2_INV).astype(np.float64)
    erf = np.frompyfunc(math.erf, 1, 1)(t).astype(np.float32)
    return (np.float32(0.5) * x) * (np.float32(1.0) + erf)


# -- the projector file -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AudioHParams:
    projector_type: str
    n_embd: int  # the whisper encoder's width
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_layer: int
    n_mel: int
    eps: float  # clip.audio.attention.layer_norm_epsilon: the encoder's LayerNorms
    stack_factor: int
    n_pos: int = FRAMES_PER_WINDOW // 2  # a window's positions after the stride-2 conv

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> AudioHParams:
        def key(name: str, default: Any = None) -> Any:
            value = g.metadata.get(f"clip.audio.{name}", default)
            if value is None:
                raise UnsupportedAudioProjector(f"{g.path.name}: projector file lacks clip.audio.{name}")
            return value

        return cls(
            projector_type=audio_projector_type(g),
            **tower_sizes(key),
            n_mel=int(key("num_mel_bins")),
            stack_factor=int(key("projector.stack_factor")),  # clip.cpp requires it for ultravox
        )

    @property
    def n_tokens(self) -> int:
        """Rows a 30 s window becomes: the positions stacked, the last stack zero-padded."""
        return -(-self.n_pos // self.stack_factor)


def audio_projector_type(g: GGUFFile) -> str:
    """clip.projector_type, else clip.audio.projector_type (files with several modalities)."""
    meta = g.metadata
    return str(meta.get("clip.projector_type") or meta.get("clip.audio.projector_type") or "")


def check_audio_file(g: GGUFFile, hp: AudioHParams, backend: Backend) -> None:
    """Why this audio projector cannot run here, as an UnsupportedAudioProjector (one line); nothing if
    it can."""
    name, t = g.path.name, g.tensors
    if not g.metadata.get("clip.has_audio_encoder", False):
        raise UnsupportedAudioProjector(f"{name} has no audio encoder (clip.has_audio_encoder is not set)")
    if hp.projector_type not in SUPPORTED_AUDIO_PROJECTORS:
        supported = ", ".join(SUPPORTED_AUDIO_PROJECTORS)
        raise UnsupportedAudioProjector(
            f"unsupported audio projector type {hp.projector_type!r} in {name} (supported: {supported})"
        )
    if backend.layernorm is None or backend.encoder_attention is None:
        raise UnsupportedAudioProjector(
            f"the {hp.projector_type} projector runs on the CPU only ({backend.name})"
        )
    checked = ("a.conv1d.1.weight", "a.conv1d.2.weight", "a.position_embd.weight", "mm.a.mlp.1.weight")
    for tensor in (*checked, "mm.a.mlp.2.weight"):
        if tensor not in t:  # what the checks below read (any other missing tensor: load_audio_projector)
            raise UnsupportedAudioProjector(f"{name}: {tensor} is missing")
    for tensor, channels in (("a.conv1d.1.weight", hp.n_mel), ("a.conv1d.2.weight", hp.n_embd)):
        if t[tensor].ggml_type not in FLOAT_TYPES:  # im2col and its matmul: float weights only
            raise UnsupportedAudioProjector(f"{name}: {tensor} is {t[tensor].type_name}, not F32/F16/BF16")
        if t[tensor].shape != (hp.n_embd, channels, 3):
            raise UnsupportedAudioProjector(f"{name}: {tensor} is {t[tensor].shape}, not whisper's kernel 3")
    if t["a.position_embd.weight"].shape[0] < hp.n_pos:  # whisper-enc.cpp asserts it
        raise UnsupportedAudioProjector(f"{name}: fewer learned positions than a window's {hp.n_pos}")
    stacked, up = hp.n_embd * hp.stack_factor, t["mm.a.mlp.1.weight"].shape
    if up[1] != stacked or up[0] % 2 or t["mm.a.mlp.2.weight"].shape[1] != up[0] // 2:
        raise UnsupportedAudioProjector(f"{name}: the projector's matrices do not fit a stack of {stacked}")


# -- the encoder and the projector ------------------------------------------------------------------------


class WhisperQKV(Projection):
    """Q, K and V in one matmul; whisper's Q and V have biases and its K none (whisper-enc.cpp), which
    Projection's all-or-none biases cannot say: the two are added to their outputs."""

    def __init__(self, backend: Backend, g: GGUFFile, p: str) -> None:
        super().__init__(backend, [g.tensors[f"{p}attn_{x}.weight"] for x in "qkv"])
        self.q_bias = backend.upload(np.array(g.tensors[p + "attn_q.bias"].data, np.float32))
        self.v_bias = backend.upload(np.array(g.tensors[p + "attn_v.bias"].data, np.float32))

    def __call__(self, x: Any) -> list[Any]:
        q, k, v = super().__call__(x)
        self.backend.add_bias_inplace(q, self.q_bias)
        self.backend.add_bias_inplace(v, self.v_bias)
        return [q, k, v]


class WhisperLayer:
    """One pre-norm block: LayerNorm, attention over the window added back, LayerNorm, the GELU (erf)
    feed-forward added back."""

    def __init__(self, backend: Backend, g: GGUFFile, hp: EncoderHParams, il: int) -> None:
        p = f"a.blk.{il}."
        self.backend = backend
        self.ln1 = LayerNorm(backend, g, p + "ln1", hp.norm_eps)
        self.attn = EncoderAttention(
            hp, backend, WhisperQKV(backend, g, p), linear(backend, g, p + "attn_out")
        )
        self.ln2 = LayerNorm(backend, g, p + "ln2", hp.norm_eps)
        self.up, self.down = linear(backend, g, p + "ffn_up"), linear(backend, g, p + "ffn_down")

    def __call__(self, x: Any, step: Pass) -> Any:
        be = self.backend
        cur = self.attn(self.ln1(x), step)
        be.add_inplace(cur, x)  # the residual
        (h,) = self.up(self.ln2(cur))
        (out,) = self.down(be.upload(gelu_erf(be.download(h))))
        be.add_inplace(out, cur)
        return out


class WhisperEncoder:
    """A window's log-mel [n_mel, 3000] -> the post-LayerNormed states of its 1500 positions."""

    def __init__(self, g: GGUFFile, hp: AudioHParams, backend: Backend) -> None:
        self.hp, self.backend = hp, backend
        t = g.tensors
        self.convs = []
        for i in (1, 2):
            weight, bias = t[f"a.conv1d.{i}.weight"], t[f"a.conv1d.{i}.bias"]
            # ggml_conv_1d's im2col is F16 unless the kernel is BF16 (then F32)
            self.convs.append(
                (pack_float(backend, g, weight.name), self._vector(bias), weight.ggml_type != GGML_BF16)
            )
        self.positions = backend.upload(np.array(t["a.position_embd.weight"].data[: hp.n_pos], np.float32))
        self.pre_ln = optional_norm(backend, g, "a.pre_ln", hp.eps)
        enc = encoder_hparams(hp, hp.n_pos)
        self.layers = []
        for il in range(hp.n_layer):
            self.layers.append(WhisperLayer(backend, g, enc, il))
            g.release_pages()  # each layer's file pages once packed (engine/gguf.py)
        self.post_ln = optional_norm(backend, g, "a.post_ln", hp.eps)

    def _vector(self, t: Any) -> Any:
        return self.backend.upload(np.array(t.data, np.float32).reshape(-1))

    def conv(self, x: np.ndarray, i: int, stride: int) -> np.ndarray:
        """The (i + 1)-th conv1d (kernel 3, padding 1, ggml_conv_1d_ph) over x [time, channels] as a matmul
        over its im2col frames (each frame channel-major, then the 3 taps: the kernel's own layout), then
        its bias and GELU (erf): [time / stride, n_embd]."""
        be, (weight, bias, f16) = self.backend, self.convs[i]
        padded = np.pad(x, ((1, 1), (0, 0)))
        n_out = (len(x) - 1) // stride + 1
        taps = [padded[k : k + stride * (n_out - 1) + 1 : stride] for k in range(3)]
        frames = np.stack(taps, axis=2).reshape(n_out, -1)
        if f16:
            frames = frames.astype(np.float16).astype(np.float32)
        out = be.empty((n_out, self.hp.n_embd))
        be.matmul(be.upload(np.ascontiguousarray(frames)), weight, out)
        be.add_bias_inplace(out, bias)
        return gelu_erf(be.download(out))

    def __call__(self, mel: np.ndarray) -> Any:
        be = self.backend
        h = self.conv(np.ascontiguousarray(mel.T), 0, 1)
        x = be.upload(np.ascontiguousarray(self.conv(h, 1, 2)))
        be.add_inplace(x, self.positions)
        return run_blocks(be, x, self.pre_ln, self.layers, self.post_ln)


class AudioProjector:
    """A loaded Ultravox projector: `encode_audio(bytes)` -> float32 [n_tokens, n_embd_text], the rows the
    text model reads in place of the audio (mtmd decodes them causally: `non_causal` is False; Ultravox has
    no begin or end marker: `audio_begin`, `audio_end` are empty)."""

    audio_begin = ""
    audio_end = ""
    modalities = frozenset({"audio"})
    non_causal = False

    def __init__(self, g: GGUFFile, hp: AudioHParams, backend: Backend) -> None:
        self.hparams, self.backend = hp, backend
        self.mel = MelFilter(hp.n_mel)
        self.encoder = WhisperEncoder(g, hp, backend)
        self.norm_pre = norm_weight(backend, g, "mm.a.norm_pre.weight")
        self.mlp1 = linear(backend, g, "mm.a.mlp.1", bias=False)
        self.norm_mid = norm_weight(backend, g, "mm.a.norm_mid.weight")
        self.mlp2 = linear(backend, g, "mm.a.mlp.2", bias=False)
        self.n_embd_text = int(g.tensors["mm.a.mlp.2.weight"].shape[0])
        self.n_tokens_per_window = hp.n_tokens

    def features(self, data: bytes) -> list[np.ndarray]:
        """The log-mel windows of an encoded sound file, each float32 [n_mel, 3000]."""
        return split_windows(self.mel(decode_audio(data)))

    def encode_audio(self, data: bytes) -> np.ndarray:
        """A WAV, MP3 or FLAC file (MediaError if not) as the text model's rows: every 30 s window's
        [n_tokens_per_window, n_embd_text], in order."""
        return np.concatenate([self.encode_window(mel) for mel in self.features(data)])

    def encode_window(self, mel: np.ndarray) -> np.ndarray:
        """One window's log-mel [n_mel, 3000] -> float32 [n_tokens_per_window, n_embd_text]."""
        be, sf = self.backend, self.hparams.stack_factor
        if mel.shape != (self.hparams.n_mel, FRAMES_PER_WINDOW):  # the graph's fixed input (clip.cpp)
            raise ValueError(
                f"a window is [{self.hparams.n_mel}, {FRAMES_PER_WINDOW}], not {list(mel.shape)}"
            )
        states = be.download(self.encoder(mel)).reshape(-1)
        width = self.hparams.n_embd * sf
        stacked = np.zeros(self.n_tokens_per_window * width, np.float32)  # build_stack's zero padding
        stacked[: len(states)] = states
        x = be.upload(stacked.reshape(self.n_tokens_per_window, width))
        be.rmsnorm(x, self.norm_pre, PROJECTOR_EPS, x)
        (h,) = self.mlp1(x)
        half = h.shape[1] // 2
        first, second = be.split_cols(h, [half, half])
        be.silu_mul(second, first, second)  # ggml_swiglu_swapped: silu(second half) * first half
        be.rmsnorm(second, self.norm_mid, PROJECTOR_EPS, second)
        (out,) = self.mlp2(second)
        return np.asarray(be.download(out), dtype=np.float32)


def load_audio_projector(g: GGUFFile, backend: Backend) -> AudioProjector:
    """The audio projector of an mmproj GGUF (`clip.projector_type` ultravox) on `backend`;
    UnsupportedAudioProjector (one line) when it cannot run, or when the file holds tensors it does not
    read."""
    kind = audio_projector_type(g)
    if kind != "ultravox":  # before any key: a file of another type may lack ultravox's
        raise UnsupportedAudioProjector(
            f"unsupported audio projector type {kind!r} in {g.path.name} (supported: ultravox)"
        )
    hp = AudioHParams.from_gguf(g)
    check_audio_file(g, hp, backend)
    try:
        projector = AudioProjector(g, hp, backend)
    except KeyError as exc:  # the file's TensorTable names the tensor a layer asked for
        raise UnsupportedAudioProjector(f"{g.path.name}: tensor {exc.args[0]} is missing") from None
    unread = g.tensors.unread()
    if unread:
        shown = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        raise UnsupportedAudioProjector(
            f"{g.path.name}: tensors the {hp.projector_type} projector does not use: {shown}"
        )
    g.release_pages()
    return projector
