"""A server that offers no tools at all."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer  # noqa: E402

if __name__ == "__main__":
    FixtureServer("empty", {}).run()
