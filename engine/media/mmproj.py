"""A projector GGUF (`--mmproj`, general.architecture `clip`): its hyper-parameters and the loader.

The keys and tensor names are llama.cpp's (tools/mtmd/clip-impl.h, read as clip.cpp's load_hparams reads
them). Three projector types are built: `gemma3` (SigLIP + Gemma 3's pooling projector, engine/media/
vision.py), `mlp` (llava-1.5's CLIP + two-layer MLP, engine/media/llava.py) without
image_grid_pinpoints (llava-1.6's llava-uhd slicing is not built) and `idefics3` (SmolVLM's SigLIP, tiles
and pixel shuffle, engine/media/idefics3.py) with clip.vision.preproc_image_size; any other, a file
without a vision encoder, or an encoder option the backend has no kernel for is refused at load with one
line naming it, and so is a file with tensors the projector left unread (a norm or bias skipped silently
would change every embedding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.audio import AudioProjector, UnsupportedAudioProjector, load_audio_projector
from engine.media.idefics3 import Idefics3Projector
from engine.media.llava import LlavaProjector
from engine.media.vision import FLOAT_TYPES, Projector, tower_sizes

SUPPORTED_PROJECTORS = ("gemma3", "mlp", "idefics3")
# clip.cpp's defaults per projector type: Gemma 3 pools 4x4 patches (tinygemma3 says otherwise in
# clip.vision.projector.scale_factor) and resizes bilinearly; llava's `mlp` keeps every patch, resizes
# bicubically (clip.cpp's default) and pads with image_pad_color {122, 116, 104}; idefics3 resizes with
# Lanczos (its llava-uhd defaults) and has no default scale factor (clip.cpp's 1 fails its assert).
DEFAULT_MERGE = {"gemma3": 4}
RESIZE_ALGO = {"gemma3": "bilinear", "idefics3": "lanczos"}
PAD_COLOR = {"mlp": (122, 116, 104)}
# The vision feed-forward activations built per type (clip.cpp's hparams.ffn_op): llava-1.5's CLIP
# runs quick GELU (clip.use_gelu false), on the host (llava.py).
FFN_OPS = {"gemma3": ("gelu",), "mlp": ("gelu", "gelu_quick"), "idefics3": ("gelu",)}
PINPOINTS = "clip.vision.image_grid_pinpoints"
PREPROC_SIZE = "clip.vision.preproc_image_size"
# The tensors each type cannot run without, checked before anything is packed.
REQUIRED = {
    "gemma3": ("v.patch_embd.weight", "mm.input_projection.weight"),
    "mlp": ("v.patch_embd.weight", "mm.0.weight", "mm.2.weight"),
    "idefics3": ("v.patch_embd.weight", "mm.model.fc.weight"),
}
# A conv and a transposed matrix: float only (llava's mm.0 / mm.2 and idefics3's mm.model.fc may be any
# type the backend packs).
FLOAT_ONLY = ("v.patch_embd.weight", "mm.input_projection.weight")
PROJECTORS = {"gemma3": Projector, "mlp": LlavaProjector, "idefics3": Idefics3Projector}


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
    pad_color: tuple[int, int, int] = (0, 0, 0)  # the fixed-size resize's border
    feature_layers: tuple[int, ...] = ()  # clip.vision.feature_layer: where llava's encoder stops
    longest_edge: int = 0  # clip.vision.preproc_image_size: idefics3's resize target, 0 when absent

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> ProjectorHParams:
        meta = g.metadata
        kind = projector_type(g)

        def key(name: str, default: Any = None) -> Any:
            value = meta.get(f"clip.vision.{name}", default)
            if value is None:
                raise UnsupportedProjector(f"{g.path.name}: projector file lacks clip.vision.{name}")
            return value

        return cls(
            projector_type=kind,
            **tower_sizes(key),
            projection_dim=int(key("projection_dim")),
            image_size=int(key("image_size")),
            patch_size=int(key("patch_size")),
            image_mean=_triple(g, key("image_mean", ())),
            image_std=_triple(g, key("image_std", ())),
            n_merge=int(key("projector.scale_factor", DEFAULT_MERGE.get(kind, 1))),
            ffn_op=_ffn_op(g),
            resize_algo=RESIZE_ALGO.get(kind, "bicubic"),
            pad_color=PAD_COLOR.get(kind, (0, 0, 0)),
            feature_layers=tuple(int(v) for v in meta.get("clip.vision.feature_layer", ())),
            longest_edge=int(meta.get(PREPROC_SIZE, 0)),
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
    if kind == "mlp" and len(g.metadata.get(PINPOINTS, ())):
        raise UnsupportedProjector(
            f"{name} has {PINPOINTS} (llava-1.6 style): llava-uhd image slicing is not built"
        )
    if backend.layernorm is None or backend.gelu is None or backend.encoder_attention is None:
        raise UnsupportedProjector(f"the {kind} projector runs on the CPU only (backend {backend.name})")


def check_tensors(g: GGUFFile, hp: ProjectorHParams) -> None:
    """What the encoder's shapes and types must be before anything is packed."""
    name, t = g.path.name, g.tensors
    if hp.n_patches_side < hp.n_merge:
        raise UnsupportedProjector(f"{name}: {hp.n_patches_side} patches a side cannot pool by {hp.n_merge}")
    llava = hp.projector_type == "mlp"
    for tensor in REQUIRED[hp.projector_type]:
        if tensor not in t:
            raise UnsupportedProjector(f"{name}: {tensor} is missing")
        if tensor in FLOAT_ONLY and t[tensor].ggml_type not in FLOAT_TYPES:
            raise UnsupportedProjector(f"{name}: {tensor} is {t[tensor].type_name}, not F32/F16/BF16")
    # llava's CLIP has one more position, its class embedding's (siglip has none)
    n_pos = hp.n_patches_side**2 + (1 if llava and "v.class_embd" in t else 0)
    rows = t["v.position_embd.weight"].shape[0] if "v.position_embd.weight" in t else 0
    if rows != n_pos:
        raise UnsupportedProjector(f"{name}: {rows} learned positions for {n_pos} rows")
    if llava:
        check_llava(g, hp)
    if hp.projector_type == "idefics3":
        check_idefics3(g, hp)


