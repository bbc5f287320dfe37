"""Write server/config/llama_server_flags.py from llama-server's README (tools/server/README.md).

Each row of the README's option tables becomes a `LlamaServerFlag` with its Llamba status: implemented
(the parser knows a form of it), ignored (accepted with one warning line that names it and says what
Llamba does instead: it has no effect on what Llamba answers, or Llamba cannot honour it): a
llama-server command line starts Llamba unchanged.
Run: .venv/bin/python scripts/import_llama_server_flags.py /path/to/llama.cpp/tools/server/README.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.config.env_args import split_switch  # noqa: E402
from server.config.flags import build_parser  # noqa: E402
from server.config.ignored_flags import ALWAYS_ON  # noqa: E402

HUB = "not applied: Llamba has no model hub; it serves -m, or its known models (a router) without it"
OUTPUT = "not applied: Llamba does not implement it, so outputs differ from llama-server's with it"


# Flags that would change what the server answers and that Llamba lacks: accepted, with this warning.
NOT_APPLIED: dict[str, str] = {
    "--rope-scaling": OUTPUT + " (RoPE comes from the GGUF)",
    "--rope-scale": OUTPUT + " (RoPE comes from the GGUF)",
    "--rope-freq-base": OUTPUT + " (RoPE comes from the GGUF)",
    "--rope-freq-scale": OUTPUT + " (RoPE comes from the GGUF)",
    "--yarn-orig-ctx": OUTPUT + " (YaRN comes from the GGUF)",
    "--yarn-ext-factor": OUTPUT + " (YaRN comes from the GGUF)",
    "--yarn-attn-factor": OUTPUT + " (YaRN comes from the GGUF)",
    "--yarn-beta-slow": OUTPUT + " (YaRN comes from the GGUF)",
    "--yarn-beta-fast": OUTPUT + " (YaRN comes from the GGUF)",
    "--override-kv": OUTPUT,
    "-mu": HUB,
    "-dr": HUB,
    "-hf": HUB,
    "-hff": HUB,
    "--adaptive-target": OUTPUT + " (the adaptive-p sampler)",
    "--adaptive-decay": OUTPUT + " (the adaptive-p sampler)",
    "-sp": OUTPUT + " (special tokens are not rendered in the text)",
    "--spm-infill": OUTPUT + " (/infill uses the prefix-suffix-middle order)",
    "-mm": OUTPUT + " (no multimodal projector)",
    "-mmu": OUTPUT + " (no multimodal projector)",
    "--reasoning-preserve": OUTPUT,
    "--skip-chat-parsing": OUTPUT,
    "--no-prefill-assistant": OUTPUT + " (a final assistant message is always continued)",
    "--no-jinja": OUTPUT + " (chat templates are always rendered with Jinja; llama.cpp's built-in"
    " non-Jinja formats are not available)",
    "--spec-draft-hf": HUB,
    "--embd-gemma-default": HUB,
    "--fim-qwen-1.5b-default": HUB,
    "--fim-qwen-3b-default": HUB,
    "--fim-qwen-7b-default": HUB,
    "--fim-qwen-7b-spec": HUB,
    "--fim-qwen-14b-spec": HUB,
    "--fim-qwen-30b-default": HUB,
    "--gpt-oss-20b-default": HUB,
    "--gpt-oss-120b-default": HUB,
    "--vision-gemma-4b-default": HUB,
    "--vision-gemma-12b-default": HUB,
    "--spec-default": HUB,
}
# Switch rows whose positive and negative forms have different statuses: split into two rows.
SPLIT = ("--prefill-assistant", "-cb", "--jinja")
IGNORED_NOTE = "no effect in Llamba"
# Notes for implemented and ignored rows that say more than their status.
NOTES: dict[str, str] = {
    **ALWAYS_ON,
    "-cl": "lists the models in Llamba's cache (~/.cache/llamba/models), then exits",
    "--completion-bash": "prints a bash completion script for llamba-server's flags, then exits",
    "-nocb": "Llamba always batches continuously; a request's output does not depend on its batch"
    " (batch invariance), so only scheduling would differ",
    "--lora": "CPU backend only (CUDA refuses adapters at load); several: a comma list, or the flag repeated",
    "--lora-scaled": "CPU backend only; FNAME:SCALE, comma lists, repeatable",
    "--control-vector": "several: a comma list, or the flag repeated (summed); fails the load on a file for"
    " another width",
    "--control-vector-scaled": "FNAME:SCALE, comma lists, repeatable",
    "--lora-init-without-apply": "the adapters load at scale 0 (POST /lora-adapters or a request's `lora`"
    " applies them)",
    "--api-key": "several keys: a comma-separated list (CSV quoting), or the flag repeated",
    "--api-key-file": "one key per line; lines starting with # are comments",
    "-to": "seconds a request body may take to arrive and each response write may block",
    "--tools": "without exec_shell_command, the file tools are confined to the working directory"
    " (x-tool-cwd, else the server's cwd); get_info is not one of them",
    "--tools-runtime": "running containers (docker-container:ID, podman-container:ID) and ssh:TARGET;"
    " only exec_shell_command runs there, the file tools refuse a runtime",
}


def rows(readme: str) -> list[tuple[tuple[str, ...], str, str]]:
    """(forms, value placeholder, env variable) of every option row between 'Common params' and
    'Multimodal support'."""
    text = readme.split("### Common params", 1)[1].split("### Multimodal support", 1)[0]
    found = []
    for line in text.splitlines():
        match = re.match(r"\| `(.+?)` \| (.*) \|$", line)
        if not match:
            continue
        spec = match.group(1).replace("\\|", "|")
        # llama-server's own variables (LLAMA_ARG_*, LLAMA_API_KEY), not other tools' (HF_TOKEN)
        env = re.search(r"\(env: (LLAMA_\w+)\)", match.group(2))
        parts = [p.strip() for p in spec.split(", ")]
        forms, value = [], ""
        for part in parts:
            if not part.startswith("-"):
                value = ", ".join(p for p in [value, part] if p)  # a comma inside the placeholder
                continue
            name, _, rest = part.partition(" ")
            forms.append(name)
            value = rest
        forms_t = tuple(forms)
        if forms_t[0] in SPLIT:
            found += [(part, value, env.group(1) if env else "") for part in split_switch(forms_t) if part]
        else:
            found.append((forms_t, value, env.group(1) if env else ""))
    return found


def status(forms: tuple[str, ...], known: set[str]) -> tuple[str, str]:
    not_applied = [NOT_APPLIED[f] for f in forms if f in NOT_APPLIED]
    if not_applied:
        return "ignored", not_applied[0]
    note = next((NOTES[f] for f in forms if f in NOTES), "")
    if any(f in known for f in forms):
        return "implemented", note
    return "ignored", note or IGNORED_NOTE


def literal(text: str, width: int = 80) -> str:
    """`text` as Python source: one string literal, or implicitly joined ones of at most `width`
    characters in parentheses (ruff format lays them out under the line limit)."""
    parts: list[str] = []
    for word in text.split(" "):
        if parts and len(parts[-1]) + 1 + len(word) <= width:
            parts[-1] += " " + word
        else:
            parts.append(word if not parts else " " + word)
    return repr(text) if len(parts) < 2 else "(" + " ".join(repr(p) for p in parts) + ")"


def main(readme_path: str) -> None:
    known = set(build_parser()._option_string_actions) | set(ALWAYS_ON)
    out = [
        '"""llama-server\'s flags (its README\'s option tables) and what Llamba does with each.',
        "",
        "Generated by scripts/import_llama_server_flags.py; docs/compatibility.md is generated from it",
        "(scripts/compatibility_doc.py). Statuses: implemented, or ignored (accepted with a warning",
        'that says what Llamba does instead)."""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "",
        "",
        "@dataclass(frozen=True)",
        "class LlamaServerFlag:",
        "    forms: tuple[str, ...]",
        '    value: str  # the README\'s placeholder ("" for a switch; "[...]" is an optional value)',
        "    env: str  # its LLAMA_ARG_* (or LLAMA_API_KEY) variable, when the README names one",
        "    status: str  # implemented | ignored",
        '    note: str = ""',
        "",
        "",
        "F = LlamaServerFlag",
        "FLAGS: tuple[LlamaServerFlag, ...] = (",
    ]
    for forms, value, env in rows(Path(readme_path).read_text()):
        st, note = status(forms, known)
        out.append(f"    F({forms!r}, {value!r}, {env!r}, {st!r}, {literal(note)}),")
    out.append(")")
    target = ROOT / "server" / "llama_server_flags.py"
    target.write_text("\n".join(out) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1])
