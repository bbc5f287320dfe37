"""llama.cpp's mtmd on the synthetic Ultravox projector -> tests/golden/mmproj_ultravox.{npz,json}.

Run it with the Python that has llama-cpp-python 0.3.36 (llama.cpp 0c1e570, its `llama_cpp.mtmd_cpp`
bindings); the projector and the synthetic WAV files are written by tests/synthetic_audio_mmproj.py in
Llamba's venv (`--writer-python`), the code the tests rebuild them with, so the recorded sha256 pins them:

    /tmp/llcpp-avx2/bin/python scripts/make_audio_goldens.py

For the "tiny" preset (seed 2, below) in front of the real SmolLM2-135M-Instruct (Q4_1), on the CPU, 2
threads, n_ctx 1024, n_batch 512, flash attention off in the projector and the text model, the text weights
not repacked (use_extra_bufts off: this VM lists AMX, whose tiles crash), for each sound: `test2`
(llama.cpp's tools/mtmd/test-2.mp3, 17.4 s of speech at 44.1 kHz), `tone` (tests/golden/mmproj_tone.wav,
written here: 1 s stereo at 22.05 kHz, so mixed down and resampled), `long` (31 s at 16 kHz: two 30 s
windows; only its sha256 is kept, the tests write it again) and `tiny` (5 ms, shorter than the mel's
reflection pad):

- `<sound>_pcm`: the samples mtmd decoded (miniaudio in mtmd-helper.cpp, 16 kHz mono float32): whole for
  tone and tiny, every 16th for test2; the json has every sound's count and the sha256 of its bytes, and
  for the tone that of the samples mtmd decodes from the same 16-bit samples in FLAC;
- `<sound>_mel`: the log-mel windows mtmd made of them, [n_windows, n_mel, 3000] (test2: every 4th
  frame), read from `mtmd_debug_preprocess_audio` (libmtmd's debugging entry point: it prints each value
  with %f, so to 6 decimals; it takes a std::vector<float>, passed here as libstdc++ lays one out);
- `<sound>_embd`: the embeddings of every audio chunk (mtmd_encode_chunk, mtmd_get_output_embd),
  concatenated [n_tokens, 576]; `test2_embd_fa`: the same with mtmd's default flash attention (auto: on),
  which llama-server runs (the json has every sound's largest difference between the two);
- the chunks of PROMPT as mtmd_tokenize makes them (add_special, parse_special) and whether mtmd decodes
  each audio chunk non-causally (json);
- `<sound>_logits` (not tiny): the next-token logits after mtmd_helper_eval_chunks (n_batch 512,
  logits_last) of all chunks from position 0, llama_get_logits_ith(-1), [49152], and their top 10 (json).

Each evaluation runs twice (a fresh KV cache each time); the script fails unless both agree and the values
are finite and not constant. Nothing here imports Llamba's engine but engine.reference_data.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
MODEL = Path.home() / ".cache" / "llamba" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Seed 2: of seeds 0-7, the one whose three prompts leave the widest gap between SmolLM2's two most likely
# next tokens (0.44 nats at least, measured with Llamba; seed 0's test-2 prompt left 0.06), so that
# the tests' "same top token" does not hang on a near tie.
PRESET, SEED = "tiny", 2
N_CTX, N_BATCH, N_THREADS = 1024, 512, 2
PROMPT_BEFORE, PROMPT_AFTER = "<|im_start|>user\n", "What is said?<|im_end|>\n<|im_start|>assistant\n"
TONE = "mmproj_tone.wav"
PCM_STRIDE, MEL_STRIDE = 16, 4  # test2's samples and frames kept (the whole would be 1.1 MB and 1.5 MB)
MEL_LINE = re.compile(rb"mel\[(\d+)\]\[m=(\d+)\]\[t=(\d+)\] = (\S+)")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_audio() -> Path:
    try:
        sys.path.insert(0, str(ROOT))
        from engine.reference_data import reference_file

        return reference_file("tools/mtmd/test-2.mp3")
    except ImportError:
        return Path.home() / ".cache/llamba/reference/llama-cpp-python-0.3.36/llama.cpp/tools/mtmd/test-2.mp3"


class StdVectorFloat(ctypes.Structure):
    """libstdc++'s std::vector<float>: begin, end, end of storage."""

    _fields_ = [("begin", ctypes.c_void_p), ("end", ctypes.c_void_p), ("cap", ctypes.c_void_p)]


