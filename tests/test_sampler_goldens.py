"""Every sampler stage, and whole seeded chains, against llama.cpp's own on fixed logits.

tests/golden/samplers.json is written by scripts/make_sampler_goldens.py with llama-cpp-python's
bindings of llama.cpp's samplers (tests/golden/README.md). Each case gives Llamba's sampling fields,
so both sides are configured from the same values.

Tolerances: the kept candidates (and their order) must be the same, those at -inf aside (llama.cpp
leaves some in its array, e.g. greedy temperature and top-n-sigma mask rather than remove; they can never
be drawn and llama-server never reports them); logits after the chain within
1e-5 relative (dynamic temperature computes its temperature in float32 like llama.cpp, but numpy's
exp/log may differ from glibc's by an ulp); probabilities (softmax of those logits) within 1e-6. Seeded
runs must pick llama.cpp's token at every step: Llamba draws llama.cpp's random numbers
(engine/sampling/rng.py) in llama.cpp's candidate order. Runs ending in adaptive-p also compare the
first candidates' logits after its transform at each step (within 1e-5: they follow the moving
average, so a drifting average shows there before it flips a pick).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.gguf import GGUFFile
from engine.sampling import Distribution, DryVocabulary, Sampler, SamplingParams
from engine.text.tokenizer import Tokenizer
from tests.conftest import load_golden

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = (
    "samplers run in numpy (and an integer Numba kernel, DRY's): no float computed for a level"
)

GOLDEN = load_golden("samplers")


@pytest.fixture(scope="module")
def smollm2_dry(smollm2_gguf: GGUFFile) -> DryVocabulary:
    return DryVocabulary(Tokenizer.from_gguf(smollm2_gguf))


def logits_of(name: str) -> np.ndarray:
    vec = GOLDEN["vectors"][name]
    if "n" in vec:
        out = np.full(vec["n"], vec["fill"], dtype=np.float32)
        out[vec["ids"]] = np.array(vec["logits"], dtype=np.float32)
        return out
    return np.array([float(v) for v in vec["logits"]], dtype=np.float32)


def params_of(case: dict[str, Any]) -> SamplingParams:
    fields = {**GOLDEN["defaults"], **case["params"]}
    fields["logit_bias"] = {int(t): float(b) for t, b in fields["logit_bias"].items()}
    fields["dry_sequence_breakers"] = tuple(fields["dry_sequence_breakers"])
    return SamplingParams(**fields)


def sampler_for(case: dict[str, Any], n_vocab: int, dry: DryVocabulary | None) -> Sampler:
    params = params_of(case)
    breakers = dry.breakers(params.dry_sequence_breakers) if dry is not None else None
    sampler = Sampler(params, n_vocab, breakers)
    for token in case.get("history", []):
        sampler.accept(token)
    return sampler


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    w = np.exp(x - x[np.isfinite(x)].max())
    return w / w.sum()


def ids_of(dist: Distribution) -> np.ndarray:
    return np.arange(dist.size) if dist.ids is None else np.asarray(dist.ids)


ONCE = [c for c in GOLDEN["once"] if "applications" not in c]


@pytest.mark.parametrize("case", ONCE, ids=[c["name"] for c in ONCE])
def test_a_chain_keeps_what_llama_cpp_keeps(case: dict[str, Any], request: pytest.FixtureRequest) -> None:
    dry = request.getfixturevalue("smollm2_dry") if case.get("vocab") else None
    logits = logits_of(case["vector"])
    dist = sampler_for(case, logits.size, dry).distribution(logits)
    finite = np.isfinite(dist.logits)
    ids, after = ids_of(dist)[finite], dist.logits[finite]
    assert after.size == case["finite"]
    kept = [(i, float(v)) for i, v in case["kept"] if np.isfinite(float(v))]
    expected_ids = [i for i, _ in kept]
    expected = np.array([v for _, v in kept], dtype=np.float32)
    assert ids[: len(expected_ids)].tolist() == expected_ids
    np.testing.assert_allclose(after[: len(expected)], expected, rtol=1e-5, atol=1e-6)
    assert after.astype(np.float64).sum() == pytest.approx(case["kept_logit_sum"], rel=1e-5, abs=1e-4)
    if case["finite"] <= len(expected):
        np.testing.assert_allclose(softmax(after), softmax(expected), atol=1e-6)
    for token, value in case["changed"]:
        assert after[ids == token][0] == pytest.approx(float(value), rel=1e-5, abs=1e-6), token
    if case["changed"]:
        original = logits[ids]
        assert int((after != original).sum()) == len(case["changed"])


XTC_RUNS = [c for c in GOLDEN["once"] if "applications" in c]


@pytest.mark.parametrize("case", XTC_RUNS, ids=[c["name"] for c in XTC_RUNS])
def test_xtc_fires_when_llama_cpp_fires(case: dict[str, Any]) -> None:
    """XTC's coin comes from its own generator, seeded like llama.cpp's: the same applications fire."""
    logits = logits_of(case["vector"])
    sampler = sampler_for(case, logits.size, None)
    runs = [ids_of(sampler.distribution(logits)).tolist() for _ in range(case["applications"])]
    assert runs == case["kept_runs"]
    assert len({len(r) for r in runs}) == 2  # some fired, some did not


DRAWS = GOLDEN["draws"]


@pytest.mark.parametrize("case", DRAWS, ids=[c["name"] for c in DRAWS])
def test_seeded_runs_pick_what_llama_cpp_picks(case: dict[str, Any], smollm2_dry: DryVocabulary) -> None:
    cycle = [logits_of(name) for name in case["cycle"]]
    sampler = sampler_for(case, cycle[0].size, smollm2_dry)
    picks, kept, heads = [], [], []
    for step in range(case["steps"]):
        token = sampler.sample(cycle[step % len(cycle)])
        sampler.accept(token)
        picks.append(token)
        top = sampler.last.top(cycle[0].size) if sampler.last is not None else []
        kept.append({"size": len(top), "top": [t for t, _ in top[:8]]})
        if sampler.last is not None:
            n = len(case.get("heads", [[]])[0])
            heads.append((ids_of(sampler.last)[:n].tolist(), sampler.last.logits[:n]))
    assert picks == case["picks"]
    assert kept == case["kept"]
    if "heads" in case and not sampler.params.greedy:  # greedy: Llamba keeps the best token alone
        for step, ((ids, logits), expected) in enumerate(zip(heads, case["heads"], strict=True)):
            assert ids == [i for i, _ in expected], step
            want = np.array([float(v) for _, v in expected], dtype=np.float32)
            np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
