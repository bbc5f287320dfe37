"""The router's catalogue from real folders and INI files: llama-server's --models-dir layout and its
--models-preset format, and the start-up errors a bad preset gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.router.catalogue import CatalogueError, build_catalogue
from server.router.main import child_args
from tests.server_process import REPO


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_models_dir_layout(tmp_path: Path) -> None:
    touch(tmp_path / "llama-3.2-1b-Q4_K_M.gguf")
    touch(tmp_path / "big-00001-of-00002.gguf")
    touch(tmp_path / "big-00002-of-00002.gguf")
    touch(tmp_path / "gemma-3-4b" / "gemma-3-4b-Q8_0.gguf")
    touch(tmp_path / "gemma-3-4b" / "mmproj-F16.gguf")
    touch(tmp_path / "with-draft" / "target.gguf")
    draft = touch(tmp_path / "with-draft" / "draft-small.gguf")
    touch(tmp_path / "Kimi" / "Kimi-00001-of-00003.gguf")
    touch(tmp_path / "Kimi" / "Kimi-00002-of-00003.gguf")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    cat = build_catalogue(tmp_path, None)
    dir_models = {e.id: e for e in cat.entries.values() if e.source == "dir"}
    assert set(dir_models) == {"llama-3.2-1b-Q4_K_M", "big", "gemma-3-4b", "with-draft", "Kimi"}
    assert dir_models["big"].model.endswith("big-00001-of-00002.gguf")  # the first shard names the model
    assert dir_models["gemma-3-4b"].model.endswith("gemma-3-4b-Q8_0.gguf")  # not the projector
    assert dir_models["with-draft"].args == ("-md", str(draft))  # a sidecar draft model
    assert dir_models["Kimi"].model.endswith("Kimi-00001-of-00003.gguf")
    assert {"smollm2", "gemma3"} <= set(cat.entries) and cat.default_id == "smollm2"
    with pytest.raises(CatalogueError, match="not a directory"):
        build_catalogue(tmp_path / "nope", None)


def test_preset_sections_defaults_and_aliases(tmp_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text(
        "version = 1\n[*]\nc = 8192\nn-gpu-layers = 8\n"
        "[smollm2]\nchat-template = chatml\njinja = true\nLLAMA_ARG_CACHE_RAM = 0\n"
        "[custom]\nmodel = /models/x.gguf\nalias = x, the-x\nload-on-startup = true\nstop-timeout = 3\n"
        "[quiet]\nmodel = gemma3\nno-webui = true\ncontext-shift = false\n"
    )
    cat = build_catalogue(None, preset)
    smol = cat.entries["smollm2"]
    assert smol.source == "preset" and smol.model == "smollm2"
    assert smol.args == ("-c", "8192", "--n-gpu-layers", "8", "--chat-template", "chatml", "--jinja")
    assert smol.env == (("LLAMA_ARG_CACHE_RAM", "0"),)
    custom = cat.find("the-x")
    assert custom is not None and custom.id == "custom" and custom.model == "/models/x.gguf"
    assert custom.load_on_startup and custom.stop_timeout == 3.0
    assert cat.default_id == "custom"  # the first model loaded at start-up is the default
    assert cat.entries["quiet"].args == ("-c", "8192", "--n-gpu-layers", "8", "--no-webui")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[m]\nmodel = smollm2\nno-such-flag = 1\n", "unknown key 'no-such-flag'"),
        ("[m]\nc = 4096\n", "needs `model`"),
        ("[m]\nmodel = smollm2\nc = many\n", r"\[m\]"),
        ("[m\nmodel = x\n", "--models-preset"),
    ],
)
def test_bad_presets_are_refused(tmp_path: Path, text: str, error: str) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text(text)
    with pytest.raises(CatalogueError, match=error):
        build_catalogue(None, preset)


def test_a_bad_preset_stops_the_router_at_start_up(tmp_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text("[m]\nmodel = smollm2\nbogus = 1\n")
    cmd = [sys.executable, "-m", "server", "--models-preset", str(preset), "--port", "0"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown key 'bogus'" in done.stderr


def test_children_inherit_all_but_the_router_flags() -> None:
    argv = ["--port", "8080", "--host=0.0.0.0", "-c", "4096", "--api-key", "k", "--models-max", "2"]
    argv += ["--no-models-autoload", "-np", "4", "--models-dir=/m", "--sleep-idle-seconds", "5"]
    assert child_args(argv) == ["-c", "4096", "-np", "4", "--sleep-idle-seconds", "5"]
