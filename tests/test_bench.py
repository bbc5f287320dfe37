"""llamba-bench: llama-bench's options, sweeps, test semantics and output formats; a tiny real run."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sqlite3
import threading
from typing import Any

import numba
import numpy as np
import pytest

from cli.bench import main
from cli.bench.options import SEQ_PROMPT_TOKENS, BenchParams, Instance, parse_args, parse_int_list, plan
from cli.bench.output import PRINTERS, JsonPrinter
from cli.bench.results import BenchResult, ModelInfo
from cli.bench.runner import _on_own_thread, _turns, run
from cli.bench.spec import all_active_rate
from cli.bench_serve import REPEAT_TEXT, workload_prompts
from engine.batch import Batch
from engine.llm import LLM
from engine.memory.kv import KVCache

# ---------------------------------------------------------------------------------------------------------
# Arguments and sweeps


def test_int_lists_and_ranges() -> None:
    assert parse_int_list("512") == [512]
    assert parse_int_list("1,2,4") == [1, 2, 4]
    assert parse_int_list("16-64+16") == [16, 32, 48, 64]
    assert parse_int_list("1-16*2") == [1, 2, 4, 8, 16]
    assert parse_int_list("1-3,8") == [1, 2, 3, 8]
    assert parse_int_list("0") == [0]


@pytest.mark.parametrize("text", ["", "a", "-1", "5-1", "1-4*1", "1-4+0", "1,,2", "1.5"])
def test_bad_int_lists(text: str) -> None:
    with pytest.raises(Exception, match="invalid"):
        parse_int_list(text)


def test_defaults_match_llama_bench() -> None:
    p = parse_args([])
    assert (p.n_prompt, p.n_gen, p.n_pg, p.n_depth) == ([512], [128], [], [0])
    assert (p.n_batch, p.n_ubatch, p.reps, p.output) == ([2048], [512], 5, "md")
    assert p.models == [None] and p.batch_seqs == [1] and not p.no_warmup and not p.progress
    assert len(p.n_threads) == 1 and p.n_threads[0] >= 1 and not p.threads_given


def test_lists_come_from_commas_and_repeats() -> None:
    p = parse_args(
        ["-p", "16,32", "-p", "64", "-m", "smollm2,gemma3", "-m", "/x.gguf", "-pg", "8,2", "-pg", "4,1"]
    )
    assert p.n_prompt == [16, 32, 64]
    assert p.models == ["smollm2", "gemma3", "/x.gguf"]
    assert p.n_pg == [(8, 2), (4, 1)]
    p = parse_args(["--n_prompt", "16", "--batch-seqs", "1-8*2", "-t", "1,2", "-o", "json", "--no-warmup"])
    assert p.n_prompt == [16] and p.batch_seqs == [1, 2, 4, 8] and p.n_threads == [1, 2]
    assert p.output == "json" and p.no_warmup and p.threads_given


@pytest.mark.parametrize(
    "argv",
    [
        ["-ngl", "99"],
        ["-fa", "1"],
        ["-ot", "x=CPU"],
        ["--numa", "distribute"],
        ["--list-devices"],
        ["-nkvo", "1"],
    ],
)
def test_unsupported_llama_bench_options_fail_clearly(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code != 0
    assert "not supported by llamba-bench" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["-r", "0"], ["-b", "0"], ["-ub", "0"], ["--batch-seqs", "0"], ["-o", "xml"], ["-pg", "8"], ["--bogus"]],
)
def test_invalid_arguments(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code != 0
    assert "error" in capsys.readouterr().err


def test_sweep_runs_every_combination_in_llama_bench_order() -> None:
    p = parse_args(
        ["-m", "a,b", "-p", "16,32", "-n", "4", "-pg", "8,2", "-t", "1,2", "-d", "0,8", "--batch-seqs", "1,4"]
    )
    tests = plan(p)
    # per model: threads x depths x (2 pp + 1 tg x 2 batch sizes + 1 pg)
    assert len(tests) == 2 * 2 * 2 * (2 + 2 + 1)
    assert [t.model for t in tests] == ["a"] * 20 + ["b"] * 20
    first = [(t.n_threads, t.name) for t in tests[:10]]
    assert first == [
        (1, "pp16"),
        (1, "pp32"),
        (1, "tg4"),
        (1, "tg4 x4"),
        (1, "pp8+tg2"),
        (1, "pp16 @ d8"),
        (1, "pp32 @ d8"),
        (1, "tg4 @ d8"),
        (1, "tg4 x4 @ d8"),
        (1, "pp8+tg2 @ d8"),
    ]
    assert len(set(tests)) == len(tests)


def test_zero_sizes_are_skipped_and_batch_seqs_only_apply_to_tg() -> None:
    tests = plan(parse_args(["-p", "0,16", "-n", "0", "--batch-seqs", "2,4"]))
    assert [t.name for t in tests] == ["pp16"]
    tests = plan(parse_args(["-p", "0", "-n", "8", "--batch-seqs", "2"]))
    assert [(t.name, t.n_tokens) for t in tests] == [("tg8 x2", 16)]


# ---------------------------------------------------------------------------------------------------------
# Output formats, on made-up results


def _params(*argv: str) -> BenchParams:
    return parse_args(list(argv))


def _results() -> list[BenchResult]:
    info = ModelInfo("/models/m.gguf", "llama 135M Q4_1", 96_576_768, 134_515_008, "CPU")
    common = {"n_depth": 0, "n_batch": 2048, "n_ubatch": 512, "n_threads": 2, "model": None}
    pp = BenchResult(
        Instance(n_prompt=512, n_gen=0, **common), info, "2025-01-01T00:00:00Z", [1_000_000_000] * 2
    )
    tg = BenchResult(
        Instance(n_prompt=0, n_gen=128, n_seqs=8, **common),
        info,
        "2025-01-01T00:00:01Z",
        [2_000_000_000, 2_100_000_000, 1_900_000_000],
    )
    return [pp, tg]


def _printed(fmt: str, params: BenchParams | None = None) -> str:
    out = io.StringIO()
    printer = PRINTERS[fmt](out, params or _params())
    printer.begin()
    for r in _results():
        printer.row(r)
    printer.end()
    return out.getvalue()


def test_result_statistics() -> None:
    pp, tg = _results()
    assert pp.avg_ts == pytest.approx(512.0) and pp.stddev_ts == 0.0
    assert tg.inst.n_tokens == 8 * 128  # aggregate over the batched sequences
    assert tg.avg_ns == 2_000_000_000
    assert tg.stddev_ns == 100_000_000  # sample standard deviation, like llama-bench
    assert tg.avg_ts == pytest.approx(np.mean([1024 / 2.0, 1024 / 2.1, 1024 / 1.9]))
    assert tg.stddev_ts == pytest.approx(np.std([1024 / 2.0, 1024 / 2.1, 1024 / 1.9], ddof=1))


def test_markdown_table() -> None:
    text = _printed("md")
    lines = text.splitlines()
    assert lines[0].split("|")[1:-1] == [
        f" {'model':<30} ",
        f" {'size':>10} ",
        f" {'params':>10} ",
        f" {'backend':<10} ",
        f" {'threads':>7} ",
        f" {'test':>15} ",
        f" {'t/s':>20} ",
    ]
    rule = ["-" * 30, "-" * 9 + ":", "-" * 9 + ":", "-" * 10, "-" * 6 + ":", "-" * 14 + ":", "-" * 19 + ":"]
    assert lines[1] == "| " + " | ".join(rule) + " |"
    rows = [line for line in lines[2:] if line.startswith("|")]
    assert len(rows) == 2
    cells = [c.strip() for c in rows[1].split("|")[1:-1]]
    assert cells[:6] == ["llama 135M Q4_1", "92.10 MiB", "134.52 M", "CPU", "2", "tg128 x8"]
    assert cells[6] == f"{_results()[1].avg_ts:.2f} ± {_results()[1].stddev_ts:.2f}"
    assert all(len(row) == len(lines[0]) for row in rows)  # right-aligned into fixed widths
    assert "build:" in lines[-1]


def test_markdown_shows_non_default_batch_columns() -> None:
    header = _printed("md", _params("-b", "512", "-ub", "128,256")).splitlines()[0]
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "model",
        "size",
        "params",
        "backend",
        "threads",
        "n_batch",
        "n_ubatch",
        "test",
        "t/s",
    ]


def test_cache_types_are_swept_and_shown_like_llama_bench() -> None:
    params = _params("-ctk", "f16,q8_0", "-ctv", "q8_0", "-n", "8", "-p", "0")
    assert [(t.type_k, t.type_v) for t in plan(params)] == [("f16", "q8_0"), ("q8_0", "q8_0")]
    header = _printed("md", params).splitlines()[0]
    assert [c.strip() for c in header.split("|")[1:-1]][4:7] == ["threads", "type_k", "type_v"]
    (row,) = [json.loads(line) for line in _printed("jsonl").splitlines()][:1]
    assert (row["type_k"], row["type_v"]) == ("f16", "f16")


@pytest.mark.parametrize("argv", [["-ctk", "q4_0"], ["-ctv", "f16,bf16"], ["-ctk", "q9"]])
def test_unsupported_cache_types_are_refused_by_name(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "(supported: f16, q8_0)" in capsys.readouterr().err


def test_csv_parses_with_llama_bench_fields() -> None:
    rows = list(csv.DictReader(io.StringIO(_printed("csv"))))
    assert len(rows) == 2
    for name in (
        "model_type",
        "model_size",
        "model_n_params",
        "n_batch",
        "n_ubatch",
        "n_threads",
        "n_prompt",
    ):
        assert name in rows[0]
    assert rows[1]["n_gen"] == "128" and rows[1]["n_seqs"] == "8" and rows[1]["backends"] == "CPU"
    assert float(rows[0]["avg_ts"]) == pytest.approx(512.0)
    assert rows[0]["test_time"] == "2025-01-01T00:00:00Z"


def test_json_and_jsonl_parse() -> None:
    objs = json.loads(_printed("json"))
    lines = [json.loads(line) for line in _printed("jsonl").splitlines()]
    assert objs == lines
    assert len(objs) == 2
    tg = objs[1]
    assert tg["model_size"] == 96_576_768 and tg["n_seqs"] == 8 and tg["n_gen"] == 128
    assert tg["samples_ns"] == [2_000_000_000, 2_100_000_000, 1_900_000_000]
    assert len(tg["samples_ts"]) == 3 and tg["avg_ts"] == pytest.approx(_results()[1].avg_ts, rel=1e-6)
    for name in ("avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "test_time", "backends", "n_depth"):
        assert name in tg


def test_json_with_no_results_is_an_empty_array() -> None:
    out = io.StringIO()
    printer = JsonPrinter(out, _params())
    printer.begin()
    printer.end()
    assert json.loads(out.getvalue()) == []


def test_sql_loads_into_sqlite() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(_printed("sql"))
    rows = db.execute("SELECT model_type, n_prompt, n_gen, n_seqs, avg_ts FROM llama_bench").fetchall()
    assert [r[:4] for r in rows] == [("llama 135M Q4_1", 512, 0, 1), ("llama 135M Q4_1", 0, 128, 8)]
    assert rows[0][4] == pytest.approx(512.0)


# ---------------------------------------------------------------------------------------------------------
# Test semantics, on the real models with every batch the runner hands them recorded


class RecordingModel:
    """The real model, keeping every batch the runner hands it. A wrapper, not a stand-in: the forward passes
    are real, but which batches the runner issues (their sizes, positions, output rows, first token) is what
    these tests check, and the model's output does not show it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.batches: list[Batch] = []

    def forward(self, batch: Batch, kv: KVCache) -> np.ndarray:
        self.batches.append(batch)
        return self.model.forward(batch, kv)

    def __getattr__(self, name: str) -> Any:  # hp, n_params, new_cache, ...: the real model's
        return getattr(self.model, name)


