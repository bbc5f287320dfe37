"""llama.cpp's samplers applied to fixed logits: writes tests/golden/samplers.json.

Runs under a Python that has llama-cpp-python 0.3.36 (llama.cpp's C API through ctypes), not the
project's venv:

    /tmp/llcpp-avx2/bin/python scripts/make_sampler_goldens.py [--out tests/golden/samplers.json]

Each case names Llamba's sampling fields (`params`, `samplers` giving the stage order), a logit vector,
a token history accepted before (penalties, DRY), and what llama.cpp did: for a chain applied once, the
candidates it kept in its order with their logits after the chain (`kept`, or only the changed ones,
`changed`, for stages that truncate nothing); for seeded runs, the token it picked at each step and the
candidates left at that pick (`picks`, `kept_ids`), and for chains ending in adaptive-p the first
candidates' logits after its transform (`heads`). Every stage is built from the same `params` the
test hands to Llamba, so the two are configured alike by construction. DRY's sequence breakers need a
vocabulary: SmolLM2's is loaded (vocab_only), and its tokenizations of the histories are recorded.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = Path.home() / ".cache" / "llamba" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_BREAKERS = ["\n", ":", '"', "*"]
KEEP_LISTED = 300  # kept lists longer than this are stored as their head, a count and a checksum
HEAD = 12  # candidates whose logits after adaptive-p's transform are kept per step
# llama.cpp's defaults for every field a case leaves out (common/common.h).
DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "min_keep": 0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "repeat_penalty": 1.0,
    "repeat_last_n": 64,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "dry_sequence_breakers": DEFAULT_BREAKERS,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "seed": 0,
    "logit_bias": {},
}


# -- logit vectors ---------------------------------------------------------------------------------------


def vectors(n_vocab_smollm2: int) -> dict[str, dict[str, Any]]:
    """Named logit vectors: dense ones (values listed), and sparse vocabulary-sized ones for DRY."""
    rng = np.random.RandomState(20240611)
    peaked = (rng.standard_normal(64) * 1.0).astype(np.float32)
    peaked[[3, 17, 40]] += np.float32([6.0, 5.2, 4.1])
    smooth = (rng.standard_normal(256) * 1.5).astype(np.float32)
    wide = (rng.standard_normal(1000) * 3.0).astype(np.float32)
    wide_b = (rng.standard_normal(1000) * 2.0).astype(np.float32)
    wide_c = (rng.standard_normal(1000) * 4.0).astype(np.float32)
    masked = smooth.copy()
    masked[rng.choice(256, 60, replace=False)] = -np.inf
    dense = {
        "peaked64": peaked,
        "smooth256": smooth,
        "wide1000": wide,
        "wide1000b": wide_b,
        "wide1000c": wide_c,
        "masked256": masked,
    }
    out: dict[str, dict[str, Any]] = {name: {"logits": [_f32(x) for x in v]} for name, v in dense.items()}
    ids = rng.choice(n_vocab_smollm2, 300, replace=False)
    out["vocab_sparse"] = {
        "n": n_vocab_smollm2,
        "fill": 0.0,
        "ids": [int(i) for i in ids],
        "logits": [_f32(x) for x in (rng.standard_normal(300) * 2.0).astype(np.float32)],
    }
    return out


def _f32(x: float) -> float | str:
    """A float32 as JSON: exact (repr of the double it widens to), infinities as strings."""
    x = float(np.float32(x))
    if np.isinf(x):
        return "-inf" if x < 0 else "inf"
    return x


def dense_logits(vec: dict[str, Any]) -> np.ndarray:
    if "n" in vec:
        arr = np.full(vec["n"], vec["fill"], dtype=np.float32)
        arr[vec["ids"]] = np.array(vec["logits"], dtype=np.float32)
        return arr
    return np.array([float(v) for v in vec["logits"]], dtype=np.float32)


# -- llama.cpp ---------------------------------------------------------------------------------------------


class Vocab:
    """SmolLM2's vocabulary in llama.cpp (vocab_only): DRY's breakers, tokenized histories."""

    def __init__(self, path: Path) -> None:
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise SystemExit(f"cannot load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, False)
        return list(buf[:n])


def stage(name: str, p: dict[str, Any], n_vocab: int, vocab: Vocab | None) -> Any:
    """One llama.cpp sampler, configured from Llamba's field names as common/sampling.cpp does."""
    if name == "penalties":
        return L.llama_sampler_init_penalties(
            n_vocab, p["repeat_last_n"], p["repeat_penalty"], p["frequency_penalty"], p["presence_penalty"]
        )
    if name == "dry":
        assert vocab is not None, "DRY needs a vocabulary"
        breakers = [s.encode() for s in p["dry_sequence_breakers"]]
        arr = (ctypes.c_char_p * len(breakers))(*breakers)
        return L.llama_sampler_init_dry(
            vocab.vocab,
            p["dry_multiplier"],
            p["dry_base"],
            p["dry_allowed_length"],
            p["dry_penalty_last_n"],
            arr,
            len(breakers),
        )
    if name == "top_n_sigma":
        return L.llama_sampler_init_top_n_sigma(p["top_n_sigma"])
    if name == "top_k":
        return L.llama_sampler_init_top_k(p["top_k"])
    if name == "typ_p":
        return L.llama_sampler_init_typical(p["typical_p"], p["min_keep"])
    if name == "top_p":
        return L.llama_sampler_init_top_p(p["top_p"], p["min_keep"])
    if name == "min_p":
        return L.llama_sampler_init_min_p(p["min_p"], p["min_keep"])
    if name == "xtc":
        return L.llama_sampler_init_xtc(p["xtc_probability"], p["xtc_threshold"], p["min_keep"], p["seed"])
    if name == "temperature":
        return L.llama_sampler_init_temp_ext(p["temperature"], p["dynatemp_range"], p["dynatemp_exponent"])
    raise ValueError(name)


