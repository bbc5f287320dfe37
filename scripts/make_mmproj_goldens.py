"""llama.cpp's mtmd on a synthetic projector -> tests/golden/mmproj_gemma3.{npz,json}, or with
`--projector llava` -> tests/golden/mmproj_llava.{npz,json}, with `--projector idefics3` ->
tests/golden/mmproj_idefics3.{npz,json}.

Run it with the Python that has llama-cpp-python 0.3.36 (llama.cpp 0c1e570, its `llama_cpp.mtmd_cpp`
bindings); the projector is written by tests/synthetic_mmproj.py in Llamba's venv (`--writer-python`),
the same code and gguf package the tests rebuild it with, so the recorded sha256 pins the bytes:

    /tmp/llcpp-avx2/bin/python scripts/make_mmproj_goldens.py

For the "tiny" preset (seed 0) in front of the real Gemma 3 270M (gemma-3-270m-q4_k_m.gguf), on the CPU,
2 threads, n_ctx 1024, n_batch 512, flash attention off in both the projector and the text model, the
text weights not repacked (use_extra_bufts off: this VM lists AMX, whose tiles crash), for each image
(llama.cpp's tools/mtmd/test-1.jpeg, and tests/golden/mmproj_gradient.png, a 64x48 gradient written
here, for a non-square input):

- `<image>_embd`: the image chunk's embeddings (mtmd_encode_chunk, mtmd_get_output_embd),
  [n_image_tokens, 640] float32; `<image>_embd_fa`: the same with mtmd's default flash attention
  (auto, on for the CPU: K and V cast to float16), which is what llama-server runs;
- the chunks of PROMPT as mtmd_tokenize makes them (add_special, parse_special): text chunks' token ids,
  the image chunk's n_tokens / n_pos / nx / ny (in the json);
- `<image>_pixels` (JPEG only): the RGB bytes mtmd decoded (stb_image), [height, width, 3] uint8: other
  decoders (libjpeg-turbo in Pillow) differ by up to 3 on a few percent of them;
- `<image>_logits`: the next-token logits after mtmd_helper_eval_chunks (n_batch 512, logits_last) of
  all chunks from position 0, llama_get_logits_ith(-1), [262144] float32, and their top 10 (json).

`--projector llava`: the "tiny" llava projector (write_llava_mmproj, type `mlp`; seed 0) in front of
the real SmolLM2-135M-Instruct (SmolLM2-135M-Instruct.Q4_1.gguf), a SmolLM2 chat prompt, the same
settings and images; its image tokens are decoded causally (mtmd_decode_use_non_causal is false for
`mlp`, checked), and `<image>_logits_fa` adds the same logits from a second text context with flash
attention on (llama.cpp's own attention-path spread, which the tests' bounds are set against). The
gradient PNG is not written again in this mode, only checked.

`--projector idefics3`: the "tiny" SmolVLM projector (write_idefics3_mmproj, type `idefics3`; seed 0) in
front of the SYNTHETIC SmolVLM text model (tests/synthetic_smolvlm.py: the real SmolLM2-135M-Instruct
with SmolVLM's added tokens, written in Llamba's venv like the projector; its sha256 and its base file's
recorded), the llava settings, and a third image, the 100x33 tests/golden/mmproj_wide.png (written
here): a 3 x 1 grid. Its `<image>_embd` are every image chunk's rows in prompt order (the tiles row by
row, then the overview), and the json's chunks hold the text mtmd puts around each. Run it with the
bindings pointed at llama.cpp's native build:

    L=~/.cache/llamba/reference/llama-cpp-python-0.3.36/llama-server-build/bin
    LLAMA_CPP_LIB_PATH=$L MTMD_CPP_LIB=$L /tmp/llcpp/bin/python scripts/make_mmproj_goldens.py \
        --projector idefics3

Each evaluation runs twice (a fresh KV cache each time); the script fails unless both agree and the
values are finite and not constant. Nothing here imports Llamba's engine but engine.reference_data.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
MODELS = Path.home() / ".cache" / "llamba" / "models"
PRESET, SEED = "tiny", 0
N_CTX, N_BATCH, N_THREADS = 1024, 512, 2
GRADIENT = "mmproj_gradient.png"
WIDE = "mmproj_wide.png"  # 100x33: idefics3's odd-height rounding and a one-row grid


@dataclass(frozen=True)
class Setup:
    """One projector kind's run: its writer, text model, chat prompt around the image, and what mtmd
    must say about it."""

    writer_args: tuple[str, ...]  # before the path, to `python -m tests.synthetic_mmproj`
    writer: str  # as the json names it
    model: Path
    prompt_before: str
    prompt_after: str
    non_causal: bool  # mtmd_decode_use_non_causal
    text_fa: bool  # also record the logits with the text model's flash attention on
    model_writer: tuple[str, ...] = ()  # a synthetic text model: `python -m` these then the path
    extra_images: tuple[str, ...] = ()  # PNGs of tests/golden/ written by this mode


SETUPS = {
    "gemma3": Setup(
        (),
        "tests/synthetic_mmproj.py",
        MODELS / "gemma-3-270m-q4_k_m.gguf",
        "<start_of_turn>user\n",
        "What is in this image?<end_of_turn>\n<start_of_turn>model\n",
        non_causal=True,
        text_fa=False,
    ),
    "llava": Setup(
        ("--llava",),
        "tests/synthetic_mmproj.py (write_llava_mmproj)",
        MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf",
        "<|im_start|>user\n",
        "What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        non_causal=False,
        text_fa=True,
    ),
    "idefics3": Setup(
        ("--idefics3",),
        "tests/synthetic_mmproj.py (write_idefics3_mmproj)",
        Path("smolvlm-text.gguf"),
        "<|im_start|>user\n",
        "What is in this image?<|im_end|>\n<|im_start|>assistant\n",
        non_causal=False,
        text_fa=True,
        model_writer=("tests.synthetic_smolvlm",),
        extra_images=(WIDE,),
    ),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of pixels [height, width, 3] (no filter, zlib level 9)."""
    h, w, _ = pixels.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + pixels[y].astype(np.uint8).tobytes() for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def gradient() -> np.ndarray:
    """64x48: red grows left to right, green top to bottom, blue along the diagonal."""
    y, x = np.mgrid[0:48, 0:64]
    return np.stack([x * 4, y * 5, (x + y) * 2], axis=-1)