def _recorded_run(llm: LLM, *argv: str) -> tuple[RecordingModel, str, str]:
    """llamba-bench's run on `llm`, through a copy of it whose model records (the session's LLM is shared)."""
    recorder = RecordingModel(llm.model)
    recorded = dataclasses.replace(llm, model=recorder)
    out, err = io.StringIO(), io.StringIO()
    status = run(parse_args(list(argv)), out, err, load=lambda _m, _t: recorded)
    assert status == 0, err.getvalue()
    return recorder, out.getvalue(), err.getvalue()


def test_pp_runs_in_ubatch_chunks_with_bos_first_and_a_cleared_cache(gemma3_llm: LLM) -> None:
    # Gemma 3 adds BOS (SmolLM2 does not).
    bos = gemma3_llm.tokenizer.bos_id
    model, out, _ = _recorded_run(
        gemma3_llm, "-p", "10", "-n", "0", "-b", "6", "-ub", "4", "-r", "2", "--no-warmup", "-o", "json"
    )
    # llama_decode on n_batch=6 tokens split into ubatches of 4: [4, 2] then [4]; twice (two repetitions)
    assert [b.n_tokens for b in model.batches] == [4, 2, 4] * 2
    assert [len(b.output_rows) for b in model.batches] == [0, 1, 1] * 2  # only each decode call's last token
    assert [int(b.positions[0]) for b in model.batches] == [0, 4, 6] * 2  # cleared before each repetition
    assert int(model.batches[0].tokens[0]) == bos and int(model.batches[3].tokens[0]) == bos
    (obj,) = json.loads(out)
    assert obj["n_prompt"] == 10 and len(obj["samples_ns"]) == 2 and obj["avg_ts"] > 0