def chain(p: dict[str, Any], n_vocab: int, vocab: Vocab | None, draw: bool) -> Any:
    """common_sampler_init's chain: logit bias, then the samplers in order (or temperature + mirostat),
    then, when the case draws, adaptive-p if the samplers name it (wherever), else dist."""
    c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    bias = p["logit_bias"]
    if bias:
        items = (L.llama_logit_bias * len(bias))(
            *[L.llama_logit_bias(int(t), float(b)) for t, b in bias.items()]
        )
        L.llama_sampler_chain_add(c, L.llama_sampler_init_logit_bias(n_vocab, len(bias), items))
    if p["mirostat"] == 1:
        L.llama_sampler_chain_add(c, L.llama_sampler_init_temp(p["temperature"]))
        miro = L.llama_sampler_init_mirostat(n_vocab, p["seed"], p["mirostat_tau"], p["mirostat_eta"], 100)
        L.llama_sampler_chain_add(c, miro)
        return c
    if p["mirostat"] == 2:
        L.llama_sampler_chain_add(c, L.llama_sampler_init_temp(p["temperature"]))
        miro = L.llama_sampler_init_mirostat_v2(p["seed"], p["mirostat_tau"], p["mirostat_eta"])
        L.llama_sampler_chain_add(c, miro)
        return c
    for name in p["samplers"]:
        if name != "adaptive_p":
            L.llama_sampler_chain_add(c, stage(name, p, n_vocab, vocab))
    if draw and "adaptive_p" in p["samplers"]:
        adaptive = L.llama_sampler_init_adaptive_p(p["adaptive_target"], p["adaptive_decay"], p["seed"])
        L.llama_sampler_chain_add(c, adaptive)
    elif draw:
        L.llama_sampler_chain_add(c, L.llama_sampler_init_dist(p["seed"]))
    return c


