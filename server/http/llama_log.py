"""llama-server's log lines from Llamba's structlog events: what prompt-cache profilers and other tools
written for llama-server read.

A slot event (`engine/slot_log.py`) is written in llama-server's words (tools/server/server-context.cpp),
behind its `slot %12.*s: id %2d | task %d | ` prefix (the C function's name cut or padded to 12). The
prompt lines (`new prompt`, `n_tokens = N, memory_seq_rm [N, end)`, `prompt processing progress`, `prompt
done`) are the wording profilers parse; llama-server 0c1e570 moved the first two to its trace level and
dropped the others, Llamba keeps them at info so that a profiler needs no `-lv 4`. Any other event is
`srv  <event>: key=value ...`, its name whole. common/log.cpp's prefix: with --log-prefix a level
letter (I, W, E, D), with --log-timestamps also the time since start as minutes.seconds.ms.us, both
coloured by --log-colors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

Fields = Mapping[str, Any]
Line = tuple[str, str]  # (llama-server's function name, its message)

_RESET, _BLUE = "\033[0m", "\033[34m"
# common/log.cpp: the level letters and their colours; a warning's, error's or debug line's colour lasts
# to the end of its line.
_LETTERS = {"info": ("I", "\033[32m"), "warning": ("W", "\033[35m"), "error": ("E", "\033[31m")}
_LETTERS |= {"critical": ("E", "\033[31m"), "debug": ("D", "\033[33m")}
_JSONL_LEVELS = {"warning": "warn", "error": "error", "critical": "error", "debug": "debug"}


def _selected(f: Fields) -> list[Line]:
    if f["by"] == "id":
        return [("get_available_slot", f"selected slot by id ({f['id_slot']})")]
    if f["by"] == "lru":
        return [("get_available_slot", f"selected slot by LRU, t_last = {f['t_last']}")]
    sim = f"f_sim_best = {f['f_sim']:.3f} (> {f['thold']:.3f} thold), f_keep = {f['f_keep']:.3f}"
    return [("get_available_slot", f"selected slot by LCP similarity, {sim}")]


def _rate(ms: float, n: int, per_token_ms: float, per_second: float) -> str:
    rates = f"{per_token_ms:8.2f} ms per token, {per_second:8.2f} tokens per second"
    return f"{ms:10.2f} ms / {n:5d} tokens ({rates})"


def _timings(f: Fields) -> list[Line]:
    """print_timings: the prompt's and the generation's time, and their sum (the draft line with drafts)."""
    prompt = _rate(f["prompt_ms"], f["prompt_n"], f["prompt_per_token_ms"], f["prompt_per_second"])
    gen = _rate(f["predicted_ms"], f["predicted_n"], f["predicted_per_token_ms"], f["predicted_per_second"])
    total = f"{f['prompt_ms'] + f['predicted_ms']:10.2f} ms / {f['prompt_n'] + f['predicted_n']:5d} tokens"
    lines = [f"prompt eval time = {prompt}", f"       eval time = {gen}", f"      total time = {total}"]
    if f.get("draft_n"):
        n, ok, steps = f["draft_n"], f["draft_n_accepted"], f.get("draft_steps", 0)
        mean = 1.0 + ok / steps if steps else 1.0
        lines.append(
            f"draft acceptance = {ok / n:0.5f} ({ok:5d} accepted / {n:5d} generated), mean len = {mean:5.2f}"
        )
    return [("print_timings", line) for line in lines]


def _one(function: str, message: str) -> Callable[[Fields], list[Line]]:
    return lambda f: [(function, message.format(**f))]


SLOT_LINES: dict[str, Callable[[Fields], list[Line]]] = {
    "slot.selected": _selected,
    "slot.launch": _one("launch_slot_with_task", "processing task, is_child = {is_child}"),
    "slot.new_prompt": _one(
        "update_slots", "new prompt, n_ctx_slot = {n_ctx_slot}, n_keep = {n_keep}, task.n_tokens = {n_prompt}"
    ),
    "slot.cache_reuse": _one("update_slots", "n_tokens = {n_past}, memory_seq_rm [{n_past}, end)"),
    "slot.prompt_progress": _one(
        "update_slots",
        "prompt processing progress, n_tokens = {n_tokens}, batch.n_tokens = {batch_n_tokens}, "
        "progress = {progress:f}",
    ),
    "slot.prompt_done": _one(
        "update_slots", "prompt done, n_tokens = {n_tokens}, batch.n_tokens = {batch_n_tokens}"
    ),
    "slot.timings": _timings,
    "slot.release": _one("release", "stop processing: n_tokens = {n_tokens}, truncated = {truncated}"),
}


@dataclass
class LlamaRenderer:
    """structlog's last processor for `--log-format llama`: one event as llama-server's line(s)."""

    prefix: bool = False
    timestamps: bool = False
    colors: bool = False
    jsonl: bool = False  # each line as common/log.cpp's {"type": "log", "time", "level", "msg"}
    t_start: float = field(default_factory=time.time)
    _logfmt: structlog.processors.LogfmtRenderer = field(default_factory=structlog.processors.LogfmtRenderer)

    def __call__(self, _logger: object, _name: str, event: dict[str, Any]) -> str:
        words = SLOT_LINES.get(str(event.get("event")))
        if words is not None:
            body = [
                f"slot {fn[:12]:>12}: id {event['id_slot']:2d} | task {event['id_task']} | {m}"
                for fn, m in words(event)
            ]
        else:
            rest = {k: v for k, v in event.items() if k not in ("event", "level", "timestamp")}
            fields = self._logfmt(None, "", rest)
            body = [f"srv  {event.get('event')}" + (f": {fields}" if fields else "")]
        level = str(event.get("level", "info"))
        if self.jsonl:
            return "\n".join(self._json_line(level, line) for line in body)
        return "\n".join(self._prefixed(level, line) for line in body)

    def _json_line(self, level: str, line: str) -> str:
        """common/log.cpp's JSONL entry: the message with its newline, the time in us since start."""
        us = int((time.time() - self.t_start) * 1e6)
        name = _JSONL_LEVELS.get(level, "info")
        return json.dumps({"type": "log", "time": us, "level": name, "msg": line + "\n"}, ensure_ascii=False)

    def _prefixed(self, level: str, line: str) -> str:
        if not self.prefix:
            return line
        letter, color = _LETTERS.get(level, ("I", ""))
        color, reset = (color, _RESET) if self.colors else ("", "")
        head = ""
        if self.timestamps:
            us = int((time.time() - self.t_start) * 1e6)
            stamp = f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"
            head = f"{_BLUE if self.colors else ''}{stamp}{reset} "
        if letter == "I":
            return f"{head}{color}I {reset}{line}"
        return f"{head}{color}{letter} {line}{reset}"
