"""The CUDA backend as a whole: selection and fallback, the CLI flags, and a full forward pass of tiny
random llama and gemma3 models through the CUDA kernels compared with the CPU backend.

Runs in numba's CUDA simulator without a GPU (see tests/test_cuda_kernels.py for how it is switched on).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import applies_only
from tests.cuda_sim import cuda, small_launches  # noqa: F401  (sets up the simulator; autouse fixture)

# isort: split
from engine import backend as backends
from engine.batch import Batch, BatchPart
from engine.gguf import GGUFFile, Tensor, TensorTable
from engine.lora import LoraAdapter, LoraWeight, attach_adapters
from engine.memory.kv import KVCache
from engine.models import load_model
from engine.quant import BLOCK_LAYOUTS, QType
from tests.synthetic_gguf import CASES, write_gguf

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------
# Selection and the command line.


def test_selection() -> None:
    assert backends.select_backend("cpu").name == "CPU"
    assert backends.select_backend("cuda", n_gpu_layers=0).name == "CPU"  # -ngl 0: the CPU
    assert backends.select_backend("cuda").name == "CUDA"  # a GPU, or the simulator here
    with pytest.raises(ValueError, match="unknown device"):
        backends.select_backend("tpu")


def test_fallback_to_cpu_logs_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(backends, "cuda_unavailable", lambda: "no CUDA GPU or driver found")
    monkeypatch.setattr(backends.log, "warning", lambda event, **kw: events.append((event, kw)))
    assert backends.select_backend("auto").name == "CPU"
    assert events == [
        (
            "cuda_unavailable_using_cpu",
            {"device": "auto", "reason": "no CUDA GPU or driver found", "backend": "CPU"},
        )
    ]


def run_cli(*args: str, sim: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": sim}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


# Not a missing prerequisite: this checks the answer of a machine without a GPU, so it cannot apply where
# one is present (test_list_devices_names_each_gpu covers that side). CI's runners have none.
@applies_only(
    not cuda.is_available() or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
    "a GPU is present; this checks --list-devices on a machine without one",
)
def test_list_devices_without_a_gpu() -> None:
    proc = run_cli("-m", "server", "--list-devices", sim="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["Available devices:", "  (none)"]


def test_list_devices_names_each_gpu() -> None:
    proc = run_cli("-m", "server", "--list-devices", sim="1")  # the simulator's one device
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Available devices:"
    assert lines[1].startswith("  CUDA0: ") and lines[1].endswith(" MiB free)")


def test_server_flags() -> None:
    from server.config.parse import parse_settings

    settings, ignored = parse_settings(["--device", "cuda", "-ngl", "99"])
    assert (settings.device, settings.n_gpu_layers, ignored) == ("cuda", 99, [])
    settings, _ = parse_settings(["--device", "cuda", "--n-gpu-layers", "0"])
    assert settings.device == "cpu"  # no layer on the GPU: the CPU backend


def test_bench_device_flag() -> None:
    from cli.bench.options import parse_args

    assert parse_args([]).device == "cpu"
    assert parse_args(["--device", "cuda"]).device == "cuda"
    assert parse_args(["-dev", "auto"]).device == "auto"


# ---------------------------------------------------------------------------------------------------
# A whole model: tiny random weights in the real models' formats, CPU and CUDA backends side by side.


@dataclass
class FakeGGUF:
    """What the model classes read from a GGUFFile: metadata and tensors."""

    metadata: dict[str, Any]
    tensors: TensorTable = field(default_factory=lambda: TensorTable({}))
    path: Path = Path("tiny.gguf")
    # Each model its own generator: the weights must not depend on which tests ran before (with one
    # module-level generator, tiny_llama's CPU/CUDA difference ranged 0.002-0.12 of the logits' range
    # over the first 19 seeds: the CPU's int8 activations, larger on some random models than others).
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(11))

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.metadata['general.architecture']}.{key}", default)

    def require_architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    def release_pages(self) -> None:
        """The model classes drop a mapped file's pages after packing; these tensors are in memory."""

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors.values())

    @property
    def n_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())

    def add(self, name: str, qtype: QType, shape: tuple[int, ...], scale: float = 0.02) -> None:
        if qtype == QType.F32:
            data = (1.0 + self.rng.standard_normal(shape) * 0.1).astype(np.float32)  # norm weights near 1
        else:
            data = random_rows(self.rng, qtype, *shape, scale=scale)
        self.tensors[name] = Tensor(name, int(qtype), shape, data)