class Candidates:
    """A llama_token_data_array over a whole logit vector, in id order, unsorted."""

    def __init__(self, logits: np.ndarray) -> None:
        n = logits.size
        self.data = (L.llama_token_data * n)()
        for i, x in enumerate(logits):
            self.data[i].id = i
            self.data[i].logit = float(x)
            self.data[i].p = 0.0
        self.array = L.llama_token_data_array(self.data, n, -1, False)

    def apply(self, sampler: Any) -> None:
        L.llama_sampler_apply(sampler, ctypes.byref(self.array))

    def kept(self) -> list[tuple[int, float]]:
        """(id, logit) of what is left, in the array's order (XTC moves the data pointer)."""
        d = self.array.data
        return [(int(d[i].id), float(d[i].logit)) for i in range(self.array.size)]

    def selected(self) -> int:
        return int(self.array.data[self.array.selected].id)


def probs(kept: list[tuple[int, float]]) -> list[float]:
    """Softmax of the kept logits (float64): the distribution the draw uses."""
    x = np.array([v for _, v in kept], dtype=np.float64)
    if not np.isfinite(x).any():
        return [0.0] * len(kept)
    w = np.exp(x - x[np.isfinite(x)].max())
    return list(w / w.sum())


# -- cases -------------------------------------------------------------------------------------------------


def case(name: str, vector: str, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "vector": vector, "params": params, **extra}


def single_stage_cases() -> list[dict[str, Any]]:
    out = []
    for vec in ("peaked64", "smooth256", "wide1000"):
        for k in (1, 5, 40):
            out.append(case(f"top_k {k} {vec}", vec, {"samplers": ["top_k"], "top_k": k}))
        for p, keep in ((0.5, 0), (0.9, 0), (0.9, 30), (0.3, 5)):
            out.append(
                case(
                    f"top_p {p} keep {keep} {vec}", vec, {"samplers": ["top_p"], "top_p": p, "min_keep": keep}
                )
            )
        for p, keep in ((0.05, 0), (0.3, 0), (0.3, 12)):
            out.append(
                case(
                    f"min_p {p} keep {keep} {vec}", vec, {"samplers": ["min_p"], "min_p": p, "min_keep": keep}
                )
            )
        for p, keep in ((0.2, 0), (0.5, 0), (0.9, 0), (0.5, 7)):
            out.append(
                case(
                    f"typical {p} keep {keep} {vec}",
                    vec,
                    {"samplers": ["typ_p"], "typical_p": p, "min_keep": keep},
                )
            )
        for n in (0.5, 1.0, 2.0):
            out.append(case(f"top_n_sigma {n} {vec}", vec, {"samplers": ["top_n_sigma"], "top_n_sigma": n}))
        for thr, keep in ((0.05, 0), (0.1, 0), (0.1, 3), (0.3, 0)):
            params = {"samplers": ["xtc"], "xtc_probability": 1.0, "xtc_threshold": thr, "min_keep": keep}
            out.append(case(f"xtc always {thr} keep {keep} {vec}", vec, params))
        for t, r, e in ((0.7, 0.0, 1.0), (1.0, 0.5, 1.0), (0.8, 0.8, 2.0), (0.5, 0.4, 0.5), (0.0, 0.0, 1.0)):
            params = {
                "samplers": ["temperature"],
                "temperature": t,
                "dynatemp_range": r,
                "dynatemp_exponent": e,
            }
            out.append(case(f"temperature {t} range {r} exp {e} {vec}", vec, params))
    out.append(
        case("top_n_sigma 1.0 with masked", "masked256", {"samplers": ["top_n_sigma"], "top_n_sigma": 1.0})
    )
    out.append(
        case("logit_bias", "smooth256", {"samplers": [], "logit_bias": {"3": 2.5, "7": "-inf", "200": -1.0}})
    )
    history = [3, 17, 17, 40, 5, 3, 3, 60, 17, 9]
    pen = {
        "samplers": ["penalties"],
        "repeat_penalty": 1.3,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.4,
    }
    out.append(case("penalties", "peaked64", pen, history=history))
    out.append(case("penalties window 4", "peaked64", {**pen, "repeat_last_n": 4}, history=history))
    return out


