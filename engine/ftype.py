"""A GGUF's file type as llama.cpp names it (`llama_ftype_name`): what llama-server reports as
`model_ftype` in /props and `ftype` in /v1/models' meta.

The type is the file's `general.file_type`; a file without one gets the type of its most common tensor
type, named with a "(guessed) " prefix, as llama.cpp's model loader guesses it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

# llama_ftype values -> llama.cpp's names (include/llama.h, src/llama-model-loader.cpp).
FTYPE_NAMES = {
    0: "all F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K - Medium",
    11: "Q3_K - Small",
    12: "Q3_K - Medium",
    13: "Q3_K - Large",
    14: "Q4_K - Small",
    15: "Q4_K - Medium",
    16: "Q5_K - Small",
    17: "Q5_K - Medium",
    18: "Q6_K",
    19: "IQ2_XXS - 2.0625 bpw",
    20: "IQ2_XS - 2.3125 bpw",
    21: "Q2_K - Small",
    22: "IQ3_XS - 3.3 bpw",
    23: "IQ3_XXS - 3.0625 bpw",
    24: "IQ1_S - 1.5625 bpw",
    25: "IQ4_NL - 4.5 bpw",
    26: "IQ3_S - 3.4375 bpw",
    27: "IQ3_S mix - 3.66 bpw",
    28: "IQ2_S - 2.5 bpw",
    29: "IQ2_M - 2.7 bpw",
    30: "IQ4_XS - 4.25 bpw",
    31: "IQ1_M - 1.75 bpw",
    32: "BF16",
    36: "TQ1_0 - 1.69 bpw ternary",
    37: "TQ2_0 - 2.06 bpw ternary",
    38: "MXFP4 MoE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}
UNKNOWN = "unknown, may not work"

# A tensor's ggml type -> the llama_ftype llama.cpp guesses from it; any other type guesses all F32.
GUESSED_FROM = {
    0: 0,  # F32
    1: 1,  # F16
    30: 32,  # BF16
    2: 2,  # Q4_0
    3: 3,  # Q4_1
    6: 8,  # Q5_0
    7: 9,  # Q5_1
    8: 7,  # Q8_0
    10: 10,  # Q2_K
    11: 12,  # Q3_K: Q3_K - Medium
    12: 15,  # Q4_K: Q4_K - Medium
    13: 17,  # Q5_K: Q5_K - Medium
    14: 18,  # Q6_K
    34: 36,  # TQ1_0
    35: 37,  # TQ2_0
    16: 19,  # IQ2_XXS
    17: 20,  # IQ2_XS
    22: 28,  # IQ2_S
    18: 23,  # IQ3_XXS
    19: 24,  # IQ1_S
    29: 31,  # IQ1_M
    20: 25,  # IQ4_NL
    23: 30,  # IQ4_XS
    21: 26,  # IQ3_S
    40: 39,  # NVFP4
    41: 40,  # Q1_0
}


def ftype_name(metadata: Mapping[str, Any], tensor_types: Iterable[tuple[str, int]]) -> str:
    """llama.cpp's name of the file's type. `tensor_types`: (name, ggml type) of every tensor."""
    declared = metadata.get("general.file_type")
    if declared is not None:
        return FTYPE_NAMES.get(int(declared), UNKNOWN)
    return "(guessed) " + FTYPE_NAMES[GUESSED_FROM.get(_most_common(tensor_types), 0)]


def _most_common(tensor_types: Iterable[tuple[str, int]]) -> int:
    """The ggml type most tensors have; on a tie the one that got there first in name order (llama.cpp
    counts over its name-sorted map and keeps the first type to reach the highest count)."""
    counts: Counter[int] = Counter()
    best, best_n = 0, 0
    for _, ggml_type in sorted(tensor_types):
        counts[ggml_type] += 1
        if counts[ggml_type] > best_n:
            best, best_n = ggml_type, counts[ggml_type]
    return best
