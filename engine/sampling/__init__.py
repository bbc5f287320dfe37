"""Token sampling: llama.cpp's sampler chain (src/llama-sampler.cpp, common/sampling.cpp), vectorised.

llama-server's chain is

    logit-bias -> penalties -> dry -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc
    -> temperature (dynamic with dynatemp_range) -> dist

in the order `samplers` gives (ending in adaptive-p instead of dist when `samplers` names it), or
logit-bias -> temperature -> mirostat (1 or 2). At llama-server's defaults only the bias, top-k, top-p,
min-p and temperature act, and that chain has a fast path.

- `params.py`: `SamplingParams` (the fields, their checks, the chain they make; `parse_samplers`).
- `sampler.py`: `Sampler`, one sequence's chain: `sample`, `accept`, `distribution`, logprobs.
- `default_chain.py`: the fast path; `stages.py`: every stage as llama.cpp defines it.
- `dry.py`, `mirostat.py`, `penalties.py`, `adaptive_p.py`: the stateful stages.
- `distribution.py`: what the chain leaves to draw from; `rng.py`: llama.cpp's random numbers;
  `arrays.py`: the numpy building blocks.
"""

from engine.sampling.distribution import Distribution
from engine.sampling.dry import Breakers, DryVocabulary
from engine.sampling.params import (
    DEFAULT_SAMPLERS,
    NUMBER_FIELDS,
    SAMPLER_LETTERS,
    SamplingParams,
    parse_samplers,
)
from engine.sampling.sampler import Sampler

__all__ = [
    "DEFAULT_SAMPLERS",
    "NUMBER_FIELDS",
    "SAMPLER_LETTERS",
    "Breakers",
    "Distribution",
    "DryVocabulary",
    "Sampler",
    "SamplingParams",
    "parse_samplers",
]