def random_rows(rng: np.random.Generator, qtype: QType, rows: int, cols: int, scale: float) -> np.ndarray:
    layout = BLOCK_LAYOUTS[qtype]
    nb = cols // layout.block_size
    raw = rng.integers(0, 256, (rows, nb, layout.type_size), dtype=np.uint8)
    at = 208 if qtype == QType.Q6_K else 0
    d = (rng.uniform(0.5, 1.5, (rows, nb)) * scale / (8 if qtype in (QType.Q4_K, QType.Q6_K) else 1)).astype(
        np.float16
    )
    raw[..., at : at + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    if qtype in (QType.Q4_1, QType.Q4_K):
        m = (-rng.uniform(0.5, 1.5, (rows, nb)) * scale * 4).astype(np.float16)
        raw[..., 2:4] = m.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)


def tiny_llama() -> FakeGGUF:
    """SmolLM2's formats (Q4_1 layers, Q8_0 tied embeddings), 2 layers, GQA 4 heads on 2."""
    n_embd, n_ff, n_head, n_kv, hd, vocab = 64, 128, 4, 2, 16, 80
    g = FakeGGUF(
        {
            "general.architecture": "llama",
            "llama.embedding_length": n_embd,
            "llama.feed_forward_length": n_ff,
            "llama.attention.head_count": n_head,
            "llama.attention.head_count_kv": n_kv,
            "llama.block_count": 2,
            "llama.context_length": 64,
            "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.freq_base": 10000.0,
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)],
        }
    )
    g.add("token_embd.weight", QType.Q8_0, (vocab, n_embd), scale=0.05)
    g.add("output_norm.weight", QType.F32, (n_embd,))
    for il in range(2):
        p = f"blk.{il}."
        g.add(p + "attn_norm.weight", QType.F32, (n_embd,))
        g.add(p + "ffn_norm.weight", QType.F32, (n_embd,))
        g.add(p + "attn_q.weight", QType.Q4_1, (n_head * hd, n_embd))
        g.add(p + "attn_k.weight", QType.Q4_1, (n_kv * hd, n_embd))
        g.add(p + "attn_v.weight", QType.Q4_1, (n_kv * hd, n_embd))
        g.add(p + "attn_output.weight", QType.Q4_1, (n_embd, n_head * hd))
        g.add(p + "ffn_gate.weight", QType.Q4_1, (n_ff, n_embd))
        g.add(p + "ffn_up.weight", QType.Q4_1, (n_ff, n_embd))
        g.add(p + "ffn_down.weight", QType.Q4_1, (n_embd, n_ff))
    return g


def tiny_gemma3() -> FakeGGUF:
    """Gemma 3's formats (Q4_K, Q5_0, Q6_K, Q8_0), q/k norms, post-norms, a sliding-window layer of 4
    cells and a global one; mixed formats in one projection (q Q4_K, k/v Q5_0)."""
    n_embd, n_ff, n_head, hd, vocab = 256, 256, 2, 32, 64
    g = FakeGGUF(
        {
            "general.architecture": "gemma3",
            "gemma3.embedding_length": n_embd,
            "gemma3.feed_forward_length": n_ff,
            "gemma3.attention.head_count": n_head,
            "gemma3.attention.head_count_kv": 1,
            "gemma3.attention.key_length": hd,
            "gemma3.block_count": 1,
            "gemma3.context_length": 64,
            "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
            "gemma3.rope.freq_base": 1e6,
            "gemma3.attention.sliding_window": 4,
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)],
        }
    )
    g.add("token_embd.weight", QType.Q8_0, (vocab, n_embd), scale=0.02)
    g.add("output_norm.weight", QType.F32, (n_embd,))
    p = "blk.0."
    for name, size in (("attn_norm", n_embd), ("ffn_norm", n_embd), ("attn_q_norm", hd), ("attn_k_norm", hd)):
        g.add(p + name + ".weight", QType.F32, (size,))
    g.add(p + "post_attention_norm.weight", QType.F32, (n_embd,))
    g.add(p + "post_ffw_norm.weight", QType.F32, (n_embd,))
    g.add(p + "attn_q.weight", QType.Q4_K, (n_head * hd, n_embd))
    g.add(p + "attn_k.weight", QType.Q5_0, (hd, n_embd))
    g.add(p + "attn_v.weight", QType.Q5_0, (hd, n_embd))
    g.add(p + "attn_output.weight", QType.Q5_0, (n_embd, n_head * hd))
    g.add(p + "ffn_gate.weight", QType.Q4_K, (n_ff, n_embd))
    g.add(p + "ffn_up.weight", QType.Q4_K, (n_ff, n_embd))
    g.add(p + "ffn_down.weight", QType.Q6_K, (n_embd, n_ff))
    return g


