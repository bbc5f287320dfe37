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

from server.cli import build_parser  # noqa: E402

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
# Rows whose forms have different statuses: split into one row per form.
SPLIT = ("--prefill-assistant",)
IGNORED_NOTE = "no effect in Llamba"


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
        env = re.search(r"\(env: (LLAMA_ARG_\w+)\)", match.group(2))
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
            found += [((f,), value, env.group(1) if env else "") for f in forms_t]
        else:
            found.append((forms_t, value, env.group(1) if env else ""))
    return found


def status(forms: tuple[str, ...], known: set[str]) -> tuple[str, str]:
    refused = [REFUSED[f] for f in forms if f in REFUSED]
    if refused:
        return "refused", refused[0]
    if any(f in known for f in forms):
        return "implemented", ""
    return "ignored", IGNORED_NOTE


def main(readme_path: str) -> None:
    known = set(build_parser()._option_string_actions)
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
        "    env: str  # its LLAMA_ARG_* variable, when the README names one",
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
