"""Synthetic Ultravox audio projectors (mmproj GGUFs, projector type `ultravox`) with seeded random weights,
and the synthetic WAV files the audio tests and goldens read.

No real Ultravox projector is at hand, so, as tests/synthetic_mmproj.py does for Gemma 3's vision, this
writes one with the layout llama.cpp 0c1e570 reads, from these files of its tree:

- conversion/ultravox.py (`UltravoxWhisperEncoderModel`, `WhisperEncoderModel`) and conversion/base.py
  (`MmprojModel`, the tensor types of `prepare_tensors`): the `clip.audio.*` keys the converter writes;
  the conv weights forced to float16, the conv biases unsqueezed to [n_embd, 1] (ggml ne [1, n_embd], so
  they broadcast over the conv's output) and kept float32 like every bias and 1-D norm, the learned
  positions (`A_ENC_EMBD_POS`) float32, every other matrix float16 as in `mmproj-*-f16.gguf`;
- gguf-py/gguf/constants.py: the key names and the tensor names (`a.*`, `mm.a.*`);
- tools/mtmd/clip.cpp (`load_hparams`: the stack factor is required for ultravox; `load_tensors`,
  PROJECTOR_TYPE_ULTRAVOX) and clip-impl.h: what it reads;
- tools/mtmd/models/whisper-enc.cpp: the graph (two conv1d + GELU(erf), learned positions, pre-LN blocks
  whose K has no bias, the post-LN; frames stacked by the stack factor, RMS norm, SwiGLU with the silu on
  the second half, RMS norm, the output matrix). Ultravox's projector matrices have no biases.

The "tiny" preset has whisper-large-v3's 128 mel bins and 1500 positions (a 30 s window), a 64-wide
encoder of 2 layers, stack factor 10 (150 tokens a window), and projects to 576: the real
SmolLM2-135M-Instruct's n_embd, so the file runs in front of it. "tiny-sf8" has Ultravox v0.5's stack
factor 8, which llama.cpp 0c1e570 aborts on (see PRESETS). Weights are numpy's default_rng(seed), scaled
so activations stay near unit size; the bytes depend only on (preset, seed).

    .venv/bin/python -m tests.synthetic_audio_mmproj OUT.gguf [preset] [seed]
    .venv/bin/python -m tests.synthetic_audio_mmproj --wav OUT.wav NAME  (or --flac OUT.flac NAME)
"""

from __future__ import annotations

import io
import sys
import wave
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class UltravoxAudio:
    n_mel: int
    n_embd: int  # the whisper encoder's width
    n_ff: int
    n_layer: int
    n_head: int
    n_pos: int  # learned positions: whisper's max_source_positions, half of a window's 3000 mel frames
    stack_factor: int
    n_proj_ff: int  # the SwiGLU's hidden width (mm.a.mlp.1 gives twice that)
    n_embd_text: int
    eps: float = 1e-5


PRESETS = {
    "tiny": UltravoxAudio(128, 64, 256, 2, 4, 1500, 10, 256, 576),
    # Ultravox v0.5's own stack factor: 1500 frames stack to 188 rows (the last one padded), which
    # llama.cpp 0c1e570 cannot run (clip_n_output_tokens says 187, and clip_image_batch_encode aborts).
    "tiny-sf8": UltravoxAudio(128, 64, 256, 2, 4, 1500, 8, 256, 576),
}