def test_no_bos_when_the_model_adds_none(smollm2_llm: LLM) -> None:
    assert not smollm2_llm.tokenizer.add_bos
    model, _, _ = _recorded_run(smollm2_llm, "-p", "64", "-n", "0", "-r", "3", "--no-warmup", "-o", "none")
    assert [int(b.tokens[0]) for b in model.batches].count(smollm2_llm.tokenizer.bos_id) < 3


def test_tg_decodes_one_token_per_step_after_a_one_token_warmup(gemma3_llm: LLM) -> None:
    model, _, _ = _recorded_run(gemma3_llm, "-p", "0", "-n", "5", "-r", "2", "-o", "none")
    sizes = [b.n_tokens for b in model.batches]
    assert sizes == [1] * (1 + 5 * 2)
    positions = [int(b.positions[0]) for b in model.batches]
    assert positions == [0] + [0, 1, 2, 3, 4] * 2
    # generation starts from BOS, as llama-bench's does
    assert int(model.batches[1].tokens[0]) == gemma3_llm.tokenizer.bos_id


def test_depth_is_prefilled_once_and_reused_each_repetition(smollm2_llm: LLM) -> None:
    model, out, _ = _recorded_run(
        smollm2_llm, "-p", "0", "-n", "2", "-d", "8", "-ub", "4", "-r", "3", "--no-warmup", "-o", "jsonl"
    )
    sizes = [b.n_tokens for b in model.batches]
    assert sizes == [4, 4] + [1, 1] * 3
    assert [int(b.positions[0]) for b in model.batches[2:]] == [8, 9] * 3
    assert json.loads(out)["n_depth"] == 8


