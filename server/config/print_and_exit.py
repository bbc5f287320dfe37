"""llama-server's flags that print something and exit instead of serving: `-cl/--cache-list` and
`--completion-bash`. They are argparse actions, like `--version`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from engine import hf_cache
from engine.model_files import MODELS, models_dir


def cached_models() -> list[str]:
    """llama-server's listing of its cache: the count, then one numbered line per model file (Llamba's
    cache, then llama.cpp's: `org/repo:QUANT`, as -m, -hf and the router name them)."""
    known = {spec.filename: name for name, spec in MODELS.items()}
    files = sorted(models_dir().glob("*.gguf")) if models_dir().is_dir() else []
    entries = [(known.get(path.name), path) for path in files] + list(hf_cache.list_models())
    lines = [f"number of models in cache: {len(entries)}"]
    for i, (name, path) in enumerate(entries, 1):
        lines.append(f"   {i}. {name} ({path})" if name else f"   {i}. {path}")
    return lines


def completion_script(options: Iterable[str], prog: str = "llamba-server") -> str:
    """A bash completion script for `prog`'s options (source it, or put it in bash-completion's folder)."""
    words = " ".join(sorted(set(options)))
    function = "_" + prog.replace("-", "_")
    return (
        f"{function}() {{\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}"\n'
        f'    COMPREPLY=($(compgen -W "{words}" -- "$cur"))\n'
        "}\n"
        f"complete -o default -F {function} {prog}\n"
    )


class _PrintAndExit(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def text(self, parser: argparse.ArgumentParser) -> str:
        raise NotImplementedError

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        sys.stdout.write(self.text(parser))  # stdout, as --version (parser.exit writes to stderr)
        parser.exit(0)


class CacheList(_PrintAndExit):
    def text(self, parser: argparse.ArgumentParser) -> str:
        return "\n".join(cached_models()) + "\n"


class CompletionBash(_PrintAndExit):
    """`also`: more words to complete (the llama-server flags Llamba accepts and ignores)."""

    def __init__(self, option_strings: Sequence[str], dest: str, also: Sequence[str] = (), **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.also = tuple(also)

    def text(self, parser: argparse.ArgumentParser) -> str:
        own = [form for action in parser._actions for form in action.option_strings]
        return completion_script([*own, *self.also])