def wide() -> np.ndarray:
    """100x33: stripes of red across, green down, blue a checkerboard of 5-pixel squares."""
    y, x = np.mgrid[0:33, 0:100]
    return np.stack([(x * 37) % 256, (y * 59) % 256, ((x // 5 + y // 5) % 2) * 200 + 20], axis=-1)


PNGS = {GRADIENT: gradient, WIDE: wide}


def test_image() -> Path:
    try:
        sys.path.insert(0, str(ROOT))
        from engine.reference_data import reference_file

        return reference_file("tools/mtmd/test-1.jpeg")
    except ImportError:
        return (
            Path.home() / ".cache/llamba/reference/llama-cpp-python-0.3.36/llama.cpp/tools/mtmd/test-1.jpeg"
        )


class Runner:
    def __init__(self, mmproj: Path, model: Path, setup: Setup) -> None:
        self.setup = setup
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = False
        self.model = llama_cpp.llama_model_load_from_file(str(model).encode(), mparams)
        assert self.model, model
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.n_embd = llama_cpp.llama_model_n_embd(self.model)
        self.mtmd = {fa: self._mtmd(mmproj, fa) for fa in (False, True)}
        self.lctx = self._text_context(False)
        self.lctx_fa = self._text_context(True) if setup.text_fa else None

    def _text_context(self, flash_attn: bool) -> int:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = N_CTX, N_BATCH, N_BATCH
        cparams.n_threads = cparams.n_threads_batch = N_THREADS
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        lctx = llama_cpp.llama_init_from_model(self.model, cparams)
        assert lctx
        return lctx

    def _mtmd(self, mmproj: Path, flash_attn: bool) -> int:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = N_THREADS
        if not flash_attn:
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), self.model, params)
        assert ctx, f"mtmd_init_from_file failed on {mmproj}"
        assert mtmd.mtmd_support_vision(ctx)
        assert mtmd.mtmd_decode_use_non_causal(ctx, None) == self.setup.non_causal
        return ctx

    def chunks(self, ctx: int, image: Path) -> int:
        bitmap = mtmd.mtmd_helper_bitmap_init_from_file(ctx, str(image).encode(), False)
        assert bitmap, image
        self.size = (mtmd.mtmd_bitmap_get_nx(bitmap), mtmd.mtmd_bitmap_get_ny(bitmap))
        data = ctypes.cast(mtmd.mtmd_bitmap_get_data(bitmap), ctypes.POINTER(ctypes.c_uint8))
        self.pixels = np.ctypeslib.as_array(data, shape=(self.size[1], self.size[0], 3)).copy()
        text = prompt(self.setup).encode()
        inp = mtmd.mtmd_input_text(text, len(text), True, True)
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
        mtmd.mtmd_bitmap_free(bitmap)
        return chunks

    def describe(self, chunks: int) -> list[dict]:
        out = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(c) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                toks = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                out.append({"type": "text", "tokens": [int(toks[j]) for j in range(n.value)]})
            else:
                img = mtmd.mtmd_input_chunk_get_tokens_image(c)
                n_tokens, n_pos = mtmd.mtmd_input_chunk_get_n_tokens(c), mtmd.mtmd_input_chunk_get_n_pos(c)
                nx, ny = mtmd.mtmd_image_tokens_get_nx(img), mtmd.mtmd_image_tokens_get_ny(img)
                out.append({"type": "image", "n_tokens": n_tokens, "n_pos": n_pos, "nx": nx, "ny": ny})
        return out

    def embd(self, image: Path, flash_attn: bool) -> np.ndarray:
        ctx = self.mtmd[flash_attn]
        chunks = self.chunks(ctx, image)
        all_chunks = (
            mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))
        )
        image_type = mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE
        rows = []  # every image chunk's embeddings in prompt order (idefics3: its tiles, the overview)
        for c in (c for c in all_chunks if mtmd.mtmd_input_chunk_get_type(c) == image_type):
            n = mtmd.mtmd_input_chunk_get_n_tokens(c)
            assert mtmd.mtmd_encode_chunk(ctx, c) == 0
            ptr = mtmd.mtmd_get_output_embd(ctx)
            rows.append(np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy())
        mtmd.mtmd_input_chunks_free(chunks)
        return np.concatenate(rows)

    def logits(self, image: Path, text_fa: bool = False) -> tuple[list[dict], np.ndarray]:
        lctx = self.lctx_fa if text_fa else self.lctx
        chunks = self.chunks(self.mtmd[False], image)
        info = self.describe(chunks)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lctx), True)
        n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(
            self.mtmd[False], lctx, chunks, 0, 0, N_BATCH, True, ctypes.byref(n_past)
        )
        assert rc == 0, rc
        assert n_past.value == sum(c.get("n_pos", len(c.get("tokens", []))) for c in info)
        ptr = llama_cpp.llama_get_logits_ith(lctx, -1)
        out = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        mtmd.mtmd_input_chunks_free(chunks)
        return info, out


