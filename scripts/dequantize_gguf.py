"""Write a GGUF's weights dequantized (F32; the token embedding F16): the same model without quantized
matmuls, so llama.cpp and Llamba both multiply in float and their hidden states can be compared without
either's int8 activations (docs/numerics.md, embeddings).

    .venv/bin/python scripts/dequantize_gguf.py IN.gguf OUT.gguf
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

from engine.quant import dequantize


def main(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type"):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))  # (rows, cols)
        if len(shape) == 1:
            data = np.array(t.data, dtype=np.float32)
        else:
            rows = int(np.prod(shape[:-1]))
            data = dequantize(np.asarray(t.data), int(t.tensor_type), (rows, shape[-1])).reshape(shape)
            data = data.astype(np.float16) if t.name == "token_embd.weight" else data
        writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
