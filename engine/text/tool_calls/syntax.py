r"""How a format's calls look, as data for the grammar builder (engine-neutral: no grammar engine here).

A format describes its call syntax as a small tree of nodes: literal text, a JSON value matching a JSON
schema, sequences, alternatives, repetitions, optional whitespace, text up to a closing tag, and (rarely)
a regular expression. The grammar builder turns the tree into GBNF, Lark or whatever its engine takes;
JSON schemas go to the engine's own schema compiler; named rules (`Rule`, `Ref`) allow recursion.
`ToolGrammar` adds what llama.cpp adds around the grammar: whether it is lazy (only enforced from a
trigger on) and its triggers.

For a lazy grammar, `root` matches the text from the trigger on, as llama.cpp feeds it: a `word`
trigger's word is the start of `root`; a `pattern` found anywhere starts `root` where its match starts
(llama.cpp wraps it as `[\s\S]*?(pattern)[\s\S]*`); a `pattern_full` must match the whole output so
far, and `root` starts at its first non-empty capture group (at 0 without one). Triggers are meant for
the answer text, after the reasoning split (llama.cpp folds "skip a <think> block" into its patterns;
here the sequence knows when it is in a reasoning block). `Json` nodes take no whitespace around them:
formats put `Space()` where the model may write some.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Lit:
    """Literal text."""

    text: str


@dataclass(frozen=True)
class Json:
    """One JSON value matching `schema` (spaced as the engine's JSON rules allow)."""

    schema: dict[str, Any]


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Rep:
    """`item` repeated from `min` to `max` times (None: unbounded)."""

    item: Node
    min: int = 0
    max: int | None = None


@dataclass(frozen=True)
class Space:
    """Optional whitespace (the JSON rules' `space`: a blank, or a newline or two and an indent)."""


@dataclass(frozen=True)
class Until:
    """Any text that does not contain `stop` (the text up to a closing tag, which follows)."""

    stop: str


@dataclass(frozen=True)
class Regex:
    """Text matching a regular expression (Python/ECMAScript syntax, anchored at both ends)."""

    pattern: str


@dataclass(frozen=True)
class Rule:
    """`body` as a named rule, written once however often it appears, which `Ref(name)` inside it (or
    elsewhere) refers to: a recursive syntax (Gemma 4's nested argument values)."""

    name: str
    body: Node


@dataclass(frozen=True)
class Ref:
    """The rule `name` (a `Rule` of that name must appear in the grammar)."""

    name: str


Node = Lit | Json | Seq | Alt | Rep | Space | Until | Regex | Rule | Ref


def seq(*items: Node) -> Node:
    """A sequence, with adjacent literals joined and single items unwrapped."""
    flat: list[Node] = []
    for item in items:
        parts = item.items if isinstance(item, Seq) else (item,)
        for part in parts:
            if isinstance(part, Lit) and flat and isinstance(flat[-1], Lit):
                flat[-1] = Lit(flat[-1].text + part.text)
            elif not (isinstance(part, Lit) and not part.text):
                flat.append(part)
    if not flat:
        return Lit("")
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*options: Node) -> Node:
    return options[0] if len(options) == 1 else Alt(tuple(options))


def opt(item: Node) -> Node:
    return Rep(item, 0, 1)


def calls(one_call: Node, parallel: bool, separator: Node | None = None) -> Node:
    """One call, or with parallel calls one or more (separated by `separator`)."""
    if not parallel:
        return one_call
    more = seq(separator, one_call) if separator is not None else one_call
    return seq(one_call, Rep(more, 0, None))


TriggerKind = Literal["word", "pattern", "pattern_full"]


@dataclass(frozen=True)
class Trigger:
    """Where a lazy grammar starts (llama.cpp's COMMON_GRAMMAR_TRIGGER_TYPE_*): a `word` anywhere in the
    output; a `pattern` (regex) found anywhere; a `pattern_full` that must match the whole output so far."""

    kind: TriggerKind
    value: str


@dataclass(frozen=True)
class ToolGrammar:
    root: Node
    lazy: bool  # enforced only after a trigger (tool_choice auto); else from the first token
    triggers: tuple[Trigger, ...] = ()


# No members beyond those named: llama.cpp's json-schema-to-grammar closes objects that do not say
# otherwise, while llguidance follows JSON Schema (open); a call object open to any key let Gemma 3,
# sampling at temperature 1, write `"value": 5` after the arguments and the reply stopped being a call.
CLOSED: dict[str, Any] = {"additionalProperties": False}


def call_object_schema(
    name: str, parameters: dict[str, Any], name_key: str = "name", arguments_key: str = "arguments"
) -> dict[str, Any]:
    """The JSON object of one call: `{"name": <const>, "arguments": <the tool's schema>}`."""
    return {
        "type": "object",
        "properties": {name_key: {"type": "string", "const": name}, arguments_key: parameters},
        "required": [name_key, arguments_key],
        "additionalProperties": False,
    }


def any_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
