"""`SamplingParams`: one request's sampler settings, llama-server's fields and defaults, and the chain they
make (common/sampling.cpp).

The chain is the logit bias, then the `samplers` stages in their order (llama-server's default order
below), then a seeded draw; with mirostat 1 or 2 it is the logit bias, plain temperature and mirostat
instead, whatever `samplers` says (as in llama.cpp, where mirostat also leaves out the penalties).
A stage named in `samplers` but switched off by its value does nothing, and a stage left out of
`samplers` is not applied whatever its value. `adaptive_p` in `samplers`, wherever it stands, is not a
stage of the order: it replaces the final draw (adaptive_target < 0: a plain draw, by llama.cpp's
std::discrete_distribution rather than its dist sampler), as in common_sampler_init.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

# SamplingParams fields that a flag or a request field of the same name sets with one number (the
# temperature, `--temp` on the command line, is the request field only).
NUMBER_FIELDS = (
    "temperature",
    "dynatemp_range",
    "dynatemp_exponent",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "top_n_sigma",
    "min_keep",
    "xtc_probability",
    "xtc_threshold",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "adaptive_target",
    "adaptive_decay",
    "seed",
)

# llama-server's default order (common/common.h) and its one-letter names (--sampler-seq).
DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
SAMPLER_LETTERS = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
    "a": "adaptive_p",
}
ADAPTIVE_P = "adaptive_p"  # ends the chain instead of the draw (see above); not in the default order
# llama.cpp also knows these; Llamba refuses them by name rather than leaving them out silently.
NOT_BUILT = {
    "infill": "infill",
    "i": "infill",
}
DEFAULT_BREAKERS = ("\n", ":", '"', "*")
_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED


def _aliases() -> dict[str, str]:
    """Every spelling llama.cpp accepts: canonical, kebab-case, without underscores, and a few more."""
    canonical = (*DEFAULT_SAMPLERS, ADAPTIVE_P)
    names = {name: name for name in canonical}
    for name in canonical:
        if "_" in name:
            names[name.replace("_", "-")] = name
            names[name.replace("_", "")] = name
    return names | {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}


SAMPLER_NAMES = _aliases()


def parse_samplers(value: str | Sequence[str]) -> tuple[str, ...]:
    """A chain order from llama-server's forms: a list of names (any case, llama.cpp's aliases), or a
    string of one-letter names (`samplers` as a string, --sampler-seq). ValueError names what is unknown."""
    if isinstance(value, str):
        return tuple(_one(letter, SAMPLER_LETTERS, "sampler letter") for letter in value)
    return tuple(_one(str(name).lower(), SAMPLER_NAMES, "sampler") for name in value)


def _one(name: str, known: dict[str, str], what: str) -> str:
    if name in known:
        return known[name]
    if name in NOT_BUILT:
        raise ValueError(f"the {NOT_BUILT[name]!r} sampler is not supported")
    raise ValueError(f"unknown {what} {name!r} (known: {', '.join(dict.fromkeys(known))})")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # <= 0: the best token (with dynatemp_range 0)
    dynatemp_range: float = 0.0  # > 0: the temperature follows the entropy within temperature +- range
    dynatemp_exponent: float = 1.0
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off
    typical_p: float = 1.0  # >= 1: off
    top_n_sigma: float = -1.0  # <= 0: off
    min_keep: int = 0  # top-p, min-p, typical and XTC keep at least this many
    xtc_probability: float = 0.0  # <= 0: off
    xtc_threshold: float = 0.1  # > 0.5: off
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # 0: penalties off; < 0: the whole history (llama-server maps -1 to n_ctx)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0  # 0: DRY off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # 0: DRY off; -1: the whole history
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_BREAKERS
    mirostat: int = 0  # 1 or 2: Mirostat (the samplers chain is not used)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # adaptive-p (with `adaptive_p` in samplers): draw tokens whose probability averages this target
    adaptive_target: float = -1.0  # < 0: off (a plain draw); llama-server clamps a request's to <= 1
    adaptive_decay: float = 0.9  # the average's decay (memory ~ 1/(1 - decay) tokens), used within [0, 0.99]
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: dict[int, float] = field(default_factory=dict)  # -inf bans a token
    seed: int = -1  # < 0 (or 0xFFFFFFFF, llama.cpp's -1 as uint32): random
    n_probs: int = 0  # top probabilities to report per token
    post_sampling_probs: bool = False  # report them after the chain instead of from the raw logits

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and math.isnan(value):
                raise ValueError(f"{f.name} must be a number, got NaN")
        for problem in _range_problems(self):
            raise ValueError(problem)
        object.__setattr__(self, "samplers", parse_samplers(self.samplers))
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))

    @property
    def random_seed(self) -> bool:
        return self.seed < 0 or self.seed == _RANDOM_SEED

    @property
    def greedy(self) -> bool:
        """The chain ends in the single best token: temperature <= 0 (not dynamic) is in the chain."""
        return (
            not self.mirostat
            and "temperature" in self.samplers
            and self.temperature <= 0
            and self.dynatemp_range <= 0
        )

    @property
    def has_penalties(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )

    @property
    def adaptive_p(self) -> bool:
        """The chain ends in adaptive-p instead of the draw: `adaptive_p` in samplers, no mirostat."""
        return not self.mirostat and ADAPTIVE_P in self.samplers

    def active(self, stage: str) -> bool:
        """Whether a stage of the chain changes anything at these settings."""
        return {
            "penalties": self.has_penalties,
            "dry": self.dry_multiplier != 0 and self.dry_penalty_last_n != 0,
            "top_n_sigma": self.top_n_sigma > 0,
            "top_k": self.top_k > 0,
            "typ_p": self.typical_p < 1,
            "top_p": self.top_p < 1,
            "min_p": self.min_p > 0,
            "xtc": self.xtc_probability > 0 and self.xtc_threshold <= 0.5,
            "temperature": self.temperature != 1.0 or self.dynatemp_range > 0,
        }[stage]

    def chain(self) -> tuple[str, ...]:
        """The stages that act, in order (empty with mirostat, whose chain is fixed; adaptive-p, which
        ends the chain, is not one of them)."""
        if self.mirostat:
            return ()
        return tuple(s for s in self.samplers if s != ADAPTIVE_P and self.active(s))


def _range_problems(p: SamplingParams) -> list[str]:
    checks = [
        ("repeat_penalty", p.repeat_penalty > 0 and math.isfinite(p.repeat_penalty), "a finite number > 0"),
        ("presence_penalty", math.isfinite(p.presence_penalty), "finite"),
        ("frequency_penalty", math.isfinite(p.frequency_penalty), "finite"),
        ("n_probs", p.n_probs >= 0, ">= 0"),
        ("min_keep", p.min_keep >= 0, ">= 0"),
        ("typical_p", p.typical_p >= 0, ">= 0"),
        ("xtc_probability", 0 <= p.xtc_probability <= 1, "between 0 and 1"),
        ("xtc_threshold", 0 <= p.xtc_threshold <= 1, "between 0 and 1"),
        ("dynatemp_range", 0 <= p.dynatemp_range < math.inf, "a finite number >= 0"),
        ("dynatemp_exponent", 0 <= p.dynatemp_exponent < math.inf, "a finite number >= 0"),
        ("top_n_sigma", math.isfinite(p.top_n_sigma), "finite"),
        ("dry_multiplier", 0 <= p.dry_multiplier < math.inf, "a finite number >= 0"),
        ("dry_base", 1 <= p.dry_base < math.inf, "a finite number >= 1"),
        ("dry_allowed_length", p.dry_allowed_length >= 0, ">= 0"),
        ("dry_penalty_last_n", p.dry_penalty_last_n >= -1, ">= -1"),
        ("mirostat", p.mirostat in (0, 1, 2), "0, 1 or 2"),
        ("mirostat_tau", 0 <= p.mirostat_tau < math.inf, "a finite number >= 0"),
        ("mirostat_eta", 0 <= p.mirostat_eta < math.inf, "a finite number >= 0"),
        ("adaptive_target", math.isfinite(p.adaptive_target), "finite"),
        ("adaptive_decay", math.isfinite(p.adaptive_decay), "finite"),
    ]
    return [f"{name} must be {rule}, got {getattr(p, name)!r}" for name, ok, rule in checks if not ok]
