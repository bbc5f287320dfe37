"""Shared fixtures: the real model files (fetched on first use) and the golden data from llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import engine  # noqa: F401  (pins Numba's settings before anything imports numba)
from engine.gguf import GGUFFile
from engine.model_files import resolve

GOLDEN_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "golden"


def load_golden(name: str) -> dict[str, Any]:
    path = GOLDEN_DIR / f"{name}.json"
    if not path.is_file():
        pytest.fail(f"golden data missing: {path} (the checkout's sibling shared/ folder)")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def smollm2_gguf() -> GGUFFile:
    return GGUFFile(resolve("smollm2"))


@pytest.fixture(scope="session")
def gemma3_gguf() -> GGUFFile:
    return GGUFFile(resolve("gemma3"))


@pytest.fixture(scope="session")
def smollm2_llm():  # type: ignore[no-untyped-def]
    from engine.llm import LLM

    return LLM.load("smollm2")


@pytest.fixture(scope="session")
def gemma3_llm():  # type: ignore[no-untyped-def]
    from engine.llm import LLM

    return LLM.load("gemma3")


@pytest.fixture(scope="session")
def server():  # type: ignore[no-untyped-def]
    """One SmolLM2 server shared by the end-to-end tests: 4 slots of 1024 tokens, metrics on."""
    from tests.server_process import ServerProcess

    proc = ServerProcess("-m", "smollm2", "-np", "4", "-c", "4096", "--metrics").wait_healthy()
    yield proc
    proc.stop()
