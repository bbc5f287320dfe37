"""Write server/llama_server_flags.py from llama-server's README (tools/server/README.md).

Each row of the README's option tables becomes a `LlamaServerFlag` with its Llamba status: implemented
(the parser knows a form of it), refused (it would change outputs and Llamba cannot honour it, or it
needs a model hub), or ignored (accepted with a warning: it has no effect on what Llamba answers).
Run: .venv/bin/python scripts/import_llama_server_flags.py /path/to/llama.cpp/tools/server/README.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.cli import ALWAYS_ON, build_parser  # noqa: E402
from server.env_args import split_switch  # noqa: E402

HUB = "needs a model hub download; Llamba loads local files and its known models only"
OUTPUT = "changes outputs and Llamba does not implement it"
# Flags that would change what the server answers (or where it answers) and that Llamba lacks.
REFUSED: dict[str, str] = {
    "-cl": "lists a hub cache Llamba does not have",
    "--completion-bash": "prints a bash completion script for llama.cpp's tools",
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
    "--lora": OUTPUT + " (no LoRA adapters)",
    "--lora-scaled": OUTPUT + " (no LoRA adapters)",
    "--control-vector": OUTPUT,
    "--control-vector-scaled": OUTPUT,
    "--control-vector-layer-range": OUTPUT,
    "-mu": HUB,
    "-dr": HUB,
    "-hf": HUB,
    "-hff": HUB,
    "--adaptive-target": OUTPUT + " (the adaptive-p sampler)",
    "--adaptive-decay": OUTPUT + " (the adaptive-p sampler)",
    "--grammar": "no server-wide default in Llamba: send `grammar` in the request",
    "--grammar-file": "no server-wide default in Llamba: send `grammar` in the request",
    "-j": "no server-wide default in Llamba: send `json_schema` in the request",
    "-jf": "no server-wide default in Llamba: send `json_schema` in the request",
    "-r": "no server-wide default in Llamba: send `stop` in the request",
    "-sp": OUTPUT + " (special tokens are not rendered in the text)",
    "--spm-infill": OUTPUT + " (/infill uses the prefix-suffix-middle order)",
    "-mm": OUTPUT + " (no multimodal projector)",
    "-mmu": OUTPUT + " (no multimodal projector)",
    "--api-prefix": "routes are served at the root only",
    "--ssl-key-file": "TLS is not implemented; put a TLS proxy in front",
    "--ssl-cert-file": "TLS is not implemented; put a TLS proxy in front",
    "--reasoning-effort": "no server-wide default in Llamba: send `reasoning_effort` in the request",
    "--reasoning-preserve": OUTPUT,
    "--skip-chat-parsing": OUTPUT,
    "--no-prefill-assistant": OUTPUT + " (a final assistant message is always continued)",
    "--no-jinja": OUTPUT + " (chat templates are always rendered with Jinja; llama.cpp's built-in"
    " non-Jinja formats are not available)",
    "--ignore-eos": "no server-wide default in Llamba: send `ignore_eos` in the request",
    "--chat-template-kwargs": "no server-wide default in Llamba: send `chat_template_kwargs` in the request",
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
    "-nocb": "Llamba always batches continuously; a request's output does not depend on its batch"
    " (batch invariance), so only scheduling would differ",
    "--api-key": "several keys: a comma-separated list (CSV quoting), or the flag repeated",
    "--api-key-file": "one key per line; lines starting with # are comments",
    "-to": "seconds a request body may take to arrive and each response write may block",
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
    refused = [REFUSED[f] for f in forms if f in REFUSED]
    if refused:
        return "refused", refused[0]
    note = next((NOTES[f] for f in forms if f in NOTES), "")
    if any(f in known for f in forms):
        return "implemented", note
    return "ignored", note or IGNORED_NOTE


def main(readme_path: str) -> None:
    known = set(build_parser()._option_string_actions) | set(ALWAYS_ON)
    out = [
        '"""llama-server\'s flags (its README\'s option tables) and what Llamba does with each.',
        "",
        "Generated by scripts/import_llama_server_flags.py; docs/compatibility.md is generated from it",
        "(scripts/compatibility_doc.py). Statuses: implemented, ignored (accepted with a warning:",
        'no effect), refused (exits 2 naming the flag and why)."""',
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
        "    status: str  # implemented | ignored | refused",
        '    note: str = ""',
        "",
        "",
        "F = LlamaServerFlag",
        "FLAGS: tuple[LlamaServerFlag, ...] = (",
    ]
    for forms, value, env in rows(Path(readme_path).read_text()):
        st, note = status(forms, known)
        out.append(f"    F({forms!r}, {value!r}, {env!r}, {st!r}, {note!r}),")
    out.append(")")
    target = ROOT / "server" / "llama_server_flags.py"
    target.write_text("\n".join(out) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1])