class Runner:
    def __init__(self, mmproj: Path, model: Path) -> None:
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = False
        self.model = llama_cpp.llama_model_load_from_file(str(model).encode(), mparams)
        assert self.model, model
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.n_embd = llama_cpp.llama_model_n_embd(self.model)
        self.mtmd = {fa: self._mtmd(mmproj, fa) for fa in (False, True)}
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = N_CTX, N_BATCH, N_BATCH
        cparams.n_threads = cparams.n_threads_batch = N_THREADS
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.lctx = llama_cpp.llama_init_from_model(self.model, cparams)
        assert self.lctx
        lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libmtmd.so"))
        self.debug_mel = lib._Z27mtmd_debug_preprocess_audioP12mtmd_contextRKSt6vectorIfSaIfEE
        self.debug_mel.argtypes = [ctypes.c_void_p, ctypes.POINTER(StdVectorFloat)]
        self.debug_mel.restype = None

    def _mtmd(self, mmproj: Path, flash_attn: bool) -> int:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = N_THREADS
        if not flash_attn:
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), self.model, params)
        assert ctx, f"mtmd_init_from_file failed on {mmproj}"
        assert mtmd.mtmd_support_audio(ctx) and not mtmd.mtmd_support_vision(ctx)
        assert mtmd.mtmd_get_audio_sample_rate(ctx) == 16000
        return ctx

    def bitmap(self, ctx: int, sound: Path) -> int:
        bitmap = mtmd.mtmd_helper_bitmap_init_from_file(ctx, str(sound).encode(), False)
        assert bitmap and mtmd.mtmd_bitmap_is_audio(bitmap), sound
        return bitmap

    def pcm(self, sound: Path) -> np.ndarray:
        bitmap = self.bitmap(self.mtmd[False], sound)
        n = mtmd.mtmd_bitmap_get_n_bytes(bitmap) // 4
        data = ctypes.cast(mtmd.mtmd_bitmap_get_data(bitmap), ctypes.POINTER(ctypes.c_float))
        out = np.ctypeslib.as_array(data, shape=(n,)).copy()
        mtmd.mtmd_bitmap_free(bitmap)
        return out

    def mel(self, pcm: np.ndarray, n_mel: int) -> np.ndarray:
        """mtmd's log-mel windows of these samples, as its debugging entry point prints them."""
        buf = np.ascontiguousarray(pcm, dtype=np.float32)
        start = buf.ctypes.data
        vec = StdVectorFloat(start, start + buf.nbytes, start + buf.nbytes)
        with tempfile.TemporaryFile() as log:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            try:
                self.debug_mel(self.mtmd[False], ctypes.byref(vec))
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            log.seek(0)
            values = MEL_LINE.findall(log.read())
        n_windows = 1 + max(int(v[0]) for v in values)
        out = np.full((n_windows, n_mel, 3000), np.nan, np.float32)
        for w, m, t, x in values:
            out[int(w), int(m), int(t)] = float(x)
        assert not np.isnan(out).any()
        return out

    def chunks(self, ctx: int, sound: Path) -> int:
        bitmap = self.bitmap(ctx, sound)
        text = (PROMPT_BEFORE + mtmd.mtmd_default_marker().decode() + PROMPT_AFTER).encode()
        inp = mtmd.mtmd_input_text(text, len(text), True, True)
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
        mtmd.mtmd_bitmap_free(bitmap)
        return chunks

    def describe(self, ctx: int, chunks: int) -> list[dict]:
        out = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(c)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                toks = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                out.append({"type": "text", "tokens": [int(toks[j]) for j in range(n.value)]})
            else:
                assert kind == mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO, kind
                out.append(
                    {
                        "type": "audio",
                        "n_tokens": mtmd.mtmd_input_chunk_get_n_tokens(c),
                        "n_pos": mtmd.mtmd_input_chunk_get_n_pos(c),
                        "non_causal": bool(mtmd.mtmd_decode_use_non_causal(ctx, c)),
                    }
                )
        return out

    def embd(self, sound: Path, flash_attn: bool) -> np.ndarray:
        ctx = self.mtmd[flash_attn]
        chunks = self.chunks(ctx, sound)
        rows = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(c) != mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO:
                continue
            n = mtmd.mtmd_input_chunk_get_n_tokens(c)
            assert mtmd.mtmd_encode_chunk(ctx, c) == 0
            ptr = mtmd.mtmd_get_output_embd(ctx)
            rows.append(np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy())
        mtmd.mtmd_input_chunks_free(chunks)
        return np.concatenate(rows)

    def logits(self, sound: Path) -> tuple[list[dict], np.ndarray]:
        ctx = self.mtmd[False]
        chunks = self.chunks(ctx, sound)
        info = self.describe(ctx, chunks)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.lctx), True)
        n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(ctx, self.lctx, chunks, 0, 0, N_BATCH, True, ctypes.byref(n_past))
        assert rc == 0, rc
        assert n_past.value == sum(c.get("n_pos", len(c.get("tokens", []))) for c in info)
        ptr = llama_cpp.llama_get_logits_ith(self.lctx, -1)
        out = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        mtmd.mtmd_input_chunks_free(chunks)
        return info, out


