"""The output formats (-o, -oe): llama-bench's markdown table, CSV, JSON, JSON lines and SQL."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from cli.bench.options import DEFAULT_N_BATCH, DEFAULT_N_UBATCH, PROG, BenchParams
from cli.bench.results import FIELD_NAMES, FIELDS, BenchResult, build_commit, record


class Printer:
    """Streams results as they complete: begin(), row() per test, end()."""

    def __init__(self, out: TextIO, params: BenchParams) -> None:
        self.out = out
        self.params = params

    def begin(self) -> None:
        pass

    def row(self, r: BenchResult) -> None:
        raise NotImplementedError

    def end(self) -> None:
        pass

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def _csv_value(value: str | int | float) -> str:
    # llama-bench prints floats with six decimals and every value as text.
    return f"{value:.6f}" if isinstance(value, float) else str(value)


class CsvPrinter(Printer):
    def begin(self) -> None:
        self.write(",".join(FIELD_NAMES) + "\n")

    def row(self, r: BenchResult) -> None:
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerow(
            _csv_value(v) for v in record(r).values()
        )
        self.write(buf.getvalue())


def _json_record(r: BenchResult) -> dict[str, Any]:
    obj: dict[str, Any] = dict(record(r))
    obj["samples_ns"] = list(r.samples_ns)
    obj["samples_ts"] = [float(f"{ts:.6g}") for ts in r.samples_ts]
    return obj


class JsonPrinter(Printer):
    """An array of objects, laid out as llama-bench does (one field per line, samples inline)."""

    first = True

    def begin(self) -> None:
        self.write("[\n")

    def row(self, r: BenchResult) -> None:
        lines = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in _json_record(r).items()]
        sep = "" if self.first else ",\n"
        self.first = False
        self.write(sep + "  {\n" + ",\n".join(lines) + "\n  }")

    def end(self) -> None:
        self.write("\n]\n")


class JsonlPrinter(Printer):
    def row(self, r: BenchResult) -> None:
        self.write(json.dumps(_json_record(r)) + "\n")


class SqlPrinter(Printer):
    """SQLite statements for llama-bench's `llama_bench` table, so its comparison scripts read them."""

    TYPES = {str: "TEXT", int: "INTEGER", float: "REAL"}

    def begin(self) -> None:
        columns = ",\n".join(f"  {name} {self.TYPES[kind]}" for name, kind in FIELDS)
        self.write(f"CREATE TABLE IF NOT EXISTS llama_bench (\n{columns}\n);\n\n")

    def row(self, r: BenchResult) -> None:
        values = ", ".join("'" + _csv_value(v).replace("'", "''") + "'" for v in record(r).values())
        self.write(f"INSERT INTO llama_bench ({', '.join(FIELD_NAMES)}) VALUES ({values});\n")


@dataclass(frozen=True)
class Column:
    name: str  # header text
    width: int  # negative: left-aligned (text), positive: right-aligned (numbers), as in llama-bench
    value: Callable[[BenchResult], str]


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.2f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1_000_000_000 else f"{n / 1e9:.2f} B"


def _cell(text: str, width: int) -> str:
    # Widths count characters, not bytes: llama-bench's "+1 for the 2-byte ±" hack is not needed here.
    return f" {text:<{-width}} |" if width < 0 else f" {text:>{width}} |"


def _spec_columns(p: BenchParams) -> list[Column]:
    """The speculative settings: the type always, the draft flags when swept or not at their defaults."""
    cols = [Column("spec_type", -12, lambda r: r.inst.spec_type)]
    if p.draft_max != (16,):
        cols.append(Column("draft_max", 9, lambda r: str(r.inst.draft_max) if r.inst.spec_type else ""))
    if p.draft_min != (0,):
        cols.append(Column("draft_min", 9, lambda r: str(r.inst.draft_min) if r.inst.spec_type else ""))
    if p.ngram_n != (12,):
        cols.append(Column("ngram_n", 7, lambda r: str(r.inst.ngram_n) if r.inst.spec_type else ""))
    return cols


def _all_active(r: BenchResult) -> str:
    """A speculative test's rate while all its sequences decode (cli/bench/spec.py), with several."""
    return f"{r.avg_active_ts:.2f}" if r.inst.spec_type and r.inst.n_seqs > 1 else ""


class MarkdownPrinter(Printer):
    """llama-bench's table: fixed columns, plus a column for each parameter swept or set to a non-default."""

    header_done = False
    cols: list[Column]

    def columns(self, backend: str) -> list[Column]:
        p = self.params
        cols = [
            Column("model", -30, lambda r: r.model.type),
            Column("size", 10, lambda r: _size(r.model.size)),
            Column("params", 10, lambda r: _params(r.model.n_params)),
            Column("backend", -10, lambda r: r.model.backend),
        ]
        if backend == "CPU" or p.threads_given:
            cols.append(Column("threads", 7, lambda r: str(r.inst.n_threads)))
        if p.n_batch != DEFAULT_N_BATCH:
            cols.append(Column("n_batch", 7, lambda r: str(r.inst.n_batch)))
        if p.n_ubatch != DEFAULT_N_UBATCH:
            cols.append(Column("n_ubatch", 8, lambda r: str(r.inst.n_ubatch)))
        if p.type_k != ("f16",):
            cols.append(Column("type_k", 6, lambda r: r.inst.type_k))
        if p.type_v != ("f16",):
            cols.append(Column("type_v", 6, lambda r: r.inst.type_v))
        if p.spec_types:
            cols += _spec_columns(p)
        cols.append(Column("test", 15, lambda r: r.inst.name))
        cols.append(Column("t/s", 20, lambda r: f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"))
        if p.spec_types:
            cols.append(Column("draft_n", 7, lambda r: str(r.draft_n) if r.inst.spec_type else ""))
            cols.append(Column("accepted", 8, lambda r: str(r.draft_accepted) if r.inst.spec_type else ""))
            if max(p.batch_seqs) > 1:
                cols.append(Column("all active t/s", 14, _all_active))
        return cols

    def header(self, backend: str) -> None:
        self.cols = self.columns(backend)
        names = "".join(_cell(c.name, c.width) for c in self.cols)
        rule = "".join(f" {'-' * (abs(c.width) - 1)}{':' if c.width > 0 else '-'} |" for c in self.cols)
        self.write(f"|{names}\n|{rule}\n")
        self.header_done = True

    def row(self, r: BenchResult) -> None:
        if not self.header_done:
            self.header(r.model.backend)
        cells = "".join(_cell(c.value(r), c.width) for c in self.cols)
        self.write(f"|{cells}\n")

    def end(self) -> None:
        if not self.header_done:
            self.header("CPU")
        self.write(f"\nbuild: {build_commit()} ({PROG})\n")


PRINTERS: dict[str, type[Printer]] = {
    "md": MarkdownPrinter,
    "csv": CsvPrinter,
    "json": JsonPrinter,
    "jsonl": JsonlPrinter,
    "sql": SqlPrinter,
}
