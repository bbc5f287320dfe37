"""The router's catalogue from real folders and INI files: llama-server's --models-dir layout and its
--models-preset format, and the start-up errors a bad preset gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import engine.hf_cache as hf_cache
from engine import model_files
from server.router.catalogue import CatalogueError, build_catalogue
from server.router.main import child_args
from tests.hub_cache import add_file
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
    projector = touch(tmp_path / "gemma-3-4b" / "mmproj-F16.gguf")
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
    assert dir_models["gemma-3-4b"].args == ("--mmproj", str(projector))  # loaded beside it
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


# -- llama.cpp's model cache (LLAMA_CACHE) -------------------------------------------------------------
@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A llama.cpp cache in the hub layout: two quantizations of one repo, a split model with a
    projector beside it, a file without a tag, and a snapshot entry linking to a model elsewhere."""
    cache = tmp_path / "llama-cache"
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    add_file(cache, "org/tiny-GGUF", "tiny-Q4_K_M.gguf", b"GGUF q4")
    add_file(cache, "org/tiny-GGUF", "tiny-q8_0.gguf", b"GGUF q8")
    add_file(cache, "org/big-GGUF", "Q6_K/big-Q6_K-00001-of-00002.gguf", b"GGUF 1")
    add_file(cache, "org/big-GGUF", "Q6_K/big-Q6_K-00002-of-00002.gguf", b"GGUF 2")
    add_file(cache, "org/big-GGUF", "mmproj-big-F16.gguf", b"GGUF proj")
    add_file(cache, "org/notag", "model.gguf", b"GGUF")
    add_file(cache, "org/shared", "shared-F32.gguf", touch(tmp_path / "elsewhere" / "model.gguf"))
    (cache / "models--org--stale" / "snapshots").mkdir(parents=True)  # no ref: not listed
    return cache


def test_cache_models_are_named_as_llama_server_names_them(hub: Path) -> None:
    """org/repo:TAG per quantization (the tag upper-cased from the file name), a split model by its first
    part, no projector, no file without a tag; resolve picks a tag's file, Q4_K_M without a tag, and a
    repo's named file."""
    names = dict(hf_cache.list_models())
    assert set(names) == {"org/tiny-GGUF:Q4_K_M", "org/tiny-GGUF:Q8_0", "org/big-GGUF:Q6_K", "org/shared:F32"}
    assert names["org/big-GGUF:Q6_K"].name == "big-Q6_K-00001-of-00002.gguf"
    assert hf_cache.resolve("org/tiny-GGUF:q8_0") == names["org/tiny-GGUF:Q8_0"]
    assert hf_cache.resolve("org/tiny-GGUF") == names["org/tiny-GGUF:Q4_K_M"]  # llama.cpp's default tag
    assert hf_cache.resolve("org/notag") is not None  # no default tag: the first model file
    assert hf_cache.resolve("org/tiny-GGUF:Q2_K") is None
    assert hf_cache.resolve("org/big-GGUF", "mmproj-big-F16.gguf") is not None
    assert model_files.resolve("org/tiny-GGUF:Q8_0").read_bytes() == b"GGUF q8"  # -m takes the name
    with pytest.raises(model_files.ModelFetchError, match="not in the llama.cpp cache"):
        model_files.resolve("org/tiny-GGUF:Q2_K")
    with pytest.raises(hf_cache.CacheNameError):
        hf_cache.resolve("no-slash:Q8_0")


def test_cache_folder_is_looked_up_as_llama_cpp_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_cache.cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"  # the default location
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert hf_cache.cache_dir() == Path("/x/huggingface/hub")
    monkeypatch.setenv("HF_HOME", "/h")
    assert hf_cache.cache_dir() == Path("/h/hub")
    monkeypatch.setenv("LLAMA_CACHE", "/l")
    assert hf_cache.cache_dir() == Path("/l")


def test_removing_a_cache_model_keeps_files_outside_the_cache(hub: Path, tmp_path: Path) -> None:
    """A tag's snapshot entries and their blobs go; the other tag stays; a link's target elsewhere stays."""
    q8 = hf_cache.resolve("org/tiny-GGUF:Q8_0")
    assert q8 is not None and hf_cache.remove("org/tiny-GGUF:Q8_0")
    assert not q8.exists() and not q8.is_symlink()
    assert len(list((hub / "models--org--tiny-GGUF" / "blobs").iterdir())) == 1  # Q4_K_M's blob
    assert {n for n, _ in hf_cache.list_models()} >= {"org/tiny-GGUF:Q4_K_M"}
    assert hf_cache.remove("org/shared:F32") and (tmp_path / "elsewhere" / "model.gguf").is_file()
    assert not hf_cache.remove("org/tiny-GGUF:Q8_0")  # nothing left of it


def test_cache_models_in_the_catalogue_and_presets_naming_them(hub: Path, tmp_path: Path) -> None:
    """The cache's models are catalogue entries (source cache, the file as model); a preset's hf-repo is
    its model's file and spec-draft-hf its draft's; dedup-cache-models (a section's or [*]'s) hides the
    cache entries whose files a preset serves, and only those; a repo the cache lacks stays a name."""
    preset = tmp_path / "p.ini"
    preset.write_text(
        "[*]\nc = 2048\n[deduped]\nhf-repo = org/tiny-GGUF:Q8_0\nspec-draft-hf = org/shared\n"
        "dedup-cache-models = 1\n[plain]\nhf = org/tiny-GGUF\n[absent]\nhf-repo = org/none:Q4_0\n"
    )
    cat = build_catalogue(None, preset)
    q8, shared = hf_cache.resolve("org/tiny-GGUF:Q8_0"), hf_cache.resolve("org/shared")
    assert cat.entries["org/tiny-GGUF:Q8_0"].source == "cache"
    assert cat.entries["org/tiny-GGUF:Q8_0"].model == str(q8)
    deduped = cat.entries["deduped"]
    assert deduped.model == str(q8) and deduped.args == ("-c", "2048", "--model-draft", str(shared))
    assert cat.entries["plain"].model == str(hf_cache.resolve("org/tiny-GGUF:Q4_K_M"))
    assert cat.entries["absent"].model == "org/none:Q4_0"  # its load fails, naming the cache
    hidden = {e.id for e in cat.entries.values() if e.hidden}
    assert hidden == {"org/tiny-GGUF:Q8_0", "org/shared:F32"}  # plain's Q4_K_M: no dedup asked
    assert cat.find("org/tiny-GGUF:Q8_0") is not None  # hidden from the list, still usable
    preset.write_text("[*]\ndedup-cache-models = 1\n[plain]\nhf-repo = org/tiny-GGUF\n")
    assert {e.id for e in build_catalogue(None, preset).entries.values() if e.hidden} == {
        "org/tiny-GGUF:Q4_K_M"
    }


def test_builtin_encoders_start_with_embeddings(tmp_path: Path) -> None:
    """An encoder answers embeddings only: its child gets --embeddings (else /v1/embeddings and Ollama's
    /api/embed answer 501 through the router); generating models get no flag of their own."""
    cat = build_catalogue(None, None)
    assert cat.entries["all-minilm-l6-v2"].args == ("--embeddings",)
    assert cat.entries["nomic-embed-text-v1.5"].args == ("--embeddings",)
    assert cat.entries["smollm2"].args == ()