def check_llava(g: GGUFFile, hp: ProjectorHParams) -> None:
    """llava's encoder stops at one feature layer and its MLP's shapes chain: mm.0 reads n_embd."""
    name, t = g.path.name, g.tensors
    if len(hp.feature_layers) > 1:  # granite's stack of several layers' states: not built
        raise UnsupportedProjector(f"{name}: {len(hp.feature_layers)} vision feature layers are not built")
    if any(f > hp.n_layer for f in hp.feature_layers):
        raise UnsupportedProjector(f"{name}: feature layer {hp.feature_layers[0]} of {hp.n_layer} blocks")
    if "mm.3.weight" in t:  # clip.cpp turns such a file into mlp_norm (Yi-VL's)
        raise UnsupportedProjector(f"{name}: mm.3 (Yi-style mlp_norm projector) is not built")
    (_, cols0), (_, cols2) = t["mm.0.weight"].shape, t["mm.2.weight"].shape
    if cols0 != hp.n_embd or cols2 != t["mm.0.weight"].shape[0]:
        raise UnsupportedProjector(f"{name}: mm.0 / mm.2 do not chain from the encoder's {hp.n_embd}")


def check_idefics3(g: GGUFFile, hp: ProjectorHParams) -> None:
    """idefics3 shuffles s x s patches into one row (s > 1: clip.cpp asserts it), and only the longest-edge
    slicing is built: files without preproc_image_size take llava-uhd's generic slices in llama.cpp."""
    name, t = g.path.name, g.tensors
    if hp.n_merge < 2:
        raise UnsupportedProjector(f"{name}: idefics3 needs clip.vision.projector.scale_factor > 1")
    if hp.longest_edge <= 0:
        raise UnsupportedProjector(f"{name} lacks {PREPROC_SIZE}: older idefics3 files' slicing is not built")
    cols = t["mm.model.fc.weight"].shape[1]
    if cols != hp.n_embd * hp.n_merge**2:
        raise UnsupportedProjector(
            f"{name}: mm.model.fc reads {cols}, not {hp.n_merge}^2 x the encoder's {hp.n_embd}"
        )


AnyProjector = Projector | LlavaProjector | Idefics3Projector | AudioProjector


def load_projector(path: str | Path, backend: Backend) -> AnyProjector:
    """The projector of an mmproj GGUF on `backend`; UnsupportedProjector (one line) when it cannot run."""
    g = GGUFFile(path)
    meta = g.metadata
    if meta.get("general.architecture") == "clip" and meta.get("clip.has_audio_encoder", False):
        if meta.get("clip.has_vision_encoder", False):
            raise UnsupportedProjector(
                f"{g.path.name} holds a vision and an audio encoder: not built (one of them is)"
            )
        try:  # an audio encoder (engine/media/audio.py), whose own checks name what it cannot run
            return load_audio_projector(g, backend)
        except UnsupportedAudioProjector as exc:
            raise UnsupportedProjector(str(exc)) from None
    check_supported(g, backend)
    hp = ProjectorHParams.from_gguf(g)
    built = FFN_OPS[hp.projector_type]
    if hp.ffn_op not in built:
        raise UnsupportedProjector(
            f"{g.path.name}: the vision feed-forward's {hp.ffn_op} is not built (built: {', '.join(built)})"
        )
    check_tensors(g, hp)
    projector = PROJECTORS[hp.projector_type](g, hp, backend)
    unread = g.tensors.unread()
    if unread:
        shown = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        raise UnsupportedProjector(
            f"{g.path.name}: tensors the {hp.projector_type} projector does not use: {shown}"
        )
    g.release_pages()
    return projector