def test_batched_tg_gives_each_sequence_a_context_and_counts_all_tokens(smollm2_llm: LLM) -> None:
    model, out, _ = _recorded_run(
        smollm2_llm, "-p", "0", "-n", "3", "--batch-seqs", "4", "-r", "2", "--no-warmup", "-o", "json"
    )
    first = model.batches[0]  # every sequence's own small prompt, in one batch
    assert sorted(set(first.seq_ids.tolist())) == [0, 1, 2, 3]
    steps = model.batches[1:]
    assert len(steps) == 3 * 2
    ctx = SEQ_PROMPT_TOKENS
    for i, step in enumerate(steps):
        assert step.seq_ids.tolist() == [0, 1, 2, 3] and len(step.output_rows) == 4
        assert step.positions.tolist() == [ctx + i % 3] * 4
    (obj,) = json.loads(out)
    assert obj["n_seqs"] == 4
    assert obj["samples_ts"][0] == pytest.approx(1e9 * 12 / obj["samples_ns"][0], rel=1e-5)


def test_batched_tg_at_depth_copies_the_context_into_every_sequence(smollm2_llm: LLM) -> None:
    model, _, _ = _recorded_run(
        smollm2_llm,
        "-p",
        "0",
        "-n",
        "2",
        "-d",
        "4",
        "--batch-seqs",
        "3",
        "-r",
        "1",
        "--no-warmup",
        "-o",
        "none",
    )
    assert [b.n_tokens for b in model.batches] == [4, 3, 3]
    assert model.batches[1].positions.tolist() == [4, 4, 4]


