"""Model names as Ollama writes them: `name:tag`, the tag `latest` when none is given, an optional
`namespace/` or registry host before the name (`hf.co/org/repo:Q4_K_M`). Llamba's models have one tag:
`smollm2`, `smollm2:latest` and `library/smollm2:latest` are the same model."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TAG = "latest"


@dataclass(frozen=True)
class ModelName:
    base: str  # the name without its tag (and without Ollama's default `library/` namespace)
    tag: str = DEFAULT_TAG

    @property
    def full(self) -> str:
        """The name Ollama lists: `base:tag`."""
        return f"{self.base}:{self.tag}"


def parse_name(name: str) -> ModelName:
    """`name[:tag]`; a colon inside a registry host's port (`host:5000/name`) is not a tag."""
    name = name.strip()
    head, _, last = name.rpartition("/")
    base, sep, tag = last.partition(":")
    if head:
        base = f"{head}/{base}"
    base = base.removeprefix("library/").removeprefix("registry.ollama.ai/library/")
    return ModelName(base, tag if sep and tag else DEFAULT_TAG)


def same_model(name: str, other: str) -> bool:
    """Whether two names are the same model under Ollama's rules (case-insensitive, tag `latest` implied)."""
    a, b = parse_name(name), parse_name(other)
    return a.base.lower() == b.base.lower() and a.tag.lower() == b.tag.lower()
