"""The served model as Ollama describes a model: its name (`<alias>:latest`), which names a request may
use, its `details`, its capabilities, and the entries of /api/tags, /api/show and /api/ps.

A single-model server has one model. A request naming it under Ollama's rules (names.same_model:
`smollm2`, `smollm2:latest`, `library/smollm2`, any case) or under any of its -a aliases is served; any
other name is Ollama's 404 (`model 'x' not found`), which is what Ollama clients act on (they pick a
model from /api/tags). llama-server's OpenAI route ignores `model`; Llamba's OpenAI routes still do.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from server.apis.ollama.names import parse_name, same_model
from server.http import errors
from server.model.gguf_facts import FileFacts, file_facts
from server.model.host import ModelHost

# How far in the future /api/ps says the model expires: never, in a single-model server (Ollama's own
# "keep_alive -1" reads as a date far away).
NEVER_EXPIRES = datetime(2318, 1, 1, tzinfo=UTC)


def base_name(alias: str) -> str:
    """An alias as an Ollama name's base: a path's file name without `.gguf` (`-m /x/Foo.Q4_1.gguf` is
    `Foo.Q4_1`), a name as it is."""
    if alias.endswith(".gguf") or "/" in alias and Path(alias).suffix == ".gguf":
        return Path(alias).name.removesuffix(".gguf")
    return alias


def model_name(model: ModelHost) -> str:
    """The model's Ollama name: its API alias with the `latest` tag (or the tag its alias has)."""
    return parse_name(base_name(model.settings.model_alias)).full


def resolve(model: ModelHost, asked: str) -> str:
    """The name a request gave, checked: 400 when it gives none, 404 when it names another model (a LoRA
    adapter served as a model, server/model/lora.py, is one of this server's)."""
    if not asked.strip():
        raise errors.invalid_request("model is required")
    if adapter_named(model, asked) is not None:
        return asked
    names = [model.settings.model_alias, *model.settings.aliases, model_name(model)]
    if not any(same_model(asked, base_name(name)) or asked == name for name in names):
        raise errors.not_found(f"model '{asked}' not found")
    return asked


def adapter_named(model: ModelHost, asked: str) -> str | None:
    """The LoRA adapter (served as a model) an Ollama name means (`sql`, `sql:latest`), None: none."""
    for name, _ in model.lora.names():
        if asked == name or same_model(asked, name):
            return name
    return None


def now() -> str:
    """The time as Ollama writes `created_at` (RFC 3339, UTC)."""
    return rfc3339(datetime.now(UTC))


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def parameter_size(n_params: int) -> str:
    """Ollama's format.HumanNumber: 134515008 -> "134.52M", 1.5e9 -> "1.5B"."""
    for unit, scale, decimals in (("B", 1e9, 1), ("M", 1e6, 2)):
        if n_params >= scale:
            number = n_params / scale
            return f"{number:.0f}{unit}" if number == int(number) else f"{number:.{decimals}f}{unit}"
    return f"{n_params / 1e3:.0f}K" if n_params >= 1000 else str(n_params)


def quantization_level(ftype: str) -> str:
    """llama.cpp's file type name as Ollama writes it: "Q4_K - Medium" -> "Q4_K_M", "Q4_1" as it is."""
    base, _, size = ftype.partition(" - ")
    if size in ("Small", "Medium", "Large"):
        return f"{base}_{size[0]}"
    return base.strip() or "unknown"


def details(model: ModelHost) -> dict[str, Any]:
    info = model.model_info()
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.arch,
        "families": [info.arch],
        "parameter_size": parameter_size(info.n_params),
        "quantization_level": quantization_level(info.ftype),
    }


def capabilities(model: ModelHost) -> list[str]:
    """What Ollama's clients look for: completion (a generating model), embedding (a server
    run with --embedding), tools (a template with tool support), thinking (a template with a
    thinking block), vision/audio (an --mmproj projector), insert (FIM tokens)."""
    info = model.model_info()
    caps = ["completion"] if info.generates else []
    if model.settings.embedding:  # an encoder without --embeddings answers /api/embed 501, as llama-server
        caps.append("embedding")
    if info.generates:
        prompts = model.prompts  # 503 while the model loads
        if prompts.describes_tools:  # else tools are left out of the prompt, as llama-server leaves them
            caps.append("tools")
        if model.reasoning_tags() is not None:
            caps.append("thinking")
        if not prompts.tokenizer.fim.missing():
            caps.append("insert")
    caps += [name for name, kind in (("vision", "image"), ("audio", "audio")) if kind in model.modalities]
    return caps


async def facts(model: ModelHost) -> FileFacts:
    return await file_facts(model.model_info().path)


async def tags_entry(model: ModelHost) -> dict[str, Any]:
    """The model as /api/tags lists it."""
    found = await facts(model)
    name = model_name(model)
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339(datetime.fromtimestamp(found.modified, UTC)),
        "size": found.size,
        "digest": found.digest.removeprefix("sha256:"),
        "details": details(model),
    }


async def ps_entry(model: ModelHost) -> dict[str, Any]:
    """The model as /api/ps lists it: loaded in host memory (size_vram 0), never expiring."""
    found = await facts(model)
    name = model_name(model)
    return {
        "name": name,
        "model": name,
        "size": found.size,
        "digest": found.digest.removeprefix("sha256:"),
        "details": details(model),
        "expires_at": rfc3339(NEVER_EXPIRES),
        "size_vram": 0,
        "context_length": model.n_ctx_slot,
    }


async def show(model: ModelHost) -> dict[str, Any]:
    """/api/show: details, the GGUF's metadata (model_info, with general.parameter_count), the chat
    template, capabilities."""
    found = await facts(model)
    info = model.model_info()
    model_info = found.metadata | {"general.parameter_count": info.n_params}
    modified = datetime.fromtimestamp(found.modified, UTC)
    return {
        "license": "",
        "modelfile": f"# Modelfile generated by Llamba\nFROM {found.path}\n",
        "parameters": "",
        "template": model.template_source(),
        "details": details(model),
        "model_info": model_info,
        "capabilities": capabilities(model),
        "modified_at": rfc3339(modified),
    }


async def listing_entry(model: ModelHost, name: str, capabilities: list[str]) -> dict[str, Any]:
    """The model as llama-server's /v1/models lists it under `models` (Ollama's shape, every value a string
    as llama-server writes them; it leaves them empty, Llamba fills what it knows)."""
    entry = {"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model"}
    entry |= {"description": "", "tags": list(model.settings.tag_list) or [""], "capabilities": capabilities}
    entry |= {"parameters": "", "details": EMPTY_DETAILS}
    if model.ready:
        found = await facts(model)
        entry["modified_at"] = rfc3339(datetime.fromtimestamp(found.modified, UTC))
        entry |= {"size": str(found.size), "digest": found.digest.removeprefix("sha256:")}
        entry["details"] = details(model)
    return entry


EMPTY_DETAILS = {
    "parent_model": "",
    "format": "gguf",
    "family": "",
    "families": [""],
    "parameter_size": "",
    "quantization_level": "",
}