def sane(name: str, a: np.ndarray) -> None:
    assert np.isfinite(a).all(), name
    assert float(a.std()) > 1e-3, name


def prompt(setup: Setup) -> str:
    return setup.prompt_before + mtmd.mtmd_default_marker().decode() + setup.prompt_after


def evaluate(runner: Runner, name: str, image: Path, arrays: dict[str, np.ndarray]) -> dict:
    """One image's arrays (into `arrays`) and its json record."""
    embd = runner.embd(image, False)
    assert np.array_equal(embd, runner.embd(image, False)), name
    embd_fa = runner.embd(image, True)
    info, logits = runner.logits(image)
    info2, logits2 = runner.logits(image)
    assert info == info2 and int(logits.argmax()) == int(logits2.argmax()), name
    results = [("embd", embd), ("embd_fa", embd_fa), ("logits", logits)]
    if runner.setup.text_fa:
        info_fa, logits_fa = runner.logits(image, text_fa=True)
        assert info_fa == info, name
        results.append(("logits_fa", logits_fa))
    for key, a in results:
        sane(f"{name}_{key}", a)
        arrays[f"{name}_{key}"] = a.astype(np.float32)
    if image.suffix == ".jpeg":  # stb_image's decode, which other JPEG decoders differ from
        arrays[f"{name}_pixels"] = runner.pixels
    top = np.argsort(-logits, kind="stable")[:10]
    record = {
        "image": f"tests/golden/{image.name}"
        if image.suffix == ".png"
        else "llama.cpp tools/mtmd/test-1.jpeg",
        "image_sha256": sha256(image),
        "width_height": list(runner.size),
        "chunks": info,
        "n_image_tokens": embd.shape[0],
        "embd_abs_max": float(np.abs(embd).max()),
        "embd_fa_max_abs_diff": float(np.abs(embd_fa - embd).max()),
        "logits_repeat_max_abs_diff": float(np.abs(logits - logits2).max()),
        "top10": [int(t) for t in top],
        "top10_logits": [float(logits[t]) for t in top],
    }
    if runner.setup.text_fa:
        record["logits_fa_max_abs_diff"] = float(np.abs(arrays[f"{name}_logits_fa"] - logits).max())
    return record