def write_ultravox_mmproj(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the `preset` projector to `path` (same bytes for the same arguments); returns the path."""
    hp = PRESETS[preset]
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_name(f"synthetic-ultravox-{preset}")
    w.add_description(f"synthetic Ultravox projector, random weights (seed {seed}), not a trained model")
    w.add_bool(gguf.Keys.Clip.HAS_AUDIO_ENCODER, True)
    w.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, "ultravox")
    w.add_uint32(gguf.Keys.ClipAudio.PROJECTION_DIM, hp.n_embd_text)
    w.add_uint32(gguf.Keys.ClipAudio.EMBEDDING_LENGTH, hp.n_embd)
    w.add_uint32(gguf.Keys.ClipAudio.FEED_FORWARD_LENGTH, hp.n_ff)
    w.add_uint32(gguf.Keys.ClipAudio.BLOCK_COUNT, hp.n_layer)
    w.add_uint32(gguf.Keys.ClipAudio.Attention.HEAD_COUNT, hp.n_head)
    w.add_uint32(gguf.Keys.ClipAudio.NUM_MEL_BINS, hp.n_mel)
    w.add_float32(gguf.Keys.ClipAudio.Attention.LAYERNORM_EPS, hp.eps)
    w.add_uint32(gguf.Keys.ClipAudio.Projector.STACK_FACTOR, hp.stack_factor)

    def normal(shape: tuple[int, ...], scale: float, dtype: type = np.float16) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)

    def matrix(
        name: str, rows: int, cols: int, gain: float = 1.0
    ) -> None:  # numpy [rows, cols]: ne [cols, rows]
        w.add_tensor(name, normal((rows, cols), gain * cols**-0.5))

    def vector(name: str, n: int, center: float, scale: float) -> None:
        w.add_tensor(name, normal((n,), scale, np.float32) + np.float32(center))

    e, m = hp.n_embd, hp.n_mel
    # torch Conv1d weights [out, in, kernel] (ggml ne [kernel, in, out]); biases [out, 1]
    w.add_tensor("a.conv1d.1.weight", normal((e, m, 3), (3 * m) ** -0.5))
    w.add_tensor("a.conv1d.1.bias", normal((e, 1), 0.1, np.float32))
    w.add_tensor("a.conv1d.2.weight", normal((e, e, 3), (3 * e) ** -0.5))
    w.add_tensor("a.conv1d.2.bias", normal((e, 1), 0.1, np.float32))
    w.add_tensor("a.position_embd.weight", normal((hp.n_pos, e), 0.3, np.float32))
    for il in range(hp.n_layer):
        blk = f"a.blk.{il}"
        for ln in ("ln1", "ln2"):
            vector(f"{blk}.{ln}.weight", e, 1.0, 0.1)
            vector(f"{blk}.{ln}.bias", e, 0.0, 0.02)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            matrix(f"{blk}.{proj}.weight", e, e)
            if proj != "attn_k":  # whisper's k_proj has no bias (whisper-enc.cpp asserts it)
                vector(f"{blk}.{proj}.bias", e, 0.0, 0.02)
        matrix(f"{blk}.ffn_up.weight", hp.n_ff, e)
        vector(f"{blk}.ffn_up.bias", hp.n_ff, 0.0, 0.02)
        matrix(f"{blk}.ffn_down.weight", e, hp.n_ff)
        vector(f"{blk}.ffn_down.bias", e, 0.0, 0.02)
    vector("a.post_ln.weight", e, 1.0, 0.1)
    vector("a.post_ln.bias", e, 0.0, 0.02)
    stacked = e * hp.stack_factor
    vector("mm.a.norm_pre.weight", stacked, 1.0, 0.1)
    matrix("mm.a.mlp.1.weight", 2 * hp.n_proj_ff, stacked)
    vector("mm.a.norm_mid.weight", hp.n_proj_ff, 1.0, 0.1)
    # rows about as long as SmolLM2's token embeddings (norm ~3; unit-variance entries would give ~24)
    matrix("mm.a.mlp.2.weight", hp.n_embd_text, hp.n_proj_ff, 0.125)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- synthetic sounds -------------------------------------------------------------------------------------

# name -> (seconds, sample rate, channels): "tone" a 1 s stereo 440/660 Hz tone at 22.05 kHz (decoded
# with mixing to mono and resampling to 16 kHz); "long" 31 s at 16 kHz mono, one window and a second
# one that holds its last second (mtmd splits at 30 s); "tiny" 5 ms, shorter than the mel's reflection
# pad (mtmd zero-pads it to 201 samples first).
SOUNDS = {"tone": (1.0, 22050, 2), "long": (31.0, 16000, 1), "tiny": (0.005, 16000, 1)}


def sound(name: str) -> np.ndarray:
    """float [n, channels] in -1..1: a tone plus a slow chirp and seeded noise, quieter as it goes."""
    seconds, rate, channels = SOUNDS[name]
    t = np.arange(round(seconds * rate)) / rate
    noise = np.random.default_rng(len(name)).standard_normal((len(t), channels)) * 0.02
    chirp = 0.2 * np.sin(2 * np.pi * (200 * t + 40 * t * t))
    tones = [0.5 * np.sin(2 * np.pi * f * t) for f in (440.0, 660.0)[:channels]]
    fade = np.exp(-t / max(seconds, 1.0))
    return np.stack([(x + chirp) * fade for x in tones], axis=1) + noise


def wav_bytes(name: str) -> bytes:
    """The sound as a 16-bit PCM WAV (the stdlib's writer: the same bytes wherever it runs)."""
    _, rate, channels = SOUNDS[name]
    pcm = np.clip(np.round(sound(name) * 32767), -32768, 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm.tobytes())
    return out.getvalue()


def flac_bytes(name: str, block: int = 4096) -> bytes:
    """The same 16-bit samples as `wav_bytes(name)` in a FLAC file of VERBATIM subframes (no encoder is at
    hand: the simplest stream the format allows, each frame with its CRC-8 header and CRC-16 footer)."""
    _, rate, channels = SOUNDS[name]
    pcm = np.clip(np.round(sound(name) * 32767), -32768, 32767).astype(">i2")
    info = (block << 48 | block << 32).to_bytes(10, "big")  # min and max block size; frame sizes unknown
    info += (rate << 44 | (channels - 1) << 41 | 15 << 36 | len(pcm)).to_bytes(8, "big") + bytes(16)
    out = bytearray(b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info)
    for number, start in enumerate(range(0, len(pcm), block)):
        samples = pcm[start : start + block]
        # sync + fixed blocking; 16-bit block size at the end; rate from STREAMINFO; independent
        # channels; 16 bits a sample; the frame number (UTF-8 coded, < 128 here)
        header = bytes([0xFF, 0xF8, 0x70, (channels - 1) << 4 | 0x08, number]) + (len(samples) - 1).to_bytes(
            2, "big"
        )
        frame = header + bytes([_crc8(header)])
        for c in range(channels):
            frame += b"\x02" + samples[:, c].tobytes()  # subframe VERBATIM, no wasted bits
        out += frame + _crc16(frame).to_bytes(2, "big")
    return bytes(out)


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc << 1 ^ 0x07) & 0xFF if crc & 0x80 else crc << 1 & 0xFF
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = (crc << 1 ^ 0x8005) & 0xFFFF if crc & 0x8000 else crc << 1 & 0xFFFF
    return crc


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] in ("--wav", "--flac"):
        Path(args[1]).write_bytes((wav_bytes if args[0] == "--wav" else flac_bytes)(args[2]))
    else:
        write_ultravox_mmproj(
            args[0], args[1] if len(args) > 1 else "tiny", int(args[2]) if len(args) > 2 else 0
        )