def run_steps(model: Any) -> list[np.ndarray]:
    """A prompt of two sequences prefilled together (6 cells past gemma's window), then a decode step
    of both: the logits of every step, as host arrays."""
    kv = model.new_cache(2, 16)
    prompt = Batch.of([BatchPart(0, 0, [1, 5, 9, 2, 7, 3]), BatchPart(1, 0, [4, 4, 8], "all")])
    decode = Batch.of([BatchPart(0, 6, [11]), BatchPart(1, 3, [6])])
    return [np.asarray(model.forward(batch, kv)) for batch in (prompt, decode)]


# Gemma 3's whole model in the simulator is slow (30 s, and 21 s for its context shift): its kernels are
# each checked against the CPU in test_cuda_kernels, and gpu-check.sh runs the whole model on a GPU.
FAMILIES = [tiny_llama, pytest.param(tiny_gemma3, marks=pytest.mark.slow)]


@pytest.mark.parametrize("make", FAMILIES, ids=["llama", "gemma3"])
def test_whole_model_forward_matches_cpu(make: Any) -> None:
    g = make()
    cpu_steps = run_steps(load_model(g, backends.cpu_backend()))
    gpu_steps = run_steps(load_model(g, backends.cuda_backend()))
    for step, (want, got) in enumerate(zip(cpu_steps, gpu_steps, strict=True)):
        assert got.shape == want.shape
        diff = np.abs(got - want)
        err = diff.max() / np.abs(want).max()  # mostly the CPU's int8 activations
        row, col = np.unravel_index(np.argmax(diff), diff.shape)
        where = f"step {step}, row {row}, logit {col}: CUDA {got[row, col]:.4g}, CPU {want[row, col]:.4g}"
        assert err < 3e-2, f"logits differ by {err:.3g} of their range ({where})"
        assert np.abs(want).max() > 0.1  # the random model produces real signal


def tiny_adapter(g: FakeGGUF, rank: int = 4) -> LoraAdapter:
    """A random rank-4 adapter on every projection of tiny_llama, F32 on layer 0 and F16 on layer 1."""
    rng = np.random.default_rng(5)
    weights = {}
    for name, t in g.tensors.items():
        if name.startswith("blk.") and len(t.shape) == 2:
            n_out, n_in = t.shape
            f16 = name.startswith("blk.1.")
            a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            b = (rng.standard_normal((n_out, rank)) * 0.2).astype(np.float32)
            if f16:
                a, b = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
            weights[name] = LoraWeight(a, b, f16)
    return LoraAdapter(Path("tiny-lora.gguf"), 8.0, weights)


