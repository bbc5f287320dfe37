"""Control vectors (llama.cpp's `--control-vector`, `--control-vector-scaled`,
`--control-vector-layer-range`): a direction added to the residual stream after each layer in range,
for every token of every request.

A control vector file is a GGUF (llama.cpp's cvector-generator writes `general.architecture =
controlvector` and `controlvector.model_hint`, which llama.cpp does not check) whose tensors are
`direction.N`: float32, one dimension of n_embd, for layer N (N >= 1; layer 0 never has one). As
common.cpp's common_control_vector_load reads them: each file's directions times its scale (several
`direction.N` of one file add up), then the files summed in order; a file with another name, type, shape
or width fails the load (one line, ControlVectorError).
As llama_adapter_cvec applies them: layer il (0-based) adds direction.il after its output (build_cvec,
after the FFN's residual add) when start <= il <= end (inclusive; start <= 0 means 1, end <= 0 the last
layer), for il from 1 to n_layer - 1; a vector of another width than the model's fails the load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf import GGUFFile

GGML_F32 = 0


class ControlVectorError(ValueError):
    """A control vector that cannot be applied (one line naming the file and why)."""


@dataclass(frozen=True)
class ControlVector:
    n_embd: int
    directions: dict[int, np.ndarray]  # layer N -> float32 [n_embd]: the files' scaled sum


def _load_one(path: Path, scale: float) -> ControlVector:
    try:
        g = GGUFFile(path)
    except Exception as exc:
        raise ControlVectorError(f"control vector {path}: cannot be read ({exc})") from exc
    n_embd = -1
    out: dict[int, np.ndarray] = {}
    for name, t in g.tensors.items():
        prefix, _, index = name.partition(".")
        layer = int(index) if prefix == "direction" and index.isdigit() else -1
        if layer <= 0:
            why = "index 0" if layer == 0 else "an unparsable layer index"
            raise ControlVectorError(
                f"control vector {path}: tensor {name!r} has {why} (direction.N, N >= 1)"
            )
        if t.ggml_type != GGML_F32 or len(t.shape) != 1:
            raise ControlVectorError(f"control vector {path}: {name!r} is not a 1-D F32 tensor")
        if n_embd not in (-1, t.shape[0]):
            raise ControlVectorError(f"control vector {path}: {name!r} has {t.shape[0]} values, not {n_embd}")
        n_embd = int(t.shape[0])
        acc = out.setdefault(layer, np.zeros(n_embd, np.float32))
        acc += np.asarray(t.data, np.float32) * np.float32(scale)
    if n_embd < 0:
        raise ControlVectorError(f"control vector {path}: no direction tensors")
    return ControlVector(n_embd, out)


def load_control_vectors(files: Sequence[tuple[str | Path, float]]) -> ControlVector:
    """The files' directions, each times its scale, summed (common_control_vector_load)."""
    total: ControlVector | None = None
    for path, scale in files:
        cur = _load_one(Path(path), scale)
        if total is None:
            total = cur
            continue
        if cur.n_embd != total.n_embd:
            raise ControlVectorError(
                f"control vector {path}: {cur.n_embd} values per direction, the others have {total.n_embd}"
            )
        for layer, d in cur.directions.items():
            total.directions.setdefault(layer, np.zeros(total.n_embd, np.float32))
            total.directions[layer] = total.directions[layer] + d
    if total is None:
        raise ControlVectorError("no control vector files given")
    return total


def apply_control_vector(model: Any, cvec: ControlVector, layer_start: int = -1, layer_end: int = -1) -> None:
    """Set the model's per-layer directions (`LlamaModel.run` adds them after each layer's output)."""
    from engine.models.llama import LlamaModel

    hp = model.hp
    if not isinstance(model, LlamaModel) or type(model).run is not LlamaModel.run:
        raise ControlVectorError(f"control vectors are not wired into {type(model).__name__}'s forward pass")
    if cvec.n_embd != hp.n_embd:
        raise ControlVectorError(
            f"control vector n_embd ({cvec.n_embd}) does not match the model's ({hp.n_embd})"
        )
    start = layer_start if layer_start > 0 else 1
    end = layer_end if layer_end > 0 else hp.n_layer
    model.control = {
        il: model.backend.upload(np.ascontiguousarray(cvec.directions[il]))
        for il in range(max(start, 1), min(end, hp.n_layer - 1) + 1)
        if il in cvec.directions
    }