def test_stderr_reports_load_and_first_token(smollm2_llm: LLM) -> None:
    _, out, err = _recorded_run(smollm2_llm, "-p", "4", "-n", "2", "-r", "1", "--progress")
    assert f"loaded {smollm2_llm.path.name}" in err and "first token" in err
    assert "benchmark 1/2: starting" in err
    assert "first token" not in out and out.count("| llama 135M Q4_1") == 2


def test_a_model_that_fails_to_load_fails_its_tests_only(smollm2_llm: LLM) -> None:
    def load(name: str | None, _threads: int) -> LLM:
        if name == "broken":
            raise FileNotFoundError("no such model")
        return smollm2_llm

    out, err = io.StringIO(), io.StringIO()
    status = run(
        parse_args(["-m", "broken,ok", "-p", "4", "-n", "0", "-r", "1", "-o", "csv"]), out, err, load
    )
    assert status == 1
    assert "failed to load model 'broken'" in err.getvalue()
    assert len(list(csv.DictReader(io.StringIO(out.getvalue())))) == 1


# ---------------------------------------------------------------------------------------------------------
# The real model


def test_tiny_real_run_on_smollm2(capsys: pytest.CaptureFixture) -> None:
    status = main(
        ["-p", "16", "-n", "4", "-r", "2", "--no-warmup", "--batch-seqs", "1,2", "-t", "2", "-o", "json"]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    results = json.loads(captured.out)
    assert [(r["n_prompt"], r["n_gen"], r["n_seqs"]) for r in results] == [(16, 0, 1), (0, 4, 1), (0, 4, 2)]
    for r in results:
        assert r["model_type"] == "llama 135M Q4_1" and r["backends"] == "CPU"
        assert r["model_n_params"] == 134_515_008
        assert len(r["samples_ns"]) == 2 and all(ns > 0 for ns in r["samples_ns"])
        assert 0 < r["avg_ts"] < 1e6
    assert "loaded" in captured.err and "first token" in captured.err


def test_tiny_real_markdown_run(capsys: pytest.CaptureFixture) -> None:
    status = main(["-p", "8", "-n", "2", "-pg", "4,2", "-d", "4", "-r", "1", "--batch-seqs", "2"])
    out = capsys.readouterr().out
    assert status == 0
    rows = [line for line in out.splitlines() if line.startswith("| llama")]
    assert [row.split("|")[6].strip() for row in rows] == ["pp8 @ d4", "tg2 x2 @ d4", "pp4+tg2 @ d4"]
    assert all(float(row.split("|")[7].split("±")[0]) > 0 for row in rows)


# ---------------------------------------------------------------------------------------------------------
# Speculative tg tests (Llamba's addition, llama-server's flag names)


def test_spec_flags_sweep_tg_tests_only() -> None:
    p = parse_args(["-p", "16", "-n", "32", "--spec-type", "none,ngram-simple", "--draft-max", "4,8"])
    tests = plan(p)
    assert [t.name for t in tests] == ["pp16"] + ["tg32 copy"] * 4
    assert [(t.draft_max, t.spec_type) for t in tests[1:]] == [
        (4, "none"),
        (4, "ngram-simple"),
        (8, "none"),
        (8, "ngram-simple"),
    ]
    assert tests[0].spec_type == "" and tests[1].spec is None
    spec = tests[2].spec
    assert spec is not None and (spec.types, spec.n_max, spec.n_min, spec.ngram_n) == (
        ("ngram-simple",),
        4,
        0,
        12,
    )
    chat = plan(parse_args(["-p", "0", "-n", "8", "--spec-type", "ngram-cache", "--spec-prompt", "chat"]))
    assert [(t.name, t.spec_prompt) for t in chat] == [("tg8 chat", "chat")]
    drafted = parse_args(["-md", "smollm2", "-p", "0"])  # -md alone: draft-simple, as in llama-server
    assert drafted.spec_types == ("draft-simple",) and drafted.model_draft == "smollm2"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--draft-max", "8"], "--draft-max needs --spec-type"),
        (["--spec-prompt", "copy"], "--spec-prompt needs --spec-type"),
        (["--spec-type", "eagle"], "--spec-type 'eagle' is not supported"),
        (["--spec-type", "draft-simple"], "needs a draft model"),
        (["--spec-type", "ngram-simple", "--spec-prompt", "poem"], "--spec-prompt 'poem'"),
        (["--spec-type", "ngram-simple", "-d", "64"], "-d does not apply"),
        (["--spec-type", "ngram-simple", "--draft-min", "9", "--draft-max", "4"], "n_min"),
    ],
)
def test_bad_spec_flags_are_refused(argv: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_spec_results_show_their_settings_and_drafts() -> None:
    params = _params("-p", "0", "-n", "128", "--spec-type", "none,ngram-simple", "--spec-ngram-size-n", "4")
    info = _results()[0].model
    base, spec = (BenchResult(t, info, "2025-01-01T00:00:00Z", [1_000_000_000]) for t in plan(params))
    spec.draft_n, spec.draft_accepted = 90, 60
    out = io.StringIO()
    printer = PRINTERS["md"](out, params)
    for r in (base, spec):
        printer.row(r)
    header, _, *rows = out.getvalue().splitlines()
    names = [c.strip() for c in header.split("|")[1:-1]]
    assert names[4:] == ["threads", "spec_type", "ngram_n", "test", "t/s", "draft_n", "accepted"]
    assert [c.strip() for c in rows[1].split("|")[1:-1]][5:] == [
        "ngram-simple",
        "4",
        "tg128 copy",
        "128.00 ± 0.00",
        "90",
        "60",
    ]
    assert [c.strip() for c in rows[0].split("|")[1:-1]][-2:] == ["0", "0"]  # the baseline drafts nothing
    out = io.StringIO()
    printer = PRINTERS["json"](out, params)
    printer.begin()
    printer.row(spec)
    printer.end()
    (obj,) = json.loads(out.getvalue())
    assert (obj["spec_type"], obj["draft_max"], obj["spec_ngram_size_n"], obj["spec_prompt"]) == (
        "ngram-simple",
        16,
        4,
        "copy",
    )
    assert (obj["draft_n"], obj["draft_n_accepted"]) == (90, 60)


def test_several_sequences_report_the_rate_while_all_decode() -> None:
    # two sequences: one done after 3 tokens at 3 s, the other's first 2 tokens came by then
    s = 10**9
    assert all_active_rate([[1 * s, 2 * s, 3 * s], [1 * s, 3 * s, 5 * s, 7 * s]]) == 5 / 3
    params = _params("-p", "0", "-n", "128", "--batch-seqs", "1,16", "--spec-type", "none,ngram-simple")
    info = _results()[0].model
    results = [BenchResult(t, info, "2025-01-01T00:00:00Z", [1_000_000_000]) for t in plan(params)]
    for r in results:
        r.active_ts = (
            ([100.0, 300.0] if r.inst.spec_type == "ngram-simple" else [150.0]) if r.inst.n_seqs > 1 else []
        )
    out = io.StringIO()
    printer = PRINTERS["md"](out, params)
    for r in results:
        printer.row(r)
    header, _, *rows = out.getvalue().splitlines()
    assert header.split("|")[-2].strip() == "all active t/s"
    # the tests of 16 sequences have the figure, with speculation and without (its baseline)
    assert [row.split("|")[-2].strip() for row in rows] == ["", "", "150.00", "200.00"]
    assert [r.inst.name for r in results][-1] == "tg128 x16 copy"


def test_spec_tests_of_one_setting_take_turns() -> None:
    """Tests that differ only in their speculation type run together (their repetitions interleaved);
    every other test alone."""
    argv = ["-p", "16", "-n", "8", "--batch-seqs", "1,4", "--spec-type", "none,ngram-simple"]
    turns = list(_turns(plan(parse_args([*argv, "--spec-prompt", "repeat,chat"]))))
    assert [[t.name for t in turn] for turn in turns] == [
        ["pp16"],
        ["tg8 repeat", "tg8 repeat"],
        ["tg8 chat", "tg8 chat"],
        ["tg8 x4 repeat", "tg8 x4 repeat"],
        ["tg8 x4 chat", "tg8 x4 chat"],
    ]
    assert all([t.spec_type for t in turn] == ["none", "ngram-simple"] for turn in turns[1:])


def test_each_turn_runs_on_a_thread_that_ends_with_it() -> None:
    """A thread that enters a parallel kernel stays an OpenMP master until it exits (libgomp then
    throttles every team's workers): a turn never runs on the calling thread, and its thread is gone."""

    class Recorder:
        def results(self, insts: list[Instance], info: Any, index: int, total: int) -> list[Any]:
            self.thread = threading.current_thread()
            self.threads = numba.get_num_threads()
            return ["done"]

    recorder = Recorder()
    inst = plan(parse_args(["-p", "0", "-n", "8", "-t", "1"]))[0]
    assert _on_own_thread(recorder, [inst], None, 1, 1) == ["done"]  # type: ignore[arg-type]
    assert recorder.thread is not threading.main_thread() and not recorder.thread.is_alive()
    assert recorder.threads == 1  # the turn's thread count is set on its own thread


def test_the_repeat_workload_asks_to_repeat_prose() -> None:
    first, second = workload_prompts("repeat", 2)
    assert first != second and REPEAT_TEXT in first and "exactly" in first


def test_tiny_real_speculative_run(capsys: pytest.CaptureFixture) -> None:
    """SmolLM2 repeating code, two interleaved repetitions: the n-gram drafts are verified and many
    accepted; the baseline drafts none."""
    argv = ["-p", "0", "-n", "48", "-r", "2", "-o", "json", "--spec-type", "none,ngram-simple"]
    status = main([*argv, "--spec-ngram-size-n", "4", "--draft-max", "8"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    base, spec = json.loads(captured.out)
    assert (base["spec_type"], base["draft_n"]) == ("none", 0)
    assert spec["spec_type"] == "ngram-simple" and spec["n_gen"] == 48
    assert 0 < spec["draft_n_accepted"] <= spec["draft_n"]
    assert base["avg_ts"] > 0 and spec["avg_ts"] > 0