def command() -> str:
    """How this ran: the library path variables the bindings were pointed with, the interpreter, the args."""
    env = [f"{k}={os.environ[k]}" for k in ("LLAMA_CPP_LIB_PATH", "MTMD_CPP_LIB") if k in os.environ]
    return " ".join([*env, shlex.join([sys.executable, "scripts/make_mmproj_goldens.py", *sys.argv[1:]])])


def text_model(setup: Setup, model: Path) -> dict:
    record = {"file": model.name, "sha256": sha256(model)}
    if setup.model_writer:  # SYNTHETIC: say what it was written from
        base = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
        writer = setup.model_writer[0].replace(".", "/") + ".py"
        record |= {"writer": f"{writer} (SYNTHETIC)", "base": {"file": base.name, "sha256": sha256(base)}}
    return record


def metadata(setup: Setup, model: Path, mmproj_sha: str, arrays: dict, record: dict) -> dict:
    flash_attn = "off (projector, text model); *_embd_fa: the projector's default (auto: on)"
    if setup.text_fa:
        flash_attn += "; *_logits_fa: the text model's on"
    return {
        "source": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), libmtmd via llama_cpp.mtmd_cpp",
        "command": command(),
        "date": datetime.date.today().isoformat(),
        "mmproj": {"writer": setup.writer, "preset": PRESET, "seed": SEED, "sha256": mmproj_sha},
        "text_model": text_model(setup, model),
        "settings": {
            "device": "CPU",
            "n_threads": N_THREADS,
            "n_ctx": N_CTX,
            "n_batch": N_BATCH,
            "n_ubatch": N_BATCH,
            "flash_attn": flash_attn,
            "use_extra_bufts": False,
            "add_special": True,
            "parse_special": True,
            "logits_last": True,
        },
        "prompt": prompt(setup),
        "arrays": {k: list(v.shape) for k, v in arrays.items()},
        "images": record,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writer-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--projector", choices=sorted(SETUPS), default="gemma3")
    ap.add_argument("--model", type=Path, default=None, help="the text model (default: the projector's)")
    args = ap.parse_args()
    setup = SETUPS[args.projector]
    model = args.model or setup.model

    written = (GRADIENT,) if args.projector == "gemma3" else setup.extra_images
    for name in written:
        (GOLDEN / name).write_bytes(png_bytes(PNGS[name]()))
    images = {"test1": test_image(), "gradient": GOLDEN / GRADIENT}
    images |= {
        name.removeprefix("mmproj_").removesuffix(".png"): GOLDEN / name for name in setup.extra_images
    }
    for name in (GRADIENT, *setup.extra_images):  # not written again: checked
        assert (GOLDEN / name).read_bytes() == png_bytes(PNGS[name]()), name
    arrays: dict[str, np.ndarray] = {}
    record: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = Path(tmp) / f"mmproj-{PRESET}.gguf"
        writer = [args.writer_python, "-m", "tests.synthetic_mmproj", *setup.writer_args]
        subprocess.run([*writer, str(mmproj), PRESET, str(SEED)], cwd=ROOT, check=True)
        if setup.model_writer and args.model is None:  # a synthetic text model, written the tests' way
            model = Path(tmp) / model.name
            subprocess.run([args.writer_python, "-m", *setup.model_writer, str(model)], cwd=ROOT, check=True)
        runner = Runner(mmproj, model, setup)
        for name, image in images.items():
            record[name] = evaluate(runner, name, image, arrays)
        mmproj_sha = sha256(mmproj)
        meta = metadata(setup, model, mmproj_sha, arrays, record)
    assert not np.array_equal(arrays["test1_embd"], arrays["gradient_embd"])
    stem = f"mmproj_{args.projector}"
    np.savez_compressed(GOLDEN / f"{stem}.npz", **arrays)
    (GOLDEN / f"{stem}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: {kk: v[kk] for kk in ("chunks", "top10")} for k, v in record.items()}))


if __name__ == "__main__":
    main()