def sane(name: str, a: np.ndarray) -> None:
    assert np.isfinite(a).all(), name
    assert float(a.std()) > 1e-3, name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writer-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--model", type=Path, default=MODEL)
    args = ap.parse_args()

    writer = [args.writer_python, "-m", "tests.synthetic_audio_mmproj"]
    arrays: dict[str, np.ndarray] = {}
    record: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = Path(tmp) / f"mmproj-ultravox-{PRESET}.gguf"
        subprocess.run([*writer, str(mmproj), PRESET, str(SEED)], cwd=ROOT, check=True)
        subprocess.run([*writer, "--wav", str(GOLDEN / TONE), "tone"], cwd=ROOT, check=True)
        sounds = {"test2": test_audio(), "tone": GOLDEN / TONE}
        for name in ("long", "tiny"):
            sounds[name] = Path(tmp) / f"{name}.wav"
            subprocess.run([*writer, "--wav", str(sounds[name]), name], cwd=ROOT, check=True)
        runner = Runner(mmproj, args.model)
        n_mel = 128
        for name, sound in sounds.items():
            pcm = runner.pcm(sound)
            mel = runner.mel(pcm, n_mel)
            embd = runner.embd(sound, False)
            assert np.array_equal(embd, runner.embd(sound, False)), name
            embd_fa = runner.embd(sound, True)
            entry = {
                "file": {
                    "test2": "llama.cpp tools/mtmd/test-2.mp3",
                    "tone": f"tests/golden/{TONE}",
                }.get(name, f"tests/synthetic_audio_mmproj.py wav_bytes({name!r})"),
                "sha256": sha256(sound.read_bytes()),
                "n_samples": len(pcm),
                "pcm_sha256": sha256(pcm.astype("<f4").tobytes()),
                "n_windows": mel.shape[0],
                "n_tokens": embd.shape[0],
                "embd_abs_max": float(np.abs(embd).max()),
                "embd_fa_max_abs_diff": float(np.abs(embd_fa - embd).max()),
            }
            sane(f"{name}_embd", embd)
            if name != "long":
                arrays[f"{name}_pcm"] = pcm[::PCM_STRIDE] if name == "test2" else pcm
                arrays[f"{name}_mel"] = mel[:, :, ::MEL_STRIDE] if name == "test2" else mel
            if name != "tiny":
                arrays[f"{name}_embd"] = embd
                info, logits = runner.logits(sound)
                info2, logits2 = runner.logits(sound)
                assert info == info2 and int(logits.argmax()) == int(logits2.argmax()), name
                sane(f"{name}_logits", logits)
                arrays[f"{name}_logits"] = logits
                top = np.argsort(-logits, kind="stable")[:10]
                entry |= {
                    "chunks": info,
                    "logits_repeat_max_abs_diff": float(np.abs(logits - logits2).max()),
                    "top10": [int(t) for t in top],
                    "top10_logits": [float(logits[t]) for t in top],
                }
            if name == "test2":
                arrays["test2_embd_fa"] = embd_fa
            if name == "tone":  # the same 16-bit samples in FLAC: mtmd's third format
                flac = Path(tmp) / "tone.flac"
                subprocess.run([*writer, "--flac", str(flac), name], cwd=ROOT, check=True)
                entry["flac_pcm_sha256"] = sha256(runner.pcm(flac).astype("<f4").tobytes())
            record[name] = entry
        mmproj_sha = sha256(mmproj.read_bytes())
    np.savez_compressed(GOLDEN / "mmproj_ultravox.npz", **arrays)
    meta = {
        "source": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), libmtmd via llama_cpp.mtmd_cpp",
        "command": shlex.join(["/tmp/llcpp-avx2/bin/python", "scripts/make_audio_goldens.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "mmproj": {
            "writer": "tests/synthetic_audio_mmproj.py",
            "preset": PRESET,
            "seed": SEED,
            "sha256": mmproj_sha,
        },
        "text_model": {"file": args.model.name, "sha256": sha256(args.model.read_bytes())},
        "settings": {
            "device": "CPU",
            "n_threads": N_THREADS,
            "n_ctx": N_CTX,
            "n_batch": N_BATCH,
            "n_ubatch": N_BATCH,
            "flash_attn": "off (projector, text model); test2_embd_fa: the projector's default (auto: on)",
            "use_extra_bufts": False,
            "add_special": True,
            "parse_special": True,
            "logits_last": True,
            "test2_pcm_stride": PCM_STRIDE,
            "test2_mel_frame_stride": MEL_STRIDE,
            "mel_text_format": "%f",
        },
        "prompt": PROMPT_BEFORE + mtmd.mtmd_default_marker().decode() + PROMPT_AFTER,
        "arrays": {k: list(v.shape) for k, v in arrays.items()},
        "sounds": record,
    }
    (GOLDEN / "mmproj_ultravox.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: {kk: v.get(kk) for kk in ("n_tokens", "top10")} for k, v in record.items()}))


if __name__ == "__main__":
    main()
