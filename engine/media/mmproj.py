"""A projector GGUF (`--mmproj`, general.architecture `clip`): its hyper-parameters and the loader.

The keys and tensor names are llama.cpp's (tools/mtmd/clip-impl.h, read as clip.cpp's load_hparams reads
them). One projector type is built, `gemma3` (SigLIP + Gemma 3's pooling projector, engine/media/
vision.py); any other, a file without a vision encoder, or an encoder option the backend has no kernel
for is refused at load with one line naming it, and so is a file with tensors the projector left unread
(a norm or bias skipped silently would change every embedding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.vision import FLOAT_TYPES, Projector

SUPPORTED_PROJECTORS = ("gemma3",)
# clip.cpp's defaults per projector type: Gemma 3 pools 4x4 patches (tinygemma3 says otherwise in
# clip.vision.projector.scale_factor) and resizes bilinearly.
DEFAULT_MERGE = {"gemma3": 4}
RESIZE_ALGO = {"gemma3": "bilinear"}


class UnsupportedProjector(ValueError):
    """A projector file this build cannot run (its type, modality or options); the message names it."""


@dataclass(frozen=True)
class ProjectorHParams:
    projector_type: str
    n_embd: int  # the vision encoder's width
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_layer: int
    projection_dim: int
    eps: float  # clip.vision.attention.layer_norm_epsilon: every LayerNorm's, and the projector's RMS norm
    image_size: int
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    n_merge: int  # the projector's pooling kernel over the patch grid
    ffn_op: str  # gelu (clip.use_gelu), silu (clip.use_silu), else gelu_quick: clip.cpp's hparams.ffn_op
    resize_algo: str

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> ProjectorHParams:
        meta = g.metadata
        kind = projector_type(g)

        def key(name: str, default: Any = None) -> Any:
            value = meta.get(f"clip.vision.{name}", default)
            if value is None:
                raise UnsupportedProjector(f"{g.path.name}: projector file lacks clip.vision.{name}")
            return value

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        return cls(
            projector_type=kind,
            n_embd=n_embd,
            n_ff=int(key("feed_forward_length")),
            n_head=n_head,
            n_head_kv=int(key("attention.head_count_kv", n_head)),
            head_dim=int(key("attention.head_dim", n_embd // n_head)),
            n_layer=int(key("block_count")),
            projection_dim=int(key("projection_dim")),
            eps=float(key("attention.layer_norm_epsilon")),
            image_size=int(key("image_size")),
            patch_size=int(key("patch_size")),
            image_mean=_triple(g, key("image_mean", ())),
            image_std=_triple(g, key("image_std", ())),
            n_merge=int(key("projector.scale_factor", DEFAULT_MERGE.get(kind, 1))),
            ffn_op=_ffn_op(g),
            resize_algo=RESIZE_ALGO.get(kind, "bicubic"),
        )

    @property
    def n_patches_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_image_tokens(self) -> int:
        """Tokens one image becomes: the patch grid pooled n_merge x n_merge (ggml's pool drops a
        partial window)."""
        return (self.n_patches_side // self.n_merge) ** 2


def _triple(g: GGUFFile, values: Any) -> tuple[float, float, float]:
    if len(values) < 3:
        raise UnsupportedProjector(f"{g.path.name}: image_mean/image_std need 3 values, got {len(values)}")
    return (float(values[0]), float(values[1]), float(values[2]))


def _ffn_op(g: GGUFFile) -> str:
    gelu, silu = bool(g.metadata.get("clip.use_gelu", False)), bool(g.metadata.get("clip.use_silu", False))
    if gelu and silu:
        raise UnsupportedProjector(f"{g.path.name}: both clip.use_gelu and clip.use_silu are set")
    return "gelu" if gelu else "silu" if silu else "gelu_quick"


def projector_type(g: GGUFFile) -> str:
    """clip.projector_type, else clip.vision.projector_type (files with several modalities)."""
    meta = g.metadata
    return str(meta.get("clip.projector_type") or meta.get("clip.vision.projector_type") or "")


def check_supported(g: GGUFFile, backend: Backend) -> None:
    """One line naming why this file cannot run here, as an UnsupportedProjector; nothing when it can."""
    name = g.path.name
    if g.metadata.get("general.architecture") != "clip":
        arch = g.metadata.get("general.architecture")
        raise UnsupportedProjector(
            f"{name} is not a projector file (general.architecture {arch!r}, not 'clip')"
        )
    if not g.metadata.get("clip.has_vision_encoder", False):
        raise UnsupportedProjector(f"{name} has no vision encoder (clip.has_vision_encoder is not set)")
    kind = projector_type(g)
    if kind not in SUPPORTED_PROJECTORS:
        supported = ", ".join(SUPPORTED_PROJECTORS)
        raise UnsupportedProjector(f"unsupported projector type {kind!r} in {name} (supported: {supported})")
    if backend.layernorm is None or backend.gelu is None or backend.encoder_attention is None:
        raise UnsupportedProjector(f"the {kind} projector runs on the CPU only (backend {backend.name})")


def check_tensors(g: GGUFFile, hp: ProjectorHParams) -> None:
    """What the encoder's shapes and types must be before anything is packed."""
    name, t = g.path.name, g.tensors
    if hp.n_patches_side < hp.n_merge:
        raise UnsupportedProjector(f"{name}: {hp.n_patches_side} patches a side cannot pool by {hp.n_merge}")
    for tensor in ("v.patch_embd.weight", "mm.input_projection.weight"):
        if tensor not in t:
            raise UnsupportedProjector(f"{name}: {tensor} is missing")
        if t[tensor].ggml_type not in FLOAT_TYPES:  # a conv and a transposed matrix: float only
            raise UnsupportedProjector(f"{name}: {tensor} is {t[tensor].type_name}, not F32/F16/BF16")
    rows = t["v.position_embd.weight"].shape[0] if "v.position_embd.weight" in t else 0
    if rows != hp.n_patches_side**2:
        raise UnsupportedProjector(f"{name}: {rows} learned positions for {hp.n_patches_side**2} patches")


def load_projector(path: str | Path, backend: Backend) -> Projector:
    """The projector of an mmproj GGUF on `backend`; UnsupportedProjector (one line) when it cannot run."""
    g = GGUFFile(path)
    check_supported(g, backend)
    hp = ProjectorHParams.from_gguf(g)
    if hp.ffn_op != "gelu":
        raise UnsupportedProjector(
            f"{g.path.name}: the vision feed-forward's {hp.ffn_op} is not built (gelu is)"
        )
    check_tensors(g, hp)
    projector = Projector(g, hp, backend)
    unread = g.tensors.unread()
    if unread:
        shown = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        raise UnsupportedProjector(
            f"{g.path.name}: tensors the {hp.projector_type} projector does not use: {shown}"
        )
    g.release_pages()
    return projector