def xtc_runs() -> list[dict[str, Any]]:
    """XTC with probability < 1: which applications fire depends on its seeded RNG."""
    params = {"samplers": ["xtc"], "xtc_probability": 0.5, "xtc_threshold": 0.05, "seed": 1234}
    return [case("xtc seeded 0.5", "peaked64", params, applications=24)]


DRY_TEXTS = {
    "fox": "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "names": "name: Alice smith\nname: Alice smith\nname: Alice",
    "story": "Once upon a time there was a cat. Once upon a time there was a cat. Once upon a time there",
    "branches": "one two three four. one two five six. one two seven. one two three four. one two",
}


def dry_cases(vocab: Vocab) -> list[dict[str, Any]]:
    out = []
    base = {"samplers": ["dry"], "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2}
    variants = {
        "defaults": {},
        "allowed 4 base 2": {"dry_allowed_length": 4, "dry_base": 2.0},
        "last_n 12": {"dry_penalty_last_n": 12},
        "no breakers": {"dry_sequence_breakers": []},
        "multi-token breakers": {"dry_sequence_breakers": ["fox jumps", " time there", "\n"]},
        "long breaker": {"dry_sequence_breakers": ["a breaker longer than forty bytes, cut to forty: Alice"]},
        "steep": {
            "dry_multiplier": 3.0,
            "dry_base": 3.0,
            "dry_allowed_length": 1,
            "dry_penalty_last_n": 1000,
        },
    }
    for text_name, text in DRY_TEXTS.items():
        history = vocab.tokenize(text)
        for vname, change in variants.items():
            params = {**base, **change}
            out.append(
                case(f"dry {vname} {text_name}", "vocab_sparse", params, history=history, vocab="smollm2")
            )
    return out


def draw_runs() -> list[dict[str, Any]]:
    """Seeded runs of whole chains with dist (or mirostat): llama.cpp's pick at every step."""
    cycle = ["wide1000", "wide1000b", "wide1000c"]
    everything = {
        "samplers": [
            "penalties",
            "dry",
            "top_n_sigma",
            "top_k",
            "typ_p",
            "top_p",
            "min_p",
            "xtc",
            "temperature",
        ],
        "repeat_penalty": 1.1,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.1,
        "dry_multiplier": 0.8,
        "top_n_sigma": 3.0,
        "top_k": 60,
        "typical_p": 0.95,
        "top_p": 0.95,
        "min_p": 0.02,
        "xtc_probability": 0.5,
        "xtc_threshold": 0.1,
        "temperature": 0.9,
        "dynatemp_range": 0.3,
        "seed": 42,
    }
    runs = {
        "dist only": {"samplers": [], "seed": 7},
        "default chain": {
            "samplers": [
                "penalties",
                "dry",
                "top_n_sigma",
                "top_k",
                "typ_p",
                "top_p",
                "min_p",
                "xtc",
                "temperature",
            ],
            "seed": 11,
        },
        "default chain, no top-k": {
            "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
            "top_k": 0,
            "seed": 12,
        },
        "default chain, min-p only": {
            "samplers": ["top_k", "top_p", "min_p", "temperature"],
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.1,
            "seed": 13,
        },
        "everything": everything,
        "reordered": {
            "samplers": ["temperature", "min_p", "xtc", "top_k"],
            "temperature": 1.3,
            "min_p": 0.1,
            "xtc_probability": 0.7,
            "xtc_threshold": 0.05,
            "top_k": 20,
            "seed": 99,
        },
        "min_keep": {
            "samplers": ["top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
            "typical_p": 0.3,
            "top_p": 0.2,
            "min_p": 0.5,
            "xtc_probability": 1.0,
            "xtc_threshold": 0.01,
            "min_keep": 4,
            "seed": 5,
        },
        "mirostat 1": {
            "mirostat": 1,
            "mirostat_tau": 5.0,
            "mirostat_eta": 0.1,
            "temperature": 1.0,
            "seed": 3,
        },
        "mirostat 1 cold": {
            "mirostat": 1,
            "mirostat_tau": 2.0,
            "mirostat_eta": 0.3,
            "temperature": 0.7,
            "seed": 4,
        },
        "mirostat 2": {
            "mirostat": 2,
            "mirostat_tau": 5.0,
            "mirostat_eta": 0.1,
            "temperature": 1.0,
            "seed": 5,
        },
        "mirostat 2 cold": {
            "mirostat": 2,
            "mirostat_tau": 3.0,
            "mirostat_eta": 0.2,
            "temperature": 0.8,
            "seed": 6,
        },
        "greedy": {"samplers": ["top_k", "top_p", "min_p", "temperature"], "temperature": 0.0, "seed": 8},
    }
    history = [5, 17, 42, 5, 17, 42, 5, 17, 900, 901, 5, 17]
    out = [
        {
            "name": f"run {name}",
            "cycle": cycle,
            "params": params,
            "history": history,
            "steps": 40,
            "vocab": "smollm2",
        }
        for name, params in runs.items()
    ]
    for name, params, steps, vectors_used in adaptive_runs():
        out.append(
            {
                "name": f"run adaptive_p {name}",
                "cycle": vectors_used or cycle,
                "params": params,
                "history": [5, 17, 42, 5, 17, 42, 5, 17, 200, 201, 5, 17],
                "steps": steps,
                "vocab": "smollm2",
            }
        )
    return out


def adaptive_runs() -> list[tuple[str, dict[str, Any], int, list[str] | None]]:
    """Seeded runs ending in adaptive-p: (name, params, steps, cycle or None for the default one). Long
    enough for the moving average to move the target; -inf candidates; the general and fast paths."""
    return [
        (
            "0.5 after min-p",
            {"samplers": ["min_p", "adaptive_p"], "min_p": 0.05, "adaptive_target": 0.5, "seed": 21},
            60,
            None,
        ),
        (
            "0.2 decay 0.5, top-k min-p temperature",
            {
                "samplers": ["top_k", "min_p", "temperature", "adaptive_p"],
                "top_k": 40,
                "min_p": 0.02,
                "temperature": 1.1,
                "adaptive_target": 0.2,
                "adaptive_decay": 0.5,
                "seed": 22,
            },
            60,
            None,
        ),
        (
            "0.1 decay 0 whole vocabulary",
            {"samplers": ["adaptive_p"], "adaptive_target": 0.1, "adaptive_decay": 0.0, "seed": 23},
            40,
            None,
        ),
        (
            "0.9 decay clamped from 1.5, top-p",
            {
                "samplers": ["top_p", "adaptive_p"],
                "top_p": 0.9,
                "adaptive_target": 0.9,
                "adaptive_decay": 1.5,
                "seed": 24,
            },
            60,
            None,
        ),
        (
            "0.7 penalties min-p",
            {
                "samplers": ["penalties", "min_p", "adaptive_p"],
                "repeat_penalty": 1.3,
                "presence_penalty": 0.2,
                "min_p": 0.01,
                "adaptive_target": 0.7,
                "adaptive_decay": 0.95,
                "seed": 25,
            },
            80,
            None,
        ),
        (
            "0.3 masked, first in the order, top-n-sigma, bias",
            {
                "samplers": ["adaptive_p", "top_n_sigma"],
                "top_n_sigma": 1.5,
                "logit_bias": {"3": "-inf", "11": 1.5},
                "adaptive_target": 0.3,
                "seed": 26,
            },
            40,
            ["masked256", "smooth256"],
        ),
        (
            "1.4 target above 1, typical xtc",
            {
                "samplers": ["typ_p", "xtc", "adaptive_p"],
                "typical_p": 0.9,
                "xtc_probability": 0.5,
                "xtc_threshold": 0.1,
                "adaptive_target": 1.4,
                "seed": 27,
            },
            40,
            None,
        ),
        (
            "off (target -1), top-k",
            {"samplers": ["top_k", "adaptive_p"], "top_k": 30, "seed": 28},
            40,
            None,
        ),
        (
            "greedy",
            {"samplers": ["top_k", "temperature", "adaptive_p"], "temperature": 0.0, "adaptive_target": 0.4},
            20,
            None,
        ),
    ]


# -- running -----------------------------------------------------------------------------------------------


def full_params(params: dict[str, Any]) -> dict[str, Any]:
    p = {**DEFAULTS, **params}
    p["logit_bias"] = {int(k): float(v) for k, v in p["logit_bias"].items()}
    return p


def run_once(c: dict[str, Any], vecs: dict[str, Any], vocab: Vocab) -> None:
    logits = dense_logits(vecs[c["vector"]])
    p = full_params(c["params"])
    smpl = chain(p, logits.size, vocab if c.get("vocab") else None, draw=False)
    for token in c.get("history", []):
        L.llama_sampler_accept(smpl, token)
    if "applications" in c:
        runs = []
        for _ in range(c["applications"]):
            cand = Candidates(logits)
            cand.apply(smpl)
            runs.append([i for i, _ in cand.kept()])
        c["kept_runs"] = runs
    else:
        cand = Candidates(logits)
        cand.apply(smpl)
        kept = cand.kept()
        c["size"] = len(kept)
        c["finite"] = sum(1 for _, v in kept if np.isfinite(v))
        changed = [[i, _f32(v)] for i, v in kept if v != logits[i]]
        c["changed"] = changed if len(kept) > KEEP_LISTED and len(changed) <= KEEP_LISTED else []
        # the whole kept list when short; else its head and a checksum of all kept logits
        c["kept"] = [[i, _f32(v)] for i, v in kept[:KEEP_LISTED]]
        finite = [v for _, v in kept if np.isfinite(v)]
        c["kept_logit_sum"] = float(np.sum(np.array(finite, dtype=np.float64)))
    L.llama_sampler_free(smpl)


def run_draws(c: dict[str, Any], vecs: dict[str, Any], vocab: Vocab) -> None:
    cycle = [dense_logits(vecs[name]) for name in c["cycle"]]
    p = full_params(c["params"])
    smpl = chain(p, cycle[0].size, vocab, draw=True)
    for token in c["history"]:
        L.llama_sampler_accept(smpl, token)
    picks, kept_ids, heads = [], [], []
    for step in range(c["steps"]):
        cand = Candidates(cycle[step % len(cycle)])
        cand.apply(smpl)
        token = cand.selected()
        L.llama_sampler_accept(smpl, token)
        picks.append(token)
        # the candidates the pick was drawn from, best first (llama-server's post-sampling view)
        kept = [(i, q) for (i, _), q in zip(cand.kept(), probs(cand.kept()), strict=True) if q > 0]
        best = [i for i, _ in sorted(kept, key=lambda t: -t[1])]
        kept_ids.append({"size": len(best), "top": best[:8]})
        heads.append([[i, _f32(v)] for i, v in cand.kept()[:HEAD]])
    c["picks"] = picks
    c["kept"] = kept_ids
    if "adaptive_p" in p.get("samplers", []):
        c["heads"] = heads
    L.llama_sampler_free(smpl)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "samplers.json")
    args = ap.parse_args()
    L.llama_backend_init()
    vocab = Vocab(SMOLLM2)
    vecs = vectors(vocab.n_vocab)
    once = single_stage_cases() + xtc_runs() + dry_cases(vocab)
    for c in once:
        run_once(c, vecs, vocab)
    draws = draw_runs()
    for c in draws:
        run_draws(c, vecs, vocab)
    golden = {
        "source": f"llama.cpp samplers via llama-cpp-python {L.__version__} (src/llama-sampler.cpp)",
        "vocab": {"smollm2": SMOLLM2.name},
        "defaults": DEFAULTS,
        "vectors": vecs,
        "once": once,
        "draws": draws,
    }
    args.out.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {len(once)} single applications, {len(draws)} seeded runs")


if __name__ == "__main__":
    main()
