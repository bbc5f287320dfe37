"""llama-server's flags that Llamba accepts without effect, and the switches for what it always does.

They are taken out of the command line before argparse sees it (`split_ignored`), so a launch script
written for llama-server starts Llamba with a warning per ignored flag rather than failing.
"""

from __future__ import annotations

from server.config.llama_server_flags import FLAGS, LlamaServerFlag

# llama-server's flags that Llamba accepts but that have no effect here
# (`server/config/llama_server_flags.py`,
# the README's table, says why for each), and those it refuses with a reason.
IGNORED_FLAGS: dict[str, LlamaServerFlag] = {
    form: flag for flag in FLAGS if flag.status == "ignored" for form in flag.forms
}
# Older llama-server names, no longer in its README, that launch scripts still carry.
IGNORED_FLAGS.update({"--no-mmap": LlamaServerFlag(("--no-mmap",), "", "", "ignored", "no effect in Llamba")})
_DRAFT_CTX = LlamaServerFlag(
    ("-cd", "--ctx-size-draft"), "N", "", "ignored", "the draft model's context is the target's"
)
IGNORED_FLAGS.update({form: _DRAFT_CTX for form in _DRAFT_CTX.forms})
# Switches for what Llamba always does: accepted without a word, since their meaning holds.
ALWAYS_ON: dict[str, str] = {
    "-cb": "always on: requests join and leave the batch at every step",
    "--cont-batching": "always on: requests join and leave the batch at every step",
    "--jinja": "always on: chat templates are rendered with Jinja",
}
NO_EFFECT = "accepted for llama-server compatibility, no effect here"


class Ignored(str):
    """A flag (or variable) accepted without effect: a str, its name, that also says why."""

    reason: str

    def __new__(cls, name: str, reason: str = NO_EFFECT) -> Ignored:
        ignored = super().__new__(cls, name)
        ignored.reason = reason
        return ignored


def split_ignored(argv: list[str]) -> tuple[list[str], list[Ignored]]:
    """Take out the llama-server flags that have no effect here, so they warn instead of failing, and
    the always-on switches."""
    kept: list[str] = []
    ignored: list[Ignored] = []
    i = 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in ALWAYS_ON and "=" not in argv[i]:
            i += 1
            continue
        if flag in IGNORED_FLAGS:
            row = IGNORED_FLAGS[flag]
            ignored.append(Ignored(flag, NO_EFFECT if row.note == "no effect in Llamba" else row.note))
            i += 1 + _value_count(row, argv[i], argv[i + 1 : i + 2])
            continue
        kept.append(argv[i])
        i += 1
    return kept, ignored


def _value_count(flag: LlamaServerFlag, arg: str, rest: list[str]) -> int:
    """How many of the next arguments are this ignored flag's value: none for a switch or `--f=v`, the
    next one for a value, and for an optional value (`[on|off]`) the next one unless it is a flag."""
    if not flag.value or "=" in arg or not rest:
        return 0
    if flag.value.startswith("[") and rest[0].startswith("-"):
        return 0
    return 1