@pytest.mark.slow  # 3.5 min in the simulator on two shared cores; the kernel's own tests are fast
def test_whole_model_with_an_adapter_matches_cpu() -> None:
    """tiny_llama with a LoRA adapter on one of two sequences (engine/cuda/lora.py in every projection):
    the CUDA logits are the CPU's within the base comparison's bound, the adapted sequence's far from the
    base's, the other sequence's as close to the base's as without adapters."""
    g = tiny_llama()
    adapter = tiny_adapter(g)

    def run(backend: backends.Backend, lora: tuple[tuple[int, float], ...]) -> list[np.ndarray]:
        model = load_model(g, backend)
        attach_adapters(model, [adapter])
        kv = model.new_cache(2, 16)
        prompt = Batch.of([BatchPart(0, 0, [1, 5, 9, 2, 7, 3], lora=lora), BatchPart(1, 0, [4, 4, 8], "all")])
        decode = Batch.of([BatchPart(0, 6, [11], lora=lora), BatchPart(1, 3, [6])])
        return [np.asarray(model.forward(batch, kv)) for batch in (prompt, decode)]

    on = ((0, 1.0),)
    cpu, cpu_base, gpu = (
        run(backends.cpu_backend(), on),
        run(backends.cpu_backend(), ()),
        run(backends.cuda_backend(), on),
    )
    for want, base, got in zip(cpu, cpu_base, gpu, strict=True):
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 3e-2, f"logits differ by {err:.3g} of their range"
        gap = np.abs(got[0] - want[0]).max()
        assert np.abs(got[0] - base[0]).max() > 5 * gap  # the adapter acts on its sequence
        assert np.abs(got[1:] - base[1:]).max() / np.abs(base).max() < 3e-2  # not on the other


@pytest.mark.slow  # 35-40 s each in the simulator; the CPU paths of these families are in test_archs
@pytest.mark.parametrize("name", ["ministral3", "phi3-short-rope"])
def test_synthetic_families_forward_matches_cpu(name: str, tmp_path: Path) -> None:
    """RoPE scaling on the device (YaRN's pair scales and magnitude; LongRoPE's factors over a partial
    rotary span), Phi-3's split fused projections: the seeded float32 models of tests/test_archs.py."""
    g = GGUFFile(write_gguf(CASES[name], tmp_path / "model.gguf"))
    cpu_steps = run_steps(load_model(g, backends.cpu_backend()))
    gpu_steps = run_steps(load_model(g, backends.cuda_backend()))
    for want, got in zip(cpu_steps, gpu_steps, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max())


# ---------------------------------------------------------------------------------------------------
# The KV cells on the device: host copies (prompt cache, slot files) and context shift.


def test_kv_cells_round_trip_on_the_device() -> None:
    kv = KVCache(2, 3, 8, 2, 4, backends.cuda_backend())
    k = np.random.default_rng(3).standard_normal((2, 2, 5, 4)).astype(np.float16)
    kv.write_cells(1, k, 2 * k)
    got_k, got_v = kv.read_cells(1, 5)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, 2 * k)
    assert list(kv.lengths) == [0, 5, 0]
    assert not kv.k.copy_to_host()[:, [0, 2]].any()  # the other sequences are untouched


@pytest.mark.parametrize("make", FAMILIES, ids=["llama", "gemma3"])
def test_context_shift_on_the_device_matches_cpu(make: Any) -> None:
    """The same prefilled cells shifted left (overlapping ranges) by each backend: values move bitwise
    alike, keys are re-rotated alike (float32 RoPE on either side, stored as float16)."""
    g = make()
    cpu_model, gpu_model = load_model(g, backends.cpu_backend()), load_model(g, backends.cuda_backend())
    gpu_kv, cpu_kv = gpu_model.new_cache(2, 16), cpu_model.new_cache(2, 16)
    prompt = [BatchPart(0, 0, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]), BatchPart(1, 0, [7, 7])]
    gpu_model.forward(Batch.of(prompt), gpu_kv)
    before = gpu_kv.k.copy_to_host(), gpu_kv.v.copy_to_host()
    cpu_kv.k[...], cpu_kv.v[...] = before
    for model, kv in ((cpu_model, cpu_kv), (gpu_model, gpu_kv)):
        model.shift_kv(kv, 0, 4, 10, -3)  # cells 4..9 of sequence 0 move to 1..6
    gpu_k, gpu_v = gpu_kv.k.copy_to_host(), gpu_kv.v.copy_to_host()
    assert np.array_equal(gpu_v, cpu_kv.v)
    assert np.array_equal(gpu_v[:, 0, :, 1:7], before[1][:, 0, :, 4:10])  # the values moved as they were
    np.testing.assert_allclose(gpu_k.astype(np.float32), cpu_kv.k.astype(np.float32), atol=2e-3)
    assert not np.allclose(gpu_k[:, 0, :, 1:7], before[0][:, 0, :, 4:10], atol=1e-2)  # keys re-rotated
    assert np.array_equal(gpu_k[:, 1], before[0][:, 1])  # the other sequence is untouched
