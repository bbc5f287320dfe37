"""SYNTHETIC control vectors for a real base model file, laid out as llama.cpp's cvector-generator writes
them (no real control vector is reachable from here; nothing here was trained).

The file is a GGUF with `general.architecture = controlvector`, `controlvector.model_hint` (the base's
architecture) and
`controlvector.layer_count`, and one float32 tensor `direction.N` of n_embd values per layer N from 1 to
n_layer - 1 (llama.cpp has no direction for layer 0). The values are random (a fixed seed), each direction
scaled to the root-mean-square `strength`: at scale 1 the logits move visibly, the text stays text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.gguf import GGUFFile


def write_control_vector(
    base: Path, out: Path, *, seed: int = 0, strength: float = 0.5, n_embd: int | None = None
) -> Path:
    """Write a synthetic control vector for the base GGUF `base` to `out` (n_embd: another width, for the
    refusal's test); returns `out`."""
    import gguf

    g = GGUFFile(base)
    arch = str(g.metadata["general.architecture"])
    n_layer = int(g.metadata[f"{arch}.block_count"])
    width = n_embd if n_embd is not None else int(g.metadata[f"{arch}.embedding_length"])
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), "controlvector")
    # as cvector-generator writes it: general.architecture "controlvector" (GGUFWriter's), a model hint
    writer.add_string("controlvector.model_hint", arch)
    writer.add_int32("controlvector.layer_count", n_layer - 1)
    writer.add_name(f"synthetic control vector seed {seed} for {g.path.name}")
    for il in range(1, n_layer):
        d = rng.standard_normal(width)
        writer.add_tensor(f"direction.{il}", (d * strength / np.sqrt(np.mean(d * d))).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
